"""The trust kit (lit_ddp.testing) on deliberately broken models and data modules: each check fails on its
broken case and names the fix; a sound LeNet + Shapes passes every check without a warning (issue 22).
The built-in recipes through ``python -m lit_ddp doctor``: test_doctor.py.

    python -m pytest tests/test_ddp_kit.py -q      # one 2-process and one 1-process launch for all cases
"""

import os
import threading
from pathlib import Path

import pytest
import torch
from conftest import run_python
from torch.utils.data import DistributedSampler
from torchmetrics.classification import MulticlassAccuracy

from lit_ddp.data import ShapesDataModule
from lit_ddp.data.batch_transforms import random_crop_flip
from lit_ddp.errors import UserError
from lit_ddp.models import ImageClassifier, LeNetCIFAR
from lit_ddp.testing import Report, check_ddp_invariants
from lit_ddp.testing.checks import Case, _warnings, run_cases
from lit_ddp.testing.launch import LaunchError, LaunchStopped, free_ports, launch

# Small sets: 2 × 8 per step, 2 steps; 17 validation images (uneven shards of 9 and 8).
SHAPES = {"train_size": 96, "val_size": 40, "test_size": 8, "batch_size": 8}


class RankDependentAugmentation(ShapesDataModule):
    """The old lit_ddp way: crops from a generator seeded by the rank, so 2 processes crop otherwise."""

    def augment_batch(self, x, rand):
        generator = torch.Generator(device=x.device).manual_seed(self.trainer.global_rank)
        return random_crop_flip(x, self.augmentation.padding, generator=generator)


class GlobalRNGAugmentation(ShapesDataModule):
    """Crops from torch's global RNG (torchvision's transforms draw there)."""

    def augment_batch(self, x, rand):
        return random_crop_flip(x, self.augmentation.padding)


class PaddedEvaluation(ShapesDataModule):
    """Evaluation sharded by torch's DistributedSampler, which pads with repeated samples."""

    def _eval_sampler(self, dataset):
        kwargs = self.trainer.distributed_sampler_kwargs if self.trainer is not None else None
        if not kwargs or kwargs["num_replicas"] <= 1:
            return None
        return DistributedSampler(dataset, kwargs["num_replicas"], kwargs["rank"], shuffle=False)


class ResumesAFinishedEpochAtItsEnd(ShapesDataModule):
    """lit_ddp's own data module until a finished epoch resumed at the next one's start: the sampler stayed
    at the finished epoch's end, and with DataLoader workers the next epoch trained no batch."""

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        if self._resume is not None and state_dict.get("epoch_complete"):
            self._resume = (state_dict["epoch"], state_dict["samples"])


class ShardAccuracy(LeNetCIFAR):
    """A validation accuracy each rank computes on its own shard (never synced): rank 0 logs its shard's."""

    def __init__(self) -> None:
        super().__init__()
        self.shard_acc = MulticlassAccuracy(10, sync_on_compute=False)

    def validation_step(self, batch, batch_idx):
        logits = super().validation_step(batch, batch_idx)
        self.shard_acc(logits.argmax(1), batch[1])
        self.log("val/shard_acc", self.shard_acc)
        return logits


class ShardAccuracyNamedValAcc(ShardAccuracy):
    """The same shard's accuracy logged as ``val_acc``, the name Lightning's examples use: it passed the
    metric check, which read only ``val/*`` metrics."""

    def validation_step(self, batch, batch_idx):
        logits = LeNetCIFAR.validation_step(self, batch, batch_idx)
        self.shard_acc(logits.argmax(1), batch[1])
        self.log("val_acc", self.shard_acc)
        return logits


class DropoutNet(torch.nn.Module):
    """A user's network with dropout before its classifier (issue 32: it failed the gradient and resume
    checks, which blamed the data module)."""

    def __init__(self, num_classes: int = 10, p: float = 0.3) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 5), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten()
        )
        self.classifier = torch.nn.Sequential(torch.nn.Dropout(p), torch.nn.Linear(128, num_classes))

    def forward(self, x):
        return self.classifier(self.features(x))


def case(model=None, data=ShapesDataModule, checks=None, **kwargs) -> Case:
    options = {**SHAPES, **kwargs.pop("data_args", {})}
    extra = {"checks": checks} if checks else {}
    return Case(model or LeNetCIFAR(), data(**options), **kwargs, **extra)


# The models' initial weights from a fixed seed, not from whatever the global RNG holds when this module is
# imported (it varies with the tests a worker ran before): a shard's accuracy must differ from the whole's
# for the metric check to catch it, and an untrained net that predicts a class absent from the validation
# set scores 0 on both. fork_rng leaves the global RNG as it was for the tests after.
with torch.random.fork_rng():
    torch.manual_seed(0)
    CASES = {
        "sound": case(),
        "rank_augmentation": case(data=RankDependentAugmentation, checks=("augmentation",)),
        "global_rng_augmentation": case(data=GlobalRNGAugmentation, checks=("augmentation",)),
        "padded_evaluation": case(data=PaddedEvaluation, checks=("shards", "metrics")),
        # 2 per device with BatchNorm and no SyncBatchNorm; 2 × 2 · 2 steps needs 8 training images.
        "batchnorm_batch_2": case(
            LeNetCIFAR(batch_norm=True), checks=("grads",), data_args={"batch_size": 2}
        ),
        "batchnorm_synced": case(
            LeNetCIFAR(batch_norm=True), checks=("grads",), data_args={"batch_size": 2}, sync_batchnorm=True
        ),
        "shard_metric": case(ShardAccuracy(), checks=("metrics",)),
        "shard_metric_val_acc": case(ShardAccuracyNamedValAcc(), checks=("metrics",)),
        "epoch_end_resume": case(
            data=ResumesAFinishedEpochAtItsEnd, checks=("resume",), data_args={"num_workers": 1}
        ),
        "dropout": case(ImageClassifier(net=DropoutNet)),
    }


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Report]:
    root = tmp_path_factory.mktemp("kit")
    return dict(zip(CASES, run_cases(list(CASES.values()), timeout=500, workdir=root), strict=True))


pytestmark = [pytest.mark.ddp, pytest.mark.slow, pytest.mark.timeout(600)]


def test_a_sound_model_and_data_module_pass_every_check_without_a_warning(reports) -> None:
    report = reports["sound"]
    print(report.table())
    assert report.ok and not report.warnings, report.table()
    assert report.table().splitlines()[-1] == "seed of these runs: 0"  # the case's
    assert [r.key for r in report.rows] == [
        *("grads", "steps", "data", "metrics", "shards", "augmentation", "resume", "reproducible"),
        *("batchnorm", "dropout", "padding", "global_rng"),
    ]
    assert "0 of 16 samples augmented differently" in report["augmentation"].measured
    assert "17 samples read 17 times over 9+8" in report["shards"].measured


def test_rank_dependent_augmentation_fails_the_augmentation_check(reports) -> None:
    row = reports["rank_augmentation"]["augmentation"]
    assert not row.holds and "depends on the rank or batch" in row.fix, row
    assert reports["rank_augmentation"]["global_rng"].holds  # seeded, just per rank


def test_augmentation_from_the_global_rng_fails_and_warns_with_the_count(reports) -> None:
    report = reports["global_rng_augmentation"]
    assert not report["augmentation"].holds and "global RNG" in report["augmentation"].fix
    rng = report["global_rng"]
    assert not rng.holds and rng.measured.startswith(("14 of 16", "15 of 16", "16 of 16")), rng.measured


def test_a_padding_evaluation_sampler_fails_the_shard_check(reports) -> None:
    row = reports["padded_evaluation"]["shards"]
    assert not row.holds and "(1 repeats, 0 unread)" in row.measured and "Unpadded" in row.fix, row
    metrics = reports["padded_evaluation"]["metrics"]  # the padding explains it: no sync_dist hint (issue 51)
    assert not metrics.holds, metrics
    assert metrics.fix == "the ranks evaluate other samples than one process: see 'shards'", metrics


def test_batchnorm_at_per_device_batch_2_fails_the_gradient_check_and_warns(reports) -> None:
    report = reports["batchnorm_batch_2"]
    assert not report["grads"].holds and "sync_batchnorm=true" in report["grads"].fix, report.table()
    assert not report["batchnorm"].holds and "per-device batch 2" in report["batchnorm"].measured
    synced = reports["batchnorm_synced"]  # the fix it names makes it hold
    assert synced["grads"].holds and synced["batchnorm"].holds, synced.table()


def test_a_resume_that_loses_the_epoch_after_an_epoch_end_fails_the_resume_check(reports) -> None:
    row = reports["epoch_end_resume"]["resume"]
    assert not row.holds and "the next epoch's start" in row.fix, row
    assert "differ by at most 0.0e+00 and " in row.measured and not row.measured.endswith("and 0.0e+00"), row
    sound = reports["sound"]["resume"]
    assert sound.holds and "at the end of epoch 1 of 2" in sound.measured, sound


def test_a_metric_of_rank_zeros_shard_fails_the_metric_check(reports) -> None:
    row = reports["shard_metric"]["metrics"]
    assert not row.holds and "val/shard_acc" in row.measured and "sync_dist=True" in row.fix, row


def test_a_shard_metric_fails_the_metric_check_whatever_its_name(reports) -> None:
    row = reports["shard_metric_val_acc"]["metrics"]
    assert not row.holds and "val_acc:" in row.measured and "sync_dist=True" in row.fix, row


def test_a_dropout_network_holds_with_dropout_named_as_the_cause(reports) -> None:
    """1 and 2 processes: the checks run the network with its dropout off and hold; a warning row names the
    layer and what dropout changes, so a user who sees runs differ knows why."""
    report = reports["dropout"]
    assert report.ok, report.table()
    row = report["dropout"]
    assert not row.holds and row.warning, row
    assert row.measured == "net.classifier.0: Dropout(p=0.3): the checks ran with p=0"
    assert "draw other masks" in row.fix and "global RNG" in row.fix
    assert CASES["dropout"].model.net.classifier[0].p == 0.3  # the caller's model keeps its dropout
    assert reports["sound"]["dropout"].holds and reports["sound"]["dropout"].measured == "no dropout layer"


def test_the_batchnorm_row_judges_the_batch_the_checks_ran_with() -> None:
    # The config's batch is 32 (fine), the check runs' 8: the gradient gap measured at 8 is what it shows.
    ref = {"bn_classes": ["BatchNorm2d"], "full_sizes": {"train_set": 64}}
    rows = {r.key: r for r in _warnings(8, ref, False, 0.79, None, (2,), configured_batch=32)}
    assert not rows["batchnorm"].holds, rows["batchnorm"]
    assert "per-device batch 8 in these checks (the run's own: 32)" in rows["batchnorm"].measured
    assert "differ by 7.9e-01" in rows["batchnorm"].measured


# The launch stops at the first rank that fails, so the other may or may not have exited by then: the line
# names the ranks that had (CI saw rank 1 still starting when rank 0 had exited).
FAILED = r"^2-process run failed \(rank [01] exited with 3(, rank 1 exited with 3)?\)"


@pytest.mark.parametrize(
    ("code", "timeout", "says"),
    [("import sys; sys.exit(3)", 60, FAILED),
     ("import time; time.sleep(60)", 1, r"^2-process run timed out \(1 s limit\)")],
)  # fmt: skip
def test_a_launch_says_failed_or_timed_out_as_it_happened(tmp_path: Path, code, timeout, says) -> None:
    with pytest.raises(LaunchError, match=says):
        launch(2, ["-c", code], tmp_path, timeout)


@pytest.mark.timeout(120)
def test_a_launch_ends_its_ranks_when_told_to_stop(tmp_path: Path) -> None:
    stop, raised = threading.Event(), []

    def run() -> None:
        try:
            launch(
                1,
                ["-c", "import pathlib, time; pathlib.Path('up').touch(); time.sleep(600)"],
                tmp_path,
                600,
                stop=stop,
            )
        except LaunchError as err:
            raised.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    while not (tmp_path / "up").exists() and thread.is_alive():  # the rank is running
        thread.join(0.05)
    stop.set()
    thread.join()
    assert len(raised) == 1 and isinstance(raised[0], LaunchStopped), raised
    assert str(raised[0]).endswith(": the launch beside it failed")


def test_free_ports_side_by_side_are_distinct() -> None:
    ports = free_ports(8)
    assert len(set(ports)) == 8


class FailsOnTwoProcessesHangsOnOne(ShapesDataModule):
    """Its 2-process ranks stop with a one-line mistake; its 1-process rank never ends on its own."""

    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        if os.environ.get("WORLD_SIZE") == "2":
            raise UserError("the 2-process ranks found a mistake")
        if os.environ.get("WORLD_SIZE") == "1":
            threading.Event().wait()


@pytest.mark.ddp
@pytest.mark.timeout(240)  # the 1-process rank would wait forever: only the stop ends it
def test_the_one_process_launch_beside_a_failed_two_process_launch_is_ended_and_the_failure_reported(
    tmp_path: Path,
) -> None:
    """The 2-process and 1-process launches run side by side; the first to fail ends the other, and its
    error (here a rank's one-line mistake) is what the caller gets, not the other's 'stopped'."""
    case = Case(LeNetCIFAR(), FailsOnTwoProcessesHangsOnOne(**SHAPES), checks=("grads",))
    with pytest.raises(UserError, match="^the 2-process ranks found a mistake$"):
        run_cases([case], timeout=600, workdir=tmp_path)


@pytest.mark.parametrize(
    ("size", "says"),
    [
        # 2 × 8 × 2 steps need 32; a batch of 5 needs 20
        (
            {"train_size": 20},
            "train_set holds 20 samples; the checks need 32 at batch size 8 (2 × 8, 1 × 16):"
            " give the data module more samples, or run the checks at a batch of 5 (doctor --batch-size=5;",
        ),
        # 2 × 8 + 1 need 17; no batch fits 1 sample: 2 × 1 + 1
        (
            {"val_size": 1},
            "val_set holds 1 samples; the checks need 17 at batch size 8 (2 × 8, 1 × 16): give"
            " the data module 3 samples or more",
        ),
    ],
)
def test_a_split_too_small_for_the_checks_is_one_line_naming_the_batch_that_fits(
    tmp_path: Path, size: dict, says: str
) -> None:
    """The line said "pass a smaller batch_size to the checks": not which, and a val split of 1 or 2 samples
    fits none (the doctor's option is --batch-size, the kit's batch_size)."""
    data = ShapesDataModule(**{**SHAPES, **size})
    with pytest.raises(UserError) as err:
        check_ddp_invariants(LeNetCIFAR(), data, workdir=tmp_path, checks=("grads",), timeout=300)
    assert str(err.value).startswith(f"ShapesDataModule.{says}"), err.value


def test_a_training_split_smaller_than_a_check_runs_batch_names_the_checks_batch(tmp_path: Path) -> None:
    """10 training samples: the data module's own check (a batch larger than a device's shard) came first and
    said to pass --data.batch_size=10, which the checks' runs do not use (doctor's option is --batch-size)."""
    data = ShapesDataModule(**{**SHAPES, "train_size": 10})
    with pytest.raises(UserError) as err:
        check_ddp_invariants(LeNetCIFAR(), data, workdir=tmp_path, checks=("grads",), timeout=300)
    assert str(err.value).startswith(
        "ShapesDataModule.train_set holds 10 samples; the checks need 32 at batch size 8 (2 × 8, 1 × 16):"
        " give the data module more samples, or run the checks at a batch of 2 (doctor --batch-size=2;"
    ), err.value


def test_a_batch_of_one_with_batch_norm_names_the_checks_batch(tmp_path: Path) -> None:
    """The data module's own line came from the ranks: "pass --data.batch_size=2 or more", which the checks'
    runs do not read (doctor's option is --batch-size)."""
    with pytest.raises(UserError) as err:
        check_ddp_invariants(
            LeNetCIFAR(batch_norm=True),
            ShapesDataModule(**SHAPES),
            batch_size=1,
            workdir=tmp_path,
            timeout=300,
        )
    assert str(err.value).startswith(
        "batch_size=1 with a BatchNorm model: BatchNorm cannot normalise a batch of one image per device; run"
        " the checks at a batch of 2 or more (doctor --batch-size=2;"
    ), err.value


def test_the_padding_warning_counts_the_repeats_per_device_count() -> None:
    rows = _warnings(128, {"bn_classes": [], "full_sizes": {"train_set": 1001}}, False, 0.0, None, (2, 4, 8))
    padding = next(r for r in rows if r.key == "padding")
    assert not padding.holds and padding.measured.startswith("1001 training samples: 1 repeated on 2 devices")
    assert "3 repeated on 4 devices, 7 repeated on 8 devices" in padding.measured


@pytest.mark.parametrize("given", ["an instance", "the class"])
def test_a_network_given_as_the_model_is_one_line_naming_its_classifier(given: str) -> None:
    """The network a project's net.py holds, passed as the model (README's `model=MyModel()`): the line was
    its multi-line repr and "pass an instance, a class, or a dict", which it already was."""
    from lit_ddp.models.lenet import LeNet

    with pytest.raises(UserError) as err:
        check_ddp_invariants(LeNet(10) if given == "an instance" else LeNet, ShapesDataModule(**SHAPES))
    assert str(err.value) == (
        "model=LeNet is a network (an nn.Module), not a LightningModule: pass the model fit trains,"
        " lit_ddp.models.ImageClassifier(net=LeNet, num_classes=N), or lit_ddp.testing.build(config)'s"
    )


class HoldsALock(ShapesDataModule):
    """A data module with an attribute no pickler takes."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.lock = threading.Lock()


def test_bad_arguments_are_one_line_naming_the_fix(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="is not a lit_ddp ImageDataModule"):
        check_ddp_invariants(LeNetCIFAR(), object())
    with pytest.raises(UserError, match="unknown check"):
        check_ddp_invariants(LeNetCIFAR(), ShapesDataModule(**SHAPES), checks=("speed",))
    with pytest.raises(UserError, match="steps=1 must be 2 or more"):
        check_ddp_invariants(LeNetCIFAR(), ShapesDataModule(**SHAPES), steps=1)
    for batch_size in (0, -2):  # -2 was a traceback from the ranks' samplers, 0 the default batch
        with pytest.raises(UserError, match=f"batch_size={batch_size} must be 1 or more"):
            check_ddp_invariants(LeNetCIFAR(), ShapesDataModule(**SHAPES), batch_size=batch_size)

    with pytest.raises(UserError, match="cannot be pickled .*keep what cannot be pickled"):
        check_ddp_invariants(LeNetCIFAR(), HoldsALock(**SHAPES), workdir=tmp_path)
    (tmp_path / "a_file").write_text("")
    with pytest.raises(UserError, match="cannot create the workdir .*a_file/runs"):
        check_ddp_invariants(LeNetCIFAR(), ShapesDataModule(**SHAPES), workdir=tmp_path / "a_file" / "runs")


def test_a_kit_rank_destroys_its_process_group_at_exit(tmp_path: Path, atexit_handlers: list) -> None:
    """Each rank of the kit (worker.py) leaves no gloo group to the interpreter's finalisation, which can
    abort a rank that finished its work ("terminate called without an active exception"): seen once in a
    generated project's suite. The CLI's runs do the same (test_faults.py)."""
    import pickle

    from lit_ddp.runtime import faults
    from lit_ddp.testing import worker

    jobs = tmp_path / "jobs.pkl"
    jobs.write_bytes(pickle.dumps([]))
    worker.main(str(jobs))
    assert atexit_handlers == [faults._destroy_process_group]


# A user's script: its classes live in its __main__, which the ranks' processes cannot import by name.
SCRIPT = """
from lit_ddp.data import ShapesDataModule
from lit_ddp.models import LeNetCIFAR
from lit_ddp.testing import check_ddp_invariants


class MyData(ShapesDataModule):
    pass


class MyModel(LeNetCIFAR):
    pass


if __name__ == "__main__":
    report = check_ddp_invariants(
        MyModel(), MyData(train_size=96, val_size=40, test_size=8, batch_size=8), checks=("grads",)
    )
    print(report.table())
    assert report.ok
"""


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_classes_defined_in_a_script_or_a_function_travel_to_the_ranks(tmp_path: Path) -> None:
    """Pickled by name, they failed in the ranks with an AttributeError traceback (a script's) or were
    refused (a function's); by value, the kit runs them."""
    script = tmp_path / "check_mine.py"
    script.write_text(SCRIPT)
    result = run_python([str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=580)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "first-step gradients 2×b = 1×2b" in result.stdout

    class Local(ShapesDataModule):  # defined in a function
        pass

    with torch.random.fork_rng():  # the weights from a fixed seed, as CASES' (not from the tests run before)
        torch.manual_seed(0)
        model = LeNetCIFAR()
    report = check_ddp_invariants(model, Local(**SHAPES), checks=("grads",), workdir=tmp_path)
    assert report.ok and "first-step gradients 2×b = 1×2b" in report.table(), report.table()


@pytest.mark.parametrize("accumulate", [1, 2, 3])
def test_the_mid_epoch_stop_is_mid_epoch_under_gradient_accumulation(tmp_path: Path, accumulate: int) -> None:
    """With accumulate_grad_batches=2 an epoch of 2·b·steps samples held one optimizer step: the resume
    check's stop "mid-epoch" after step 1 fell at the epoch's end, and a mid-epoch resume went unchecked."""
    from lit_ddp.testing.checks import _jobs

    jobs, _ = _jobs(case(accumulate_grad_batches=accumulate), "k", tmp_path)
    runs = {j.name: j for j in jobs[2]}
    b = runs["k_full"].batch_size

    def steps_per_epoch(job) -> int:  # a rank's batches of one epoch, over the batches of one step
        return job.train_samples // (2 * b) // accumulate

    assert steps_per_epoch(runs["k_stopped"]) == runs["k_stopped"].max_steps == 2  # step 1 of 2: mid-epoch
    assert runs["k_stopped"].stop_at_step == 1
    assert steps_per_epoch(runs["k_stopped_end"]) == 1  # step 1 ends epoch 1


def test_kit_settings_are_the_trainer_settings_the_config_trains_with(monkeypatch) -> None:
    """A project's generated test passed the config's seed and SyncBatchNorm only: a config with gradient
    accumulation or clipping was checked without them, while doctor checked it with them."""
    from lit_ddp.testing import kit_settings

    trainer = {"sync_batchnorm": True, "accumulate_grad_batches": 2, "gradient_clip_val": 1.0}
    config = {"seed_everything": 7, "trainer": {**trainer, "devices": 8, "num_nodes": 2}}
    assert kit_settings(config) == {"seed": 7, **trainer, "devices": 16}
    # auto and -1: what fit starts on this machine (a machine with no GPU here: 1 CPU process, and a GPU
    # config's count unknown, left to the kit). No seed (false, none): the kit's.
    unseeded = kit_settings({"seed_everything": False, "trainer": {"devices": "auto", "accelerator": "cpu"}})
    defaults = {"sync_batchnorm": False, "accumulate_grad_batches": 1, "gradient_clip_val": None}
    assert unseeded == {"seed": 0, **defaults, "devices": 1}
    assert kit_settings({"trainer": {"devices": [0, 1]}})["devices"] == 2
    # A GradientAccumulationScheduler's scheduling in the Trainer's place (it was checked with 1).
    scheduler = {"class_path": "lightning.pytorch.callbacks.GradientAccumulationScheduler"}
    scheduler["init_args"] = {"scheduling": {0: 1, 2: 4}}
    scheduled = {"trainer": {"callbacks": [{"class_path": "lit_ddp.callbacks.StepLoss"}, scheduler]}}
    assert kit_settings(scheduled)["accumulate_grad_batches"] == {0: 1, 2: 4}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "devices" not in kit_settings({"trainer": {"devices": -1, "accelerator": "gpu"}})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert kit_settings({"trainer": {"devices": "-1", "num_nodes": 2}})["devices"] == 8
    # A DDP that looks for parameters the loss does not reach (the kit's ran without: doctor refused the model
    # with the line naming this strategy as the fix).
    assert "find_unused_parameters" not in kit_settings({"trainer": {"strategy": "ddp"}})
    assert kit_settings({"trainer": {"strategy": "ddp_find_unused_parameters_true"}})[
        "find_unused_parameters"
    ]
    ddp = {"class_path": "lightning.pytorch.strategies.DDPStrategy"}
    ddp["init_args"] = {"find_unused_parameters": True}
    assert kit_settings({"trainer": {"strategy": ddp}})["find_unused_parameters"]


def test_a_config_whose_seed_is_drawn_is_judged_at_a_drawn_seed_that_the_report_names() -> None:
    """`seed_everything: true`, which a printed config keeps: fit and doctor draw a seed (doctor's header
    names it), while a project's test, kit_settings(resolved_config(...)), judged seed 0 every time. It now
    draws as they do, and the report's table ends with the seed its runs took, to pass again as seed=N."""
    from lit_ddp.cli import main
    from lit_ddp.testing import kit_settings, resolved_config
    from lit_ddp.testing.checks import Row

    config = resolved_config(main, "--seed_everything=true")
    seeds = [kit_settings(config)["seed"] for _ in range(2)]
    assert seeds[0] != seeds[1] and all(0 <= s < 2**32 for s in seeds), seeds  # two draws agree once in 2**32
    table = Report([Row("grads", "first-step gradients", True, "1e-7", "")], seed=seeds[0]).table()
    assert table.splitlines()[-1] == f"seed of these runs: {seeds[0]}", table


def test_a_validation_that_logs_no_metric_is_a_warning_not_a_yes() -> None:
    """The metric check said "yes: 0 val metrics" for a model whose validation logs nothing: a pass that
    vouched for metrics nobody logged."""
    from lit_ddp.testing.checks import _metrics

    row = _metrics([{"rank": r, "val_logged": [{}]} for r in (0, 1)], {"val_logged": [{}]})
    assert (row.holds, row.warning) == (False, True) and "no validation metric logged" in row.measured
    assert Report([row]).ok and Report([row]).warnings == [row]
    logged = _metrics([{"rank": 0, "val_logged": [{"val_acc": 0.5}]}], {"val_logged": [{"val_acc": 0.5}]})
    assert logged.holds and not logged.warning and logged.measured.startswith("1 val metrics")


def test_a_metric_that_is_nan_in_one_run_only_does_not_hold() -> None:
    """A difference with NaN compares False with every bound, so val/loss NaN on 2 processes and finite on 1
    held the metric check; NaN in both runs is the same value."""
    from lit_ddp.testing.checks import _metrics

    nan = float("nan")
    two = [{"rank": r, "val_logged": [{"val/loss": nan, "val/acc": 0.5}]} for r in (0, 1)]
    row = _metrics(two, {"val_logged": [{"val/loss": 0.7, "val/acc": 0.5}]})
    assert not row.holds and "val/loss: nan on rank 0 of 2, 0.7 on 1" in row.measured, row.measured
    finite = [{"rank": 0, "val_logged": [{"val/loss": 0.7}]}]
    assert not _metrics(finite, {"val_logged": [{"val/loss": nan}]}).holds
    assert _metrics(two, {"val_logged": [{"val/loss": nan, "val/acc": 0.5}]}).holds


class _ForwardingClassifier(ImageClassifier):
    """A user's system that forwards ImageClassifier's arguments with **kwargs: jsonargparse (so fit) sees
    num_classes through them."""

    def __init__(self, extra: float = 0.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.extra = extra


def test_build_gives_a_model_that_forwards_its_arguments_the_datas_classes_as_fit_does() -> None:
    """build() asked Python's signature whether the model takes num_classes: a system taking it through
    **kwargs got the default 10 classes while fit (jsonargparse) linked the data's 3, so the project's tests
    and the trust kit checked another model than the one fit trains."""
    from lit_ddp.testing import build

    config = {
        "model": {
            "class_path": f"{__name__}._ForwardingClassifier",
            "init_args": {"net": {"class_path": "lit_ddp.models.LeNet"}},
        },
        "data": {"class_path": "lit_ddp.data.ShapesDataModule", "init_args": {"train_size": 8}},
    }
    model, _ = build(config, num_classes=3)
    assert model.num_classes == 3 and model.net.classifier[-1].out_features == 3


class UnusedParameterNet(torch.nn.Module):
    """A user's network with a layer its forward never calls."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.head = torch.nn.Linear(3, num_classes)
        self.aux = torch.nn.Linear(3, num_classes)

    def forward(self, x):
        return self.head(x.mean(dim=(2, 3)))


def test_a_parameter_the_loss_does_not_reach_is_one_line_unless_the_run_looks_for_unused_ones(
    tmp_path: Path,
) -> None:
    """The 2-process runs failed in DDP's reducer, printed as each rank's traceback ("no check ran"), and
    with the run's ddp_find_unused_parameters_true, which trains the model, the kit's runs failed the same."""
    model, data = ImageClassifier(net=UnusedParameterNet), ShapesDataModule(**SHAPES)
    with pytest.raises(UserError) as err:
        check_ddp_invariants(model, data, checks=("grads",), workdir=tmp_path / "plain", timeout=300)
    assert str(err.value).startswith("net.aux.weight, net.aux.bias took no part in the loss"), err.value
    report = check_ddp_invariants(
        model, data, checks=("grads",), find_unused_parameters=True, workdir=tmp_path / "finds", timeout=300
    )
    assert report.ok, report.table()
