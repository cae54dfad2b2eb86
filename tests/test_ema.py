"""The EMA preset (configs/presets/ema.yaml, lit_ddp/callbacks/ema.py): validation reports the averaged
weights, checkpoints carry both weight sets, validate/test/predict use the average, a resumed 2-process run
ends with the uninterrupted run's raw and averaged weights, and the average is the same on every rank."""

import os
import subprocess
import types
from pathlib import Path

import pytest
import torch
from conftest import REPO, TINY_RUN, TINY_SHAPES, run_cli
from lightning import Callback, LightningModule, Trainer

from lit_ddp.callbacks import EMA
from lit_ddp.callbacks.ema import DEFAULT_DECAY
from lit_ddp.cli import build_cli, main
from lit_ddp.models import LeNetCIFAR

PRESET = str(REPO / "configs" / "presets" / "ema.yaml")
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
EMA_KEYS = ("current_model_state", "averaging_state")


def only_ckpt(root: Path, name: str = "last.ckpt") -> Path:
    (path,) = root.rglob(name)
    return path


def assert_equal_states(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert torch.equal(got[key], value), key


def val_metrics(root: Path, *args: str) -> dict[str, float]:
    cli = build_cli(["validate", *TINY_SHAPES, *QUIET, f"--trainer.default_root_dir={root}", *args])
    return {k: float(v) for k, v in cli.trainer.callback_metrics.items() if k in ("val/loss", "val/acc")}


def test_fit_validates_and_saves_the_average_and_evaluation_uses_it(tmp_path: Path) -> None:
    fit = build_cli(
        ["fit", "--config", PRESET, *TINY_SHAPES, *QUIET, "--trainer.max_epochs=2"]
        + [f"--trainer.default_root_dir={tmp_path / 'fit'}"]
    )
    assert isinstance(fit.trainer.callbacks[0], EMA) and fit.trainer.callbacks[0].decay == 0.999
    logged = {k: float(fit.trainer.callback_metrics[k]) for k in ("val/loss", "val/acc")}
    path = only_ckpt(tmp_path / "fit")
    ckpt = torch.load(path, weights_only=True)
    average, raw = ckpt["state_dict"], ckpt["current_model_state"]
    assert average.keys() == raw.keys() == fit.model.state_dict().keys()
    assert any(not torch.equal(average[k], raw[k]) for k in average)
    assert int(ckpt["averaging_state"]["n_averaged"]) == ckpt["global_step"] == 16  # one update per step
    assert ckpt["callbacks"]["EMA"] == {"last_update_step": 16, "decay": 0.999}
    # After fit the module holds the average, as loading the checkpoint would give.
    for key, value in fit.model.state_dict().items():
        assert torch.equal(value, average[key]), key
    # From Python, the model's class loads the average (docs/configuration.md, EMA).
    loaded = LeNetCIFAR.load_from_checkpoint(path).state_dict()
    for key, value in average.items():
        assert torch.equal(loaded[key], value), key

    # validate --ckpt_path scores state_dict, the average: the numbers fit logged for its last epoch. With
    # the preset stacked too (users repeat their configs), the callback changes nothing outside fit.
    assert val_metrics(tmp_path / "eval", f"--ckpt_path={path}") == pytest.approx(logged, abs=1e-6)
    stacked = val_metrics(tmp_path / "eval", "--config", PRESET, f"--ckpt_path={path}")
    assert stacked == pytest.approx(logged, abs=1e-6)
    # The raw weights, scored the same way, give other numbers: fit did not validate them.
    plain = {k: v for k, v in ckpt.items() if k not in EMA_KEYS} | {"state_dict": raw}
    torch.save(plain, tmp_path / "raw.ckpt")
    raw_metrics = val_metrics(tmp_path / "eval", f"--ckpt_path={tmp_path / 'raw.ckpt'}")
    assert abs(raw_metrics["val/loss"] - logged["val/loss"]) > 1e-4


def test_a_resume_without_the_ema_is_refused_before_it_trains_on_from_the_average(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """fit --ckpt_path=last of an EMA run without the preset loaded the checkpoint's state_dict, the average,
    into the module and trained on from it, the raw weights and the average dropped, with Lightning's warning
    `Please add the following callbacks: ['EMA']` alone."""
    root = f"--trainer.default_root_dir={tmp_path}"
    build_cli(["fit", "--config", PRESET, *TINY_SHAPES, *QUIET, "--trainer.max_epochs=1", root])
    last = only_ckpt(tmp_path)
    saved = last.read_bytes()
    resume = ["fit", *TINY_SHAPES, *QUIET, "--trainer.max_epochs=2", "--ckpt_path=last", root]
    with pytest.raises(SystemExit) as stop:
        main(resume)
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("lit_ddp: error: ") and err[0].endswith(
        "last.ckpt holds averaged weights (EMA) beside the raw ones, and this fit has no EMA callback to"
        " resume them: it would train on from the average, not from where the run stopped; resume with the"
        " EMA it was trained with (--config configs/presets/ema.yaml, or your recipe's)"
    ), err[0]
    assert last.read_bytes() == saved  # nothing trained, nothing written over
    # The EMA named by hand resumes it as the preset does: the next checkpoint keeps both weight sets.
    fit = build_cli([*resume, "--trainer.callbacks+=lit_ddp.callbacks.EMA"])
    assert fit.trainer.global_step == 16
    assert all(key in torch.load(last, weights_only=True) for key in EMA_KEYS)


def test_a_resume_averages_on_with_the_checkpoints_decay_unless_it_gives_its_own(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run averaged with decay 0.9999 and resumed with the preset (0.999) went on at 0.999 without a word:
    the checkpoint kept no decay. It keeps it, and a resume takes it as --model.optim settings resume: the
    default takes the checkpoint's, a decay given holds; a note names the change."""
    root = f"--trainer.default_root_dir={tmp_path}"
    fit = ["fit", "--config", PRESET, *TINY_RUN, *QUIET, root]
    build_cli([*fit, "--trainer.callbacks.decay=0.9999"])
    last = only_ckpt(tmp_path)
    assert torch.load(last, weights_only=True)["callbacks"]["EMA"]["decay"] == 0.9999
    with caplog.at_level("INFO"):
        resumed = build_cli([*fit, "--trainer.max_epochs=2", "--ckpt_path=last"])
    assert resumed.trainer.global_step == 4  # it resumed
    assert resumed.trainer.callbacks[0].decay == 0.9999
    assert torch.load(last, weights_only=True)["callbacks"]["EMA"]["decay"] == 0.9999
    notes = [m for m in caplog.messages if "the EMA averages on" in m]
    assert notes == [
        "lit_ddp: note: the EMA averages on with the checkpoint's decay 0.9999 (this run's default: 0.999)"
    ]
    caplog.clear()
    with caplog.at_level("INFO"):
        given = build_cli(
            [*fit, "--trainer.max_epochs=3", "--ckpt_path=last", "--trainer.callbacks.decay=0.99"]
        )
    assert given.trainer.callbacks[0].decay == 0.99
    assert torch.load(last, weights_only=True)["callbacks"]["EMA"]["decay"] == 0.99
    notes = [m for m in caplog.messages if "the EMA averages on" in m]
    assert notes == [
        "lit_ddp: note: the EMA averages on with this run's decay 0.99 (the checkpoint's: 0.9999)"
    ]


@pytest.mark.parametrize(
    ("chosen", "saved", "averages_with"), [(0.999, 0.5, 0.5), (0.25, 0.5, 0.25), (0.25, None, 0.25)]
)
def test_the_average_goes_on_with_the_decay_the_resume_settles_on(
    chosen: float, saved: float | None, averages_with: float
) -> None:
    """The decay restored is the one the average's updates use; a checkpoint saved before the EMA kept its
    decay resumes with this run's, as before."""
    module = LeNetCIFAR()
    ema = EMA(decay=chosen)
    ema.setup(None, module, "fit")
    ema.load_state_dict({"last_update_step": 1} | ({} if saved is None else {"decay": saved}))
    assert ema.decay == averages_with
    ema.average.update_parameters(module)  # the first update copies the weights
    before = {k: v.clone() for k, v in ema.average.module.state_dict().items()}
    with torch.no_grad():
        for param in module.parameters():
            param.add_(1.0)
    ema.average.update_parameters(module)
    for name, param in ema.average.module.named_parameters():
        want = averages_with * before[name] + (1 - averages_with) * dict(module.named_parameters())[name]
        torch.testing.assert_close(param, want)


def test_a_second_fit_with_the_same_callback_starts_from_its_own_decay_and_step() -> None:
    """One EMA object given to two fits in one process (library use): the second averaged with the first's
    checkpoint decay, and skipped its first updates (the first fit's step count held them back)."""
    module, ema = LeNetCIFAR(), EMA()
    ema.setup(None, module, "fit")
    ema.load_state_dict({"last_update_step": 4, "decay": 0.5})  # the first fit resumed a checkpoint
    assert ema.decay == 0.5
    ema.on_train_end(None, module)
    ema.setup(None, module, "fit")  # the second fit, started fresh
    assert ema.decay == DEFAULT_DECAY
    trainer = types.SimpleNamespace(global_step=1, world_size=1)
    ema.on_train_batch_end(trainer, module, None, None, 0)
    assert int(ema.average.n_averaged) == 1  # its first step updated the average
    with torch.no_grad():
        for param in module.parameters():
            param.add_(1.0)
    before = {k: v.clone() for k, v in ema.average.module.named_parameters()}
    ema.on_train_batch_end(types.SimpleNamespace(global_step=2, world_size=1), module, None, None, 1)
    for name, param in ema.average.module.named_parameters():
        want = DEFAULT_DECAY * before[name] + (1 - DEFAULT_DECAY) * dict(module.named_parameters())[name]
        torch.testing.assert_close(param, want)


class SaveMidValidation(Callback):
    """Writes a checkpoint during the first validation after training began (as a stop signal there would)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_validation_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args) -> None:
        if not trainer.sanity_checking and not Path(self.path).exists():
            trainer.save_checkpoint(self.path)


def test_a_checkpoint_written_during_validation_keeps_the_weight_sets_apart(tmp_path: Path) -> None:
    """During validation the module holds the average: such a checkpoint must not store them swapped."""
    mid = tmp_path / "mid.ckpt"
    build_cli(
        ["fit", "--config", PRESET, *TINY_SHAPES, *QUIET, "--trainer.max_epochs=1"]
        + [f"--trainer.default_root_dir={tmp_path}", "--trainer.callbacks+=test_ema.SaveMidValidation"]
        + [f"--trainer.callbacks.path={mid}"]
    )
    # No training step between that validation and last.ckpt, written after it.
    got, want = (torch.load(p, weights_only=True) for p in (mid, only_ckpt(tmp_path)))
    for key in ("state_dict", "current_model_state"):
        assert_equal_states(got[key], want[key])


def test_print_config_with_the_preset_round_trips(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    def printed(*configs: str) -> str:
        with pytest.raises(SystemExit) as exit_info:
            build_cli(["fit", *(a for c in configs for a in ("--config", c)), "--print_config"])
        assert exit_info.value.code in (None, 0)
        return capsys.readouterr().out

    first = printed(str(REPO / "configs" / "lenet_cifar.yaml"), PRESET)
    assert "- class_path: lit_ddp.callbacks.EMA\n    init_args:\n      decay: 0.999\n" in first
    assert "lit_ddp.data.CIFAR10DataModule" in first  # the recipe under the preset is kept
    (tmp_path / "printed.yaml").write_text(first)
    assert printed(str(tmp_path / "printed.yaml")) == first


# ---- 2 processes: exact resume, one average on every rank -----------------------------------------------

# BatchNorm: each rank's running statistics come from its own batches, the case where averages could differ
# between ranks. 256 images, 32 per device on 2 ranks: 4 steps per epoch, 8 in all.
DDP = ["--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp", "--trainer.max_epochs=2"]
DDP_FIT = ["fit", "--config", PRESET, *TINY_SHAPES, *QUIET, *DDP, "--model.batch_norm=true"]
# On the ranks' path: tests/ for this module's ValidatedWeights, tests/helpers/ for fault_probe (both named
# by --trainer.callbacks)
ENV = {"PYTHONPATH": os.pathsep.join(map(str, (REPO, REPO / "tests", REPO / "tests" / "helpers")))}


class ValidatedWeights(Callback):
    """Saves the weights each rank validates with, at each validation start (after EMA's, which swaps the
    average in: it is listed first)."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            torch.save(pl_module.state_dict(), self.out_dir / f"rank{trainer.global_rank}.pt")


def ddp_fit(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True, exist_ok=True)
    # A timeout is for a hang: on a 2-core machine other jobs load, a 2-process run takes minutes.
    result = run_cli([*DDP_FIT, *args], cwd=cwd, env=ENV, timeout=480)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cwd = tmp_path_factory.mktemp("reference")
    probe = ["--trainer.callbacks+=test_ema.ValidatedWeights", f"--trainer.callbacks.out_dir={cwd / 'val'}"]
    ddp_fit(cwd, *probe)
    return cwd


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(600)
def test_every_rank_validates_the_same_average(reference: Path) -> None:
    ranks = [torch.load(reference / "val" / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    ckpt = torch.load(only_ckpt(reference), weights_only=True)
    assert any("running_mean" in k for k in ckpt["state_dict"])  # BatchNorm buffers are part of it
    assert_equal_states(ranks[1], ranks[0])  # bit for bit, buffers included
    assert_equal_states(ranks[0], ckpt["state_dict"])  # the last validation's weights are the saved average
    assert any(not torch.equal(ranks[0][k], ckpt["current_model_state"][k]) for k in ranks[0])


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(900)  # its two runs, and the reference's if this test makes it
def test_preempted_mid_epoch_and_resumed_ends_with_the_same_raw_and_averaged_weights(
    tmp_path: Path, reference: Path
) -> None:
    # SIGTERM on rank 0 during batch 5 (epoch 1), checked every 2nd batch: every rank stops after step 7 with
    # last.ckpt (tests/test_faults.py tests the mechanism); --ckpt_path=last runs steps 8 and on.
    stop = ["--resilience.check_every_n_batches=2", "--trainer.callbacks+=fault_probe.Fault"]
    stop += ["--trainer.callbacks.action=sigterm", "--trainer.callbacks.at_step=5"]
    stopped = ddp_fit(tmp_path, *stop)
    assert "stopped by SIGTERM at epoch 2, step 7" in stopped.stdout + stopped.stderr
    ckpt = torch.load(only_ckpt(tmp_path), weights_only=True)
    assert int(ckpt["averaging_state"]["n_averaged"]) == ckpt["callbacks"]["EMA"]["last_update_step"] == 7

    ddp_fit(tmp_path, "--ckpt_path=last")
    final, expected = (torch.load(only_ckpt(d), weights_only=True) for d in (tmp_path, reference))
    assert final["global_step"] == expected["global_step"] == 8
    for key in ("state_dict", "current_model_state", "averaging_state"):
        assert_equal_states(final[key], expected[key])
    assert (
        final["callbacks"]["EMA"] == expected["callbacks"]["EMA"] == {"last_update_step": 8, "decay": 0.999}
    )


def test_the_average_is_made_on_the_device_the_module_will_train_on() -> None:
    """In ``setup`` the module's parameters are still where it was built (the CPU); Lightning moves them to
    the trainer's device after the callbacks' setup, and ``pl_module.device`` already names that device. An
    average left on the CPU costs a GPU run a device-to-host copy of every weight each step, and under NCCL
    (2+ GPUs) its BatchNorm statistics' all-reduce would get CPU tensors, which NCCL refuses."""

    class OnMeta(LeNetCIFAR):
        @property
        def device(self) -> torch.device:  # what Lightning's setup reports for a GPU run: its root device
            return torch.device("meta")

    module = OnMeta(batch_norm=True)
    ema = EMA()
    ema.setup(None, module, "fit")
    tensors = [*ema.average.module.parameters(), *ema.average.module.buffers(), ema.average.n_averaged]
    assert {t.device.type for t in tensors} == {"meta"}
    assert {p.device.type for p in module.parameters()} == {"cpu"}  # the module itself is left alone
