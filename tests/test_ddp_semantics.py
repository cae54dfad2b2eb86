"""DDP semantics, proven on CPU with real 2-process gloo runs of the lit_ddp CLI (issue 3, items a–g).

Most runs share two launches (ddp_semantics_worker.py: one process per rank runs several CLI commands, as
Lightning's ddp launcher or torchrun would start them), so the whole file costs a few process start-ups;
the last test runs the literal ``python -m lit_ddp fit/validate --trainer.strategy=ddp_spawn`` commands.
Every rank records what it did through ddp_semantics_probe.Probe.

    python -m pytest tests/test_ddp_semantics.py tests/test_sync_batchnorm.py -q
"""

import json
import os
from pathlib import Path

import pytest
import torch
from conftest import CPU, DDP2, ONE, TINY_RUN, run_cli
from ddp_semantics_probe import load
from torch.utils.data import SequentialSampler

from lit_ddp.cli import build_cli, main
from lit_ddp.data import ShapesDataModule
from lit_ddp.data.samplers import UnpaddedDistributedSampler
from lit_ddp.errors import UserError
from lit_ddp.runtime.eval_limits import batches_of_fraction, images_scored
from lit_ddp.testing.checks import augmented_by_sample, relative_error
from lit_ddp.testing.launch import launch as launch_ranks

HERE = Path(__file__).resolve().parent

# (a, b): 256 images, augmented (crop + flip); 2 × 32 vs 1 × 64 per step → 4 optimizer steps either way.
# Plain SGD, and the recipes' AdamW (lenet_shapes.yaml's lr and weight decay).
DATA_EQUIV = ["--data.train_size=256", "--data.val_size=64", "--trainer.max_epochs=1"]
EQUIV = [*DATA_EQUIV, "--model.optim.name=sgd", "--model.optim.lr=0.05"]
ADAMW = [
    *DATA_EQUIV,
    "--model.optim.name=adamw",
    "--model.optim.lr=0.003",
    "--model.optim.weight_decay=0.0005",
]
BN, SYNC = ["--model.batch_norm=true"], ["--trainer.sync_batchnorm=true"]
STEPS = 4

# (c–g): BN + SyncBN, augmentation on, 2 epochs. Odd evaluation sizes that are not multiples of the batch:
# 129 val images → 65 + 64 per rank → 3 and 2 batches of 32; 193 test images → 97 + 96 → 4 and 3 batches.
# lr=0.02 moves the model off uniform predictions in 32 steps, so per-sample losses differ and count.
DATA = ["--data.train_size=512", "--data.val_size=129", "--data.test_size=193", "--data.batch_size=32"]
LONG = [*DATA, *BN, *SYNC, "--trainer.max_epochs=2", "--trainer.log_every_n_steps=1", "--model.optim.lr=0.02"]


def probe(out_dir: Path, **init_args) -> str:
    spec = {"class_path": "ddp_semantics_probe.Probe", "init_args": {"out_dir": str(out_dir), **init_args}}
    return f"--trainer.callbacks={json.dumps(spec)}"


def ckpt(root: Path, run: str) -> Path:
    return root / run / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"


def job(root: Path, run: str, args: list[str], command: str = "fit", **probe_args) -> list[str]:
    out = root / run
    return [command, *CPU, *args, f"--trainer.default_root_dir={out}", probe(out / "probe", **probe_args)]


def launch(world_size: int, jobs: list[list[str]], root: Path, timeout: float) -> None:
    """One ddp_semantics_worker.py process per rank, env as Lightning's launcher sets it for its children."""
    jobs_file = root / f"jobs_{world_size}.json"
    jobs_file.write_text(json.dumps(jobs))
    command = [str(HERE / "helpers" / "ddp_semantics_worker.py"), str(jobs_file)]
    launch_ranks(world_size, command, root, timeout, log_name=f"worker_{world_size}_rank")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All 2-process runs in one launch, then the 1-process references in another; returns their root."""
    root = tmp_path_factory.mktemp("ddp")
    per_device_32, per_device_64 = ["--data.batch_size=32"], ["--data.batch_size=64"]
    two = [
        job(root, "plain2", [*EQUIV, *per_device_32, *DDP2]),
        job(root, "adamw2", [*ADAMW, *per_device_32, *DDP2]),
        job(root, "bn_sync2", [*EQUIV, *per_device_32, *BN, *SYNC, *DDP2]),
        job(root, "bn_nosync2", [*EQUIV, *per_device_32, *BN, *DDP2]),
        job(root, "fit2", [*LONG, *DDP2]),
        job(root, "stopped2", [*LONG, *DDP2], stop_after_epochs=1),
        job(root, "resumed2", [*LONG, *DDP2, f"--ckpt_path={ckpt(root, 'stopped2')}"]),
        job(root, "validate2", [*DATA, *BN, *DDP2, f"--ckpt_path={ckpt(root, 'fit2')}"], "validate"),
        job(root, "test2", [*DATA, *BN, *DDP2, f"--ckpt_path={ckpt(root, 'fit2')}"], "test"),
    ]
    launch(2, two, root, timeout=420)
    one = [
        job(
            root,
            "validate1",
            [*DATA, *BN, "--trainer.devices=1", f"--ckpt_path={ckpt(root, 'fit2')}"],
            "validate",
        ),
        job(root, "test1", [*DATA, *BN, "--trainer.devices=1", f"--ckpt_path={ckpt(root, 'fit2')}"], "test"),
        job(root, "plain1", [*EQUIV, *per_device_64, *ONE]),
        job(root, "adamw1", [*ADAMW, *per_device_64, *ONE]),
        # The control: one process, the same global batch as two micro-batches of 32 (DDP's arithmetic:
        # the mean of two half-batch means, summed in another order than one batch of 64).
        job(
            root, "adamw_accumulated1", [*ADAMW, *per_device_32, *ONE, "--trainer.accumulate_grad_batches=2"]
        ),
        job(root, "bn1", [*EQUIV, *per_device_64, *BN, *ONE]),
    ]
    launch(1, one, root, timeout=240)
    return root


def records(root: Path, run: str, stage: str = "fit") -> list[dict]:
    world_size = 1 if run.endswith("1") else 2
    return load(root / run / "probe", stage, world_size)


def final(record: dict) -> dict[str, torch.Tensor]:
    """Weights and buffers right after the last optimizer step."""
    return record["epoch_state"][-1]


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], keys=None) -> float:
    keys = keys or [k for k in a if a[k].is_floating_point()]
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in keys)


def assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)


def running_stat_keys(state: dict[str, torch.Tensor]) -> list[str]:
    return [k for k in state if k.endswith(("running_mean", "running_var"))]


# ---- a, b: two processes × b ≡ one process × 2b ---------------------------------------------------


# README ("What 'the same model' means") states these tolerances; docs/benchmarks.md has the measurements.
GRAD_RTOL = 1e-5  # first step's gradients, ‖Δg‖/‖g‖ (the trust kit allows 1e-4, for deeper networks)
WEIGHT_ATOL = {"plain2": 1e-6, "bn_sync2": 1e-5, "adamw2": 1e-4}  # weights after 4 steps, largest |Δ|


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.timeout(700)
@pytest.mark.parametrize("two, one", [("plain2", "plain1"), ("bn_sync2", "bn1"), ("adamw2", "adamw1")])
def test_a_two_processes_train_the_same_model_as_one_with_twice_the_batch(
    runs: Path, two: str, one: str
) -> None:
    r2, (r1,) = records(runs, two), records(runs, one)
    assert [r["world_size"] for r in r2] == [2, 2] and r1["world_size"] == 1
    assert [r["samples"][0][0] for r in (*r2, r1)] == ["ResumableShuffleSampler"] * 3
    assert r1["strategy"] == "SingleDeviceStrategy"  # a plain process, not a 1-rank DDP
    assert [len(r["samples"][0][1]) for r in r2] == [128, 128] and len(r1["samples"][0][1]) == 256
    assert [r["global_step"] for r in (*r2, r1)] == [STEPS] * 3
    # 1. The same augmented global batch, byte for byte: each sample cropped and flipped alike.
    seen2, seen1 = augmented_by_sample(r2), augmented_by_sample([r1])
    assert len(seen1) == 64 and seen2.keys() == seen1.keys()
    assert all(torch.equal(seen2[i], seen1[i]) for i in seen1)
    plain = {i: x for i, x in zip(r1["aug_index"][0], r1["plain"][0], strict=True)}
    assert sum(not torch.equal(seen1[i], plain[i]) for i in seen1) > 32  # augmentation was on
    # 2. The first step's gradients (after DDP's all-reduce) agree to rounding: ‖Δg‖/‖g‖ < GRAD_RTOL.
    assert_identical(r2[0]["grads"], r2[1]["grads"])
    grad_error = relative_error(r2[0]["grads"], r1["grads"])
    # 3. The weights after each of the first steps: identical on both ranks, near one process (WEIGHT_ATOL).
    deviations = [max_diff(a, b) for a, b in zip(r2[0]["step_state"], r1["step_state"], strict=True)]
    for a, b in zip(r2[0]["step_state"], r2[1]["step_state"], strict=True):
        assert_identical(a, b)
    moved = max_diff(final(r2[0]), r1["init"])
    print(f"{two}: grads rel {grad_error:.1e}, moved {moved:.2e}, weights vs 1 process by step {deviations}")
    assert grad_error < GRAD_RTOL
    assert len(deviations) == STEPS and moved > 1e-3 and max(deviations) < WEIGHT_ATOL[two]
    if two == "bn_sync2":
        assert r2[0]["bn_classes"] == ["AllReduceSyncBatchNorm"]


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.timeout(700)
def test_a_what_remains_is_rounding_the_size_one_process_gets_from_splitting_its_batch(runs: Path) -> None:
    """2 × 32 differs from 1 × 64 as much as 1 × 32 with 2 accumulated micro-batches does: the same images,
    the same arithmetic up to the order in which per-sample gradients are summed."""
    (one,), (accumulated,) = records(runs, "adamw1"), records(runs, "adamw_accumulated1")
    two = records(runs, "adamw2")[0]
    assert augmented_by_sample([accumulated]).keys() <= augmented_by_sample([one]).keys()
    ddp = [max_diff(a, b) for a, b in zip(two["step_state"], one["step_state"], strict=True)]
    split = [max_diff(a, b) for a, b in zip(accumulated["step_state"], one["step_state"], strict=True)]
    grads = relative_error(two["grads"], one["grads"]), relative_error(accumulated["grads"], one["grads"])
    print(f"vs 1 × 64 by step: 2 × 32 {ddp}, 1 × 32 accumulated {split}; first grads rel {grads}")
    assert grads[0] < GRAD_RTOL and grads[1] < GRAD_RTOL
    assert max(ddp) < WEIGHT_ATOL["adamw2"] and max(split) < WEIGHT_ATOL["adamw2"]


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.timeout(700)
def test_b_running_stats_match_the_large_batch_with_syncbn_only(runs: Path) -> None:
    (ref,) = records(runs, "bn1")
    synced, unsynced = records(runs, "bn_sync2"), records(runs, "bn_nosync2")
    assert unsynced[0]["bn_classes"] == ["BatchNorm1d", "BatchNorm2d"]
    keys = running_stat_keys(final(ref))
    assert len(keys) == 8
    sync_err = max_diff(final(synced[0]), final(ref), keys)
    local_err = max_diff(final(unsynced[0]), final(ref), keys)
    print(f"running stats vs 1 process: SyncBN {sync_err:.2e}, per-rank BN {local_err:.2e}")
    assert sync_err < 1e-5
    assert local_err > 1e-3 and local_err > 1000 * sync_err  # per-rank statistics are told apart
    # Without SyncBN each rank's last update used only its own batch, so the ranks disagree.
    assert max_diff(final(unsynced[0]), final(unsynced[1]), keys) > 1e-3
    assert_identical(final(synced[0]), final(synced[1]))


# ---- c: exact distributed evaluation -----------------------------------------------------------------


def assert_same_metrics(got: dict[str, float], expected: dict[str, float]) -> None:
    assert got.keys() == expected.keys() and any(k.endswith("/acc") for k in got)
    for key, value in expected.items():
        if key.endswith("/loss"):
            assert got[key] == pytest.approx(value, abs=1e-5), key
        else:
            assert got[key] == value, key  # accuracies: exactly


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.timeout(700)
def test_c_two_process_evaluation_equals_one_process(runs: Path) -> None:
    (val1,), (test1,) = records(runs, "validate1", "validate"), records(runs, "test1", "test")
    reference_val, reference_test = val1["val"][-1], test1["test"][-1]
    print(f"1-process reference: {reference_val} {reference_test}")
    # validate, test, and the validation inside fit (last.ckpt holds the weights it validated).
    for rank_record in records(runs, "validate2", "validate"):
        assert_same_metrics(rank_record["val"][-1], reference_val)
    for rank_record in records(runs, "test2", "test"):
        assert_same_metrics(rank_record["test"][-1], reference_test)
    for rank_record in records(runs, "fit2"):
        assert_same_metrics(rank_record["val"][-1], reference_val)


@pytest.mark.parametrize("size, world_size", [(129, 2), (1001, 2), (10, 3), (8, 8)])
def test_c_unpadded_sampler_shards_cover_every_sample_once(size: int, world_size: int) -> None:
    shards = [list(UnpaddedDistributedSampler(range(size), world_size, rank)) for rank in range(world_size)]
    assert sorted(i for shard in shards for i in shard) == list(range(size))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1 and min(map(len, shards)) >= 1


def test_c_eval_loader_without_trainer_or_ddp_is_sequential_and_tiny_sets_fail_early() -> None:
    dm = ShapesDataModule(train_size=64, val_size=33, test_size=10, batch_size=8)
    dm.setup("validate")
    loader = dm.val_dataloader()  # no trainer attached: one process, every sample in order
    assert isinstance(loader.sampler, SequentialSampler) and sum(len(y) for _, y in loader) == 33
    with pytest.raises(UserError, match="cannot be split over 4 processes"):
        UnpaddedDistributedSampler(range(3), num_replicas=4, rank=0)
    with pytest.raises(UserError) as err:
        UnpaddedDistributedSampler(range(1), num_replicas=2, rank=0)
    assert str(err.value) == (
        "an evaluation set of 1 sample cannot be split over 2 processes: use at least 2 samples or fewer"
        " devices"
    )


# ---- d: training shards ----------------------------------------------------------------------------


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.timeout(700)
def test_d_training_shards_are_disjoint_cover_the_set_and_reshuffle(runs: Path) -> None:
    ranks = records(runs, "fit2")
    assert ranks[0]["split"] == ranks[1]["split"]  # same train/val data on every rank
    orders = []
    for epoch in range(2):
        shards = [r["samples"][epoch][1] for r in ranks]
        assert set(shards[0]).isdisjoint(shards[1])
        assert sorted(shards[0] + shards[1]) == list(range(512))
        orders.append(shards)
    assert orders[0][0] != orders[1][0] and set(orders[0][0]) != set(orders[1][0])  # reshuffled, new shards


# ---- e: rank zero writes ---------------------------------------------------------------------------


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.timeout(700)
def test_e_rank_zero_is_the_single_writer(runs: Path) -> None:
    root = runs / "fit2"
    event_files = list(root.rglob("events.out.tfevents.*"))
    assert len(event_files) == 1  # one TensorBoard run, written by one process
    run_dir = event_files[0].parent
    assert list(root.rglob("config.yaml")) == [run_dir / "config.yaml"]
    assert list(root.rglob("hparams.yaml")) == [run_dir / "hparams.yaml"]
    rank0, rank1 = records(runs, "fit2")
    assert rank1["writes"] == []
    # Each save (best-so-far and last, once per epoch) happens once, on rank 0, and is what is on disk.
    on_disk = {str(p) for p in (run_dir / "checkpoints").glob("*.ckpt")}
    assert on_disk <= set(rank0["writes"]) and str(run_dir / "checkpoints" / "last.ckpt") in on_disk
    assert rank0["writes"].count(str(run_dir / "checkpoints" / "last.ckpt")) == 2


# ---- f: reproducibility ----------------------------------------------------------------------------


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.timeout(700)
def test_f_runs_are_reproducible_and_training_is_augmented(runs: Path) -> None:
    first, second = (
        records(runs, "fit2"),
        records(runs, "stopped2"),
    )  # same seed; second stopped after epoch 1
    assert_identical(first[0]["init"], first[1]["init"])  # before DDP's broadcast: seeded identically
    for a, b in zip(first, second, strict=True):
        assert a["val"][0] == b["val"][0]
        assert_identical(a["epoch_state"][0], b["epoch_state"][0])
        torch.testing.assert_close(a["aug"][0], b["aug"][0], rtol=0, atol=0)  # training saw the same batch
    for rank in first:
        for epoch in range(2):
            # Training saw augmented images, not the plain ones (crop + flip moved most of them).
            seen, plain = rank["aug"][epoch], rank["plain"][epoch]
            assert seen.shape == plain.shape
            changed = [not torch.equal(s, p) for s, p in zip(seen, plain, strict=True)]
            assert sum(changed) >= len(changed) // 2


# ---- g: resume -------------------------------------------------------------------------------------


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.timeout(700)
def test_g_resume_from_last_ckpt_equals_an_uninterrupted_run(runs: Path) -> None:
    uninterrupted, stopped, resumed = (
        records(runs, "fit2"),
        records(runs, "stopped2"),
        records(runs, "resumed2"),
    )
    assert [len(r["val"]) for r in stopped] == [1, 1] and [len(r["val"]) for r in resumed] == [1, 1]
    for full, rest in zip(uninterrupted, resumed, strict=True):
        assert_same_metrics(rest["val"][-1], full["val"][-1])
        assert max_diff(final(rest), final(full)) < 1e-6
        assert rest["samples"][-1] == full["samples"][-1]  # epoch 2 sees the same shard order


# ---- the "done when", literally ------------------------------------------------------------


def run_ok(args: list[str], cwd: Path) -> None:
    """``python -m lit_ddp ARGS`` with tests/helpers/ importable (for the probe callback); must exit 0."""
    env = {"PYTHONPATH": os.pathsep.join([str(HERE / "helpers"), str(HERE.parent)])}
    proc = run_cli(args, cwd, timeout=300, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_cli_ddp_spawn_syncbn_fit_then_validate_matches_one_device(tmp_path: Path) -> None:
    spawn = ["--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp_spawn"]
    fit = ["fit", "--model.batch_norm=true", "--trainer.sync_batchnorm=true", *spawn]
    fit += ["--data.train_size=256", "--data.val_size=101", "--trainer.max_epochs=1"]
    run_ok([*fit, f"--trainer.default_root_dir={tmp_path}", probe(tmp_path / "fit")], tmp_path)
    (fitted,) = {tuple(r["bn_classes"]) for r in load(tmp_path / "fit", "fit", 2)}
    assert fitted == ("AllReduceSyncBatchNorm",)
    last = next(tmp_path.rglob("last.ckpt"))

    validate = ["validate", "--model.batch_norm=true", f"--ckpt_path={last}", "--data.val_size=1001"]
    run_ok([*validate, *spawn, f"--trainer.default_root_dir={tmp_path}", probe(tmp_path / "val")], tmp_path)
    two = load(tmp_path / "val", "validate", 2)
    one = build_cli(
        [*validate, *CPU, "--trainer.devices=1", f"--trainer.default_root_dir={tmp_path / 'one'}"]
    )
    expected = {k: float(v) for k, v in one.trainer.callback_metrics.items() if k.startswith("val/")}
    for rank_record in two:
        assert_same_metrics(rank_record["val"][-1], expected)


# ---- fractional evaluation limits over uneven shards ---------------------------------------------------


@pytest.mark.parametrize(
    "fraction, samples, world_size, batch_size, batches",
    [(0.5, 65, 2, 32, 1), (0.25, 1000, 3, 10, 8), (0.99, 10, 2, 1, 4)],
)
def test_a_fractional_eval_limit_is_taken_of_the_largest_shard(
    fraction: float, samples: int, world_size: int, batch_size: int, batches: int
) -> None:
    assert batches_of_fraction("limit_val_batches", fraction, samples, world_size, batch_size) == batches


def test_a_fractional_eval_limit_of_no_batch_is_one_line_naming_the_least_fraction() -> None:
    with pytest.raises(UserError, match=r"limit_test_batches=0.4 of 2 batch\(es\) per device is no batch"):
        batches_of_fraction("limit_test_batches", 0.4, 64, 2, 16)


@pytest.mark.parametrize(
    "limit, samples, world_size, batch_size, scored",
    [(0.5, 65, 1, 16, 32), (2, 65, 2, 16, 64), (1, 65, 2, 32, 64), (5, 65, 2, 16, 65), (1.0, 65, 2, 16, 65)],
)
def test_the_images_an_eval_limit_scores_are_counted_over_the_ranks(
    limit: int | float, samples: int, world_size: int, batch_size: int, scored: int
) -> None:
    assert images_scored(limit, samples, world_size, batch_size) == scored


def test_a_fractional_eval_limit_of_no_batch_on_one_process_is_the_same_line_and_leaves_no_run(
    tmp_path: Path, capsys
) -> None:
    """On one process Lightning's own error came at the first test batch, naming no option
    (`You requested to check 0.5 of the test_dataloader but 0.5 * 1 < 1`), and left a run folder."""
    args = ["test", *TINY_RUN, "--trainer.accelerator=cpu", f"--trainer.default_root_dir={tmp_path}"]
    with pytest.raises(SystemExit) as stop:
        main([*args, "--trainer.limit_test_batches=0.5", "--ckpt_path=untrained"])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and "Traceback" not in err, err
    assert err.splitlines()[-1] == (
        "lit_ddp: error: --trainer.limit_test_batches=0.5 of 1 batch(es) per device is no batch: pass at"
        " least 1, or a number of batches (an integer)"
    )
    assert sorted(tmp_path.rglob("*.yaml")) == []


def test_an_eval_limit_that_leaves_images_unscored_says_the_metrics_are_a_subsets(
    tmp_path: Path, caplog
) -> None:
    """--trainer.limit_val_batches (limit_test_batches) of fewer batches than the split's reported its
    metrics without a word, beside a README that promises every metric is the whole dataset's."""
    args = [*TINY_RUN, "--trainer.accelerator=cpu", f"--trainer.default_root_dir={tmp_path}"]
    args += ["--data.val_size=40", "--data.test_size=64"]
    with caplog.at_level("INFO"):
        build_cli(["fit", *args, "--trainer.limit_val_batches=1"])
        build_cli(["test", *args, "--trainer.limit_test_batches=0.5", "--ckpt_path=untrained"])
    notes = [m for m in caplog.messages if m.startswith("lit_ddp: note: --trainer.limit_")]
    assert notes == [
        "lit_ddp: note: --trainer.limit_val_batches=1 scores 32 of the 40 val images: the val/* metrics are"
        " those images', not the whole val split's",
        "lit_ddp: note: --trainer.limit_test_batches=0.5 scores 32 of the 64 test images: the test/* metrics"
        " are those images', not the whole test split's",
    ]
    caplog.clear()
    with caplog.at_level("INFO"):
        build_cli(["fit", *args, "--trainer.limit_val_batches=2"])  # every val image
    assert not [m for m in caplog.messages if m.startswith("lit_ddp: note: --trainer.limit_")]


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_fractional_limit_val_and_test_batches_run_on_uneven_shards(tmp_path: Path) -> None:
    # 65 images in batches of 32 on 2 ranks: shards of 33 and 32 images, 2 batches and 1. Lightning alone
    # takes half of each (1 and 0), raises on rank 1 and leaves rank 0 without its peer.
    spawn = ["--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp_spawn"]
    data = ["--data.train_size=128", "--data.val_size=65", "--data.test_size=65", "--data.batch_size=32"]
    fit = ["fit", *spawn, *data, "--trainer.max_epochs=1", "--trainer.limit_val_batches=0.5"]
    run_ok([*fit, f"--trainer.default_root_dir={tmp_path}", probe(tmp_path / "fit")], tmp_path)
    assert [r["val_batches"] for r in load(tmp_path / "fit", "fit", 2)] == [[[1]], [[1]]]
    test = ["test", *spawn, *data, "--trainer.limit_test_batches=0.5", "--ckpt_path=untrained"]
    run_ok([*test, f"--trainer.default_root_dir={tmp_path}", probe(tmp_path / "test")], tmp_path)
    records = load(tmp_path / "test", "test", 2)
    assert [r["test_batches"] for r in records] == [[[1]], [[1]]]
    assert records[0]["test"] == records[1]["test"] and "test/acc" in records[0]["test"][-1]


@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_a_mistake_found_inside_the_spawned_ranks_is_one_line(tmp_path: Path) -> None:
    """Under ddp_spawn the ranks check the evaluation set and the limits (here 0.01 of 2 batches): the
    UserError reached the user as torch's ProcessRaisedException, a 60-line traceback and exit code 1."""
    spawn = ["--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp_spawn"]
    args = ["validate", *spawn, "--data.val_size=40", "--data.batch_size=16", "--ckpt_path=untrained"]
    run = run_cli([*args, "--trainer.limit_val_batches=0.01", "--data.num_workers=0"], tmp_path, timeout=240)
    assert run.returncode == 2, run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    lines = [line for line in run.stderr.splitlines() if line.startswith("lit_ddp: error: ")]
    assert lines == [
        "lit_ddp: error: --trainer.limit_val_batches=0.01 of 2 batch(es) per device is no batch: pass at"
        " least 0.5, or a number of batches (an integer)"
    ]


# ---- a: a training set that is not a multiple of the world size -------------------------------------


@pytest.mark.parametrize("size, world_size, batch_size", [(255, 2, 32), (250, 3, 16), (1001, 8, 8)])
def test_a_padding_repeats_only_the_first_samples_and_only_in_each_epochs_last_global_batch(
    size: int, world_size: int, batch_size: int
) -> None:
    """What N processes train on beside one process with batch N·b when the set needs padding: the same
    global batches, except that the epoch's last one also holds the permutation's first (N - size mod N)
    samples again (torch's DistributedSampler padding, which keeps every rank at the same step count).
    README ("Exact evaluation") says so; train/* metrics count those repeats."""
    from lit_ddp.data.samplers import ResumableShuffleSampler

    def order(world: int, rank: int) -> list[int]:
        sampler = ResumableShuffleSampler(range(size), num_replicas=world, rank=rank, seed=3)
        sampler.set_epoch(1)
        return list(sampler)

    one, shards = order(1, 0), [order(world_size, r) for r in range(world_size)]
    big = world_size * batch_size
    one_batches = [one[i : i + big] for i in range(0, size, big)]
    repeated = one[: -size % world_size]
    assert repeated and len({len(shard) for shard in shards}) == 1  # equal shards: padding was needed
    for k, batch in enumerate(one_batches):
        together = sorted(i for shard in shards for i in shard[k * batch_size : (k + 1) * batch_size])
        last = k == len(one_batches) - 1
        assert together == sorted(batch + repeated if last else batch), k
    assert sum(len(shard) for shard in shards) == size + len(repeated)


# Trainer.fit under ddp_spawn from Python, then evaluation in the launching process, as a notebook does it.
SPAWN_THEN_VALIDATE = """
import sys
from lightning import Trainer
from lit_ddp.data import ShapesDataModule
from lit_ddp.models import LeNetCIFAR

def quiet(**kwargs):
    kwargs.update(logger=False, enable_progress_bar=False, enable_model_summary=False)
    return Trainer(accelerator="cpu", **kwargs)

if __name__ == "__main__":
    data = ShapesDataModule(train_size=128, val_size=32, test_size=32, batch_size=16)
    model = LeNetCIFAR()
    quiet(devices=2, strategy="ddp_spawn", max_epochs=1, default_root_dir=sys.argv[1]).fit(model, data)
    left = {name: float(state) for name, state in model.val_loss.metric_state.items()}
    assert left == {"mean_value": 0.0, "weight": 0.0}, left
    first, again = (quiet(devices=1).validate(model, data, verbose=False)[0] for _ in range(2))
    assert first == again, (first, again)
    print("validated", first["val/acc"] * 32)
"""


@pytest.mark.ddp
@pytest.mark.timeout(360)
def test_metrics_are_not_shared_with_ddp_spawns_workers(tmp_path: Path) -> None:
    """ddp_spawn pickles the module into its workers through shared memory: their in-place metric updates
    were the launching process's states too, so a validate after fit counted the workers' samples with its
    own (64 of 32 images)."""
    from conftest import cli_env, run_python

    script = tmp_path / "spawn_then_validate.py"  # a file: spawn's workers import the main module again
    script.write_text(SPAWN_THEN_VALIDATE)
    # Forked with its two ranks (helpers/forked_cli.py): they still get the module through spawn's pickle
    # and shared memory, without importing torch three times.
    run = run_python(
        [str(script), str(tmp_path)], env=cli_env(), capture_output=True, text=True, timeout=350, cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr[-3000:]
    correct = float(run.stdout.split("validated")[-1])
    assert correct == round(correct)  # a whole number of the 32 images, not a mix with stale counts
