"""The CUDA paths, on one GPU: ``python -m pytest -m cuda`` (benchmarks/gpu_suite.sh runs them with the GPU
benchmarks). Skipped where torch sees no GPU, so CI, which is CPU-only, collects and skips them.

Most tests run the real command line in a subprocess, as a user would on a GPU node: mixed precision,
channels-last and compile; DDP on NCCL with one rank; torch's SyncBatchNorm and its conversion back;
preemption, the atomic checkpoint and resume; the NaN guard's late read; EMA's buffer all-reduce and the
predictions gather on NCCL; and no host sync in a training step outside the logging steps. These run in
process: the per-sample draws reach the GPU in one copy from pinned memory (its copy recorder is checked on
CPU by test_augment.py); the replayed LeNet step (``--model.cuda_graph``); clipping under mixed precision
and its resume without clipping (fused). ResNet from JPEG files and FSDP are in test_cuda_resnet.py (the
ResNet family's).
"""

import csv
import json
from pathlib import Path

import pytest
import torch
from conftest import REPO, TINY_SHAPES, WITH_PROBES, last_ckpt, read_scalars, run_cli
from copies import HostToDeviceCopies
from lenet_fits import GradsBeforeUpdate, StopAfterFirstEpoch, assert_close, fit, full_fp32, lenet, trainer
from lightning import Callback

from lit_ddp.data.batch_transforms import SampleRandom

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

GPU = ["--trainer.accelerator=gpu", "--trainer.devices=1", "--trainer.enable_progress_bar=false"]
NCCL = ["--trainer.strategy=ddp"]  # one rank: Lightning still builds the NCCL process group and DDP


def fit_ok(tmp_path: Path, *args: str, command: str = "fit", timeout: float = 600) -> str:
    # The GPU and the run folder last: a --config among args (a recipe) would otherwise replace them.
    result = run_cli(cli_args(tmp_path, command, *args), tmp_path, timeout, WITH_PROBES)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    return out


def cli_args(root: Path, command: str, *args: str, device: list[str] = GPU) -> list[str]:
    """The command line fit_ok runs; test_run_paths.py runs it on the CPU (``device``) and checks the paths
    these tests read, so that a path gone stale fails in CI, not first on a GPU node."""
    return [command, *args, *device, f"--trainer.default_root_dir={root}"]


def loads_on_cpu(path: Path) -> dict:
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    tensors = [v for v in checkpoint["state_dict"].values() if v.is_floating_point()]
    assert tensors and all(v.device.type == "cpu" and torch.isfinite(v).all() for v in tensors)
    return checkpoint


# ---- mixed precision, channels-last, compile ----------------------------------------------------------


@pytest.mark.parametrize("compile", ["false", "true", "reduce-overhead"])  # the last: CUDA graphs
def test_lenet_fits_in_bf16_channels_last(tmp_path: Path, compile: str) -> None:
    args = [*TINY_SHAPES, "--trainer.max_epochs=2", "--trainer.precision=bf16-mixed"]
    fit_ok(tmp_path, *args, "--model.channels_last=true", f"--model.compile={compile}")
    assert 0.0 <= read_scalars(last_ckpt(tmp_path, args).parent.parent)["val/acc"][-1] <= 1.0
    loads_on_cpu(last_ckpt(tmp_path, args))


# ---- DDP on NCCL, SyncBatchNorm ------------------------------------------------------------------------


def test_ddp_on_nccl_with_torchs_syncbatchnorm_converted_back_after_fit(tmp_path: Path) -> None:
    probe = {"class_path": "ddp_semantics_probe.Probe", "init_args": {"out_dir": str(tmp_path / "probe")}}
    args = [*TINY_SHAPES, "--trainer.max_epochs=1", *NCCL, "--model.batch_norm=true"]
    out = fit_ok(tmp_path, *args, "--trainer.sync_batchnorm=true", f"--trainer.callbacks={json.dumps(probe)}")
    assert "distributed_backend=nccl" in out
    record = torch.load(tmp_path / "probe" / "fit_rank0.pt", weights_only=False)
    assert record["bn_classes"] == ["SyncBatchNorm"]  # torch's, on CUDA (runtime/sync_batchnorm.py)
    from lit_ddp.models import LeNetCIFAR

    model = LeNetCIFAR(batch_norm=True)  # plain BatchNorm again: the checkpoint loads anywhere
    model.load_state_dict(loads_on_cpu(last_ckpt(tmp_path, args))["state_dict"])


# ---- preemption, atomic checkpoints, resume ----------------------------------------------------------


def test_sigterm_mid_epoch_checkpoints_atomically_and_resumes_to_the_end(tmp_path: Path) -> None:
    fault = ["--trainer.callbacks+=fault_probe.Fault", "--trainer.callbacks.action=sigterm"]
    fault += ["--trainer.callbacks.at_step=5", "--resilience.check_every_n_batches=1"]
    args = [*TINY_SHAPES, "--trainer.max_epochs=2", "--trainer.precision=bf16-mixed"]
    out = fit_ok(tmp_path, *args, *fault)
    # One process reads its own flag after every batch: it stops after the batch that saw the signal.
    assert "stopped by SIGTERM at epoch 1, step 6 (mid-epoch, after 6 of 8 batches)" in out
    assert loads_on_cpu(last_ckpt(tmp_path, args))["global_step"] == 6
    fit_ok(tmp_path, *args, "--ckpt_path=last")
    assert loads_on_cpu(last_ckpt(tmp_path, args))["global_step"] == 16
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and ".tmp" in p.name]  # no torn writes left


# ---- the NaN guard reads its verdict one step late -----------------------------------------------------


def test_nan_guard_stops_one_step_late_and_no_checkpoint_holds_the_bad_update(tmp_path: Path) -> None:
    fault = ["--trainer.callbacks+=fault_probe.Fault", "--trainer.callbacks.action=nan"]
    args = [*TINY_SHAPES, "--trainer.max_epochs=2", *fault, "--trainer.callbacks.at_step=10"]
    result = run_cli(cli_args(tmp_path, "fit", *args), tmp_path, 600, WITH_PROBES)
    assert result.returncode == 2, (result.stdout + result.stderr)[-4000:]
    assert "non-finite loss or gradients at step 10 (epoch 2, batch 3)" in result.stderr
    assert "one step later, and no checkpoint holds that update" in result.stderr
    assert loads_on_cpu(last_ckpt(tmp_path, args))["global_step"] == 8  # epoch 0's, finite


# ---- EMA and predictions on NCCL -------------------------------------------------------------------


def test_ema_all_reduces_its_buffers_on_nccl_and_predictions_gather(tmp_path: Path) -> None:
    args = [*TINY_SHAPES, "--trainer.max_epochs=1", *NCCL, "--model.batch_norm=true"]
    args += [f"--config={REPO / 'configs' / 'presets' / 'ema.yaml'}"]
    fit_ok(tmp_path, *args)
    checkpoint = loads_on_cpu(last_ckpt(tmp_path, args))
    assert "current_model_state" in checkpoint  # the raw weights beside the average
    out = tmp_path / "predict"  # run_cli makes the working folder
    fit_ok(out, *TINY_SHAPES, *NCCL, f"--ckpt_path={last_ckpt(tmp_path, args)}", command="predict")
    (written,) = out.rglob("predictions.csv")
    with open(written) as f:
        rows = list(csv.DictReader(f))
    assert [int(r["index"]) for r in rows] == list(range(64))  # the test split, once each, in order


# ---- no host sync in a training step outside the logging steps ----------------------------------------


def test_training_steps_between_logging_steps_never_wait_for_the_gpu(tmp_path: Path) -> None:
    """torch's sync debug mode warns at every op that waits for the device; sync_probe.py counts them per
    training step. Steps that write logs (every log_every_n_steps) may read values; the others must not."""
    probe = {"class_path": "sync_probe.SyncCounter", "init_args": {"out": str(tmp_path / "syncs.json")}}
    args = [*TINY_SHAPES, "--data.train_size=1024", "--trainer.max_epochs=2"]
    args += ["--trainer.precision=bf16-mixed"]
    args += ["--trainer.log_every_n_steps=8", f"--trainer.callbacks={json.dumps(probe)}"]
    fit_ok(tmp_path, *args, "--trainer.enable_progress_bar=true")
    counts = json.loads((tmp_path / "syncs.json").read_text())  # [global_step, syncs, first op] per step
    # Not the logging steps (Lightning writes after the step that makes global_step a multiple of 8), nor an
    # epoch's first (its loader starts) or last (validation and the epoch's metrics follow).
    quiet = [c for c in counts if c[0] % 8 != 7 and c[0] % 32 not in (0, 31)]
    assert quiet and all(syncs == 0 for _, syncs, _ in quiet), [c for c in quiet if c[1]][:5]


def test_the_per_sample_draws_reach_the_gpu_in_one_copy_from_pinned_memory() -> None:
    """A copy from pageable memory may wait for every kernel queued before it; the draws travel with each
    training batch, so such a wait would hold every step's launches back to the device's pace."""
    rand = SampleRandom(torch.arange(1000, 1256), key=11)
    with HostToDeviceCopies() as mode:
        moved = rand.to("cuda")
    assert mode.copies == [(True, True)]
    for draw in range(SampleRandom.BLOCK + 2):
        assert torch.equal(moved.bits(draw).cpu(), rand.bits(draw))


# ---- the training step replayed as CUDA graphs (--model.cuda_graph) ------------------------------------


class Captured(Callback):
    """Whether each training batch went through the captured graphs."""

    def __init__(self) -> None:
        self.replayed: list[bool] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        graph = pl_module._step_graph
        self.replayed.append(graph is not None and graph.graph is not None and graph.fits(batch))


def test_the_replayed_lenet_step_trains_as_the_usual_one_and_resumes_exactly(tmp_path: Path) -> None:
    """The recipe's `cuda_graph: auto` on one GPU captures the step (test_step_graph.py checks the same code
    eagerly on a CPU): its full batches replay the graphs, the partial one runs eagerly into the gradients
    the update graph reads, the hooks see each step's gradients, and the weights are the usual step's; a
    run stopped after its first epoch resumes to the same weights (within the same rounding)."""
    with full_fp32():
        expected = fit(lenet(False), trainer(tmp_path / "usual", accelerator="gpu"))
        model, hook, captured = lenet("auto"), GradsBeforeUpdate(), Captured()
        got = fit(model, trainer(tmp_path / "replayed", accelerator="gpu", callbacks=[hook, captured]))
    assert not model.automatic_optimization and model.trainer.global_step == 8
    assert captured.replayed == [True, True, True, False] * 2  # 3 full batches and the partial one
    assert hook.seen == [(step, True) for step in range(8)]
    # Not bitwise: the graphs and the eager step pick their own cuDNN kernels, and the usual step's AdamW is
    # fused. In full float32 the weights after 8 steps differ by up to 7e-6 (H200); one step's update is ~lr
    # (3e-3, a quarter of it in the warm-up's first step), what a missed or doubled step would leave.
    atol = 1e-4
    assert_close(got, expected, atol=atol)
    assert model._step_graph is None  # released at the end of training

    with full_fp32():
        fit(lenet("auto"), trainer(tmp_path / "first", accelerator="gpu", callbacks=[StopAfterFirstEpoch()]))
        first = tmp_path / "first" / "last.ckpt"
        resumed = fit(lenet("auto"), trainer(tmp_path / "resumed", accelerator="gpu"), ckpt_path=first)
        # And without graphs (another device count would do this): the usual fused step takes the replayed
        # run's state, its step counters where the fused update reads them.
        eager = fit(lenet(False), trainer(tmp_path / "eager", accelerator="gpu"), ckpt_path=first)
    assert_close(resumed, got, atol=atol)
    assert_close(eager, got, atol=atol)


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_clipping_under_mixed_precision_trains_and_its_resume_without_clipping_steps_fused(
    tmp_path: Path, precision: str
) -> None:
    """Lightning's mixed precision refuses to clip for a fused optimizer (test_optim_choice.py checks the
    choice and the restore on a CPU): with clipping the automatic choice is unfused. Resumed without clipping,
    the run is built fused (under 16-mixed its loss scaler then hands the fused step its scale), and the
    checkpoint's unfused flags must not come back with the optimizer's state."""
    clipped = lenet(False)
    stop = StopAfterFirstEpoch()
    fit(
        clipped,
        trainer(tmp_path / "clipped", "gpu", precision=precision, gradient_clip_val=1.0, callbacks=[stop]),
    )
    assert all(group["fused"] is None for group in clipped.trainer.optimizers[0].param_groups)
    resumed = lenet(False)
    weights = fit(
        resumed, trainer(tmp_path / "resumed", "gpu", precision=precision), tmp_path / "clipped" / "last.ckpt"
    )
    assert resumed.trainer.global_step == 8
    assert all(group["fused"] for group in resumed.trainer.optimizers[0].param_groups)
    assert all(torch.isfinite(w).all() for w in weights.values())


# ---- the user's main road: the LeNet recipe through the real command line ------------------------------


def lenet_recipe_args(data_root: Path, per_batch: int = 512, stuck_s: float = 240) -> list[str]:
    """`fit --config configs/lenet_cifar.yaml` as the README runs it (every default callback, the logger,
    ``cuda_graph: auto``), on a small CIFAR-10 in its real on-disk format; test_run_paths.py runs the same
    command line on the CPU."""
    from test_cifar10 import write_cifar10

    write_cifar10(data_root, per_batch=per_batch, test_size=256)
    return [
        "--config",
        str(REPO / "configs" / "lenet_cifar.yaml"),
        f"--data.data_dir={data_root}",
        f"--data.val_size={per_batch}",
        "--trainer.max_epochs=2",
        "--trainer.callbacks+=stack_dump.DumpIfStuck",
        f"--trainer.callbacks.seconds={stuck_s}",
    ]


def test_the_lenet_recipe_trains_through_the_cli_with_every_callback_and_its_step_replayed(
    tmp_path: Path,
) -> None:
    """The recipe through `python -m lit_ddp fit` with its callbacks and logger gave no epoch in 170 s on an
    H200, while the same model without them ran an epoch in 0.7 s: no CUDA test ran that path. A hang now
    prints every thread's stack (stack_dump.py) instead of a bare timeout."""
    out = fit_ok(tmp_path, *lenet_recipe_args(tmp_path / "data"), timeout=300)
    assert_the_recipe_trained(tmp_path, out)


def assert_the_recipe_trained(tmp_path: Path, out: str) -> None:
    epochs = [line for line in out.splitlines() if line.startswith("epoch ")]
    assert [line.split(" |")[0] for line in epochs] == ["epoch 1/2", "epoch 2/2"], out[-3000:]
    run = next(p for p in tmp_path.rglob("version_*") if p.is_dir())
    scalars = read_scalars(run)
    assert len(scalars["val/acc"]) == 2 and scalars["train/loss_epoch"][1] < scalars["train/loss_epoch"][0]
    assert (run / "checkpoints" / "last.ckpt").is_file()
