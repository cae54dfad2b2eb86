"""``python -m lit_ddp doctor``: the trust kit holds on the built-in recipes that read files (CIFAR-10 from
small pickles, the ResNet ImageNet recipe on a small ImageNet-layout tree) and exits 1, naming the fix, when a
check fails. LeNet on Shapes is test_ddp_kit.py's sound case (the same classes through the Python API: one
doctor run fewer in CI); docs/benchmarks.md times doctor on all three recipes.

    python -m pytest tests/test_doctor.py -q
"""

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import REPO, run_cli
from imagenet_tree import make_tree
from test_cifar10 import write_cifar10

from lit_ddp.data import ShapesDataModule
from lit_ddp.models import LeNetCIFAR

CONFIGS = REPO / "configs"
CHECK_ROWS = 8  # the checks; four warning rows follow


def doctor(args: list[str], cwd: Path) -> tuple[int, str]:
    proc = run_cli(["doctor", *args], cwd, timeout=560)
    return proc.returncode, proc.stdout + proc.stderr


def table(out: str) -> list[list[str]]:
    """The report's rows, as cells (check, holds?, measured, what to change)."""
    lines = out[out.index("check ") :].splitlines()[2:]
    return [[c.strip() for c in line.split(" | ")] for line in lines if line.count(" | ") == 3]


def assert_every_check_holds(code: int, out: str) -> list[list[str]]:
    assert "check " in out, out[-6000:]  # the report's header: else what doctor printed instead
    rows = table(out)
    assert code == 0 and len(rows) == CHECK_ROWS + 4, out[-4000:]
    assert [r[1] for r in rows[:CHECK_ROWS]] == ["yes"] * CHECK_ROWS, out[-4000:]
    assert "every check holds" in out
    return rows


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_doctor_holds_on_lenet_cifar_and_warns_of_padding(tmp_path: Path) -> None:
    write_cifar10(tmp_path / "cifar", per_batch=20)  # 100 training images, 30 for validation
    # A data_dir relative to the folder doctor runs in, as fit takes it: the ranks run there too.
    args = ["--config", str(CONFIGS / "lenet_cifar.yaml"), "--data.data_dir=cifar", "--data.val_size=30"]
    args.append("--data.batch_size=32")  # the config's 128 is more than the 70 images fit would train on
    rows = assert_every_check_holds(*doctor(args, tmp_path))
    padding = next(r for r in rows if r[0].startswith("training-set size"))
    assert padding[1] == "WARN" and "70 training samples: 2 repeated on 4 devices" in padding[2]


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_doctor_holds_on_resnet_imagenet_with_syncbn(tmp_path: Path) -> None:
    special = make_tree(tmp_path / "tree")
    special["truncated"].unlink()  # the checks count samples per batch: no file is dropped from one
    special["corrupt"].unlink()
    # The recipe's SyncBatchNorm, SGD, schedule and ImageFolder data path with a ResNet-18 on 64-pixel crops:
    # a ResNet-50 pickles to 100 MB per run and its checks take minutes on 2 cores (README has its figures).
    args = ["--config", str(CONFIGS / "resnet_imagenet.yaml"), f"--data.data_dir={tmp_path / 'tree'}"]
    args += ["--model.arch=resnet18", "--data.image_size=64", "--data.val_resize=73", "--batch-size=2"]
    args.append("--data.batch_size=8")  # the config's 256 is more than the tree's training images
    code, out = doctor(args, tmp_path)
    assert "sync_batchnorm=True" in out
    assert_every_check_holds(code, out)


# The checks' own batch and accumulation fit; fit refuses the config's (a batch, or the step it accumulates).
FIT_REFUSES = [
    (["--data.batch_size=64"], "--data.batch_size=64", 64, "--data.batch_size=50 or less"),
    (
        ["--data.batch_size=32", "--trainer.accumulate_grad_batches=2"],
        "--data.batch_size=32 × --trainer.accumulate_grad_batches=2 = 64",
        64,
        "--data.batch_size=25 or less, or --trainer.accumulate_grad_batches=1 or less",
    ),
    (  # the checks ran with 1 accumulated (the Trainer's), and said every check holds
        [
            "--data.batch_size=16",
            "--trainer.callbacks+=GradientAccumulationScheduler",
            "--trainer.callbacks.scheduling={0: 1, 1: 4}",
        ],
        "--data.batch_size=16 × GradientAccumulationScheduler's 4 = 64",
        64,
        "--data.batch_size=12 or less, or a scheduling of 3 or less",
    ),
]


@pytest.mark.ddp
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("given", "asked", "step", "fix"), FIT_REFUSES, ids=["batch", "accumulated", "scheduled"]
)
def test_a_batch_that_fit_refuses_on_the_configured_devices_is_fits_line(
    tmp_path: Path, given: list[str], asked: str, step: int, fix: str
) -> None:
    """The checks ran at their own batch (2 × 8, 1 × 16) and said every check holds for a config whose
    batch of 64 (or 32 accumulated twice) is more than the 50 training images each of its 2 devices gets,
    which fit refuses."""
    args = ["--data.train_size=100", "--data.val_size=40", *given, "--trainer.devices=2"]
    proc = run_cli(["doctor", "--checks=grads", *args], tmp_path, timeout=560)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stderr.splitlines() == [
        f"lit_ddp: error: {asked} is more than the 50 training images on each of 2 devices: every"
        f" step would take 50, not {step} (the global batch and a scaled lr would be wrong): pass {fix}"
    ], proc.stderr[-3000:]
    assert "check " not in proc.stdout  # no table: nothing was checked


CRASHES_IN_THE_RANKS = """
from lit_ddp.data import ShapesDataModule


class Unreachable(ShapesDataModule):
    def load_split(self, split):
        raise ConnectionError("bucket my-data is unreachable")
"""


@pytest.mark.ddp
@pytest.mark.timeout(600)
def test_a_rank_failing_in_the_users_code_is_its_error_not_the_doctors_traceback(tmp_path: Path) -> None:
    """A data module that fails in the ranks' setup: the doctor printed its own call stack (runpy, cli.py,
    checks.py, a thread, launch.py) down to LaunchError, then the rank's last 3000 characters, and the
    ranks' logs went with the temporary folder."""
    (tmp_path / "unreachable.py").write_text(CRASHES_IN_THE_RANKS)
    args = ["doctor", "--checks=grads", "--data=unreachable.Unreachable", "--data.train_size=64"]
    proc = run_cli(args, tmp_path, timeout=560, env={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr.split("--- rank ")[0], proc.stderr[-6000:]  # only the ranks' own
    first = proc.stderr.splitlines()[0]
    assert (
        first.startswith("python -m lit_ddp doctor: no check ran: the ") and " run failed (rank " in first
    ), first
    assert "ConnectionError: bucket my-data is unreachable" in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.rstrip().endswith("--workdir=DIR keeps each rank's whole log"), proc.stderr[-500:]
    assert "check " not in proc.stdout  # no table: nothing was checked


def test_what_fit_refuses_before_building_anything_the_doctor_refuses_in_its_line(capsys) -> None:
    """The doctor reads the config as fit does: the run plan's problems are fit's lines, before any check."""
    from lit_ddp.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["doctor", "--trainer.accumulate_grad_batches=0"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err.splitlines() == [
        "lit_ddp: error: --trainer.accumulate_grad_batches=0 must be 1 or more (the batches whose gradients"
        " add up before each optimizer step; 1 steps after every batch)"
    ], err


@pytest.mark.parametrize("kit_batch", [[], ["--batch-size=2"]])
def test_a_config_batch_of_one_with_batch_norm_is_fits_line(capsys, kit_batch: list[str]) -> None:
    """fit refuses a per-device batch of 1 with a BatchNorm model; the doctor said to run its checks at
    --batch-size=2, and then said every check holds, for a config fit refuses."""
    from lit_ddp.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["doctor", "--checks=grads", "--model.batch_norm=true", "--data.batch_size=1", *kit_batch])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err.splitlines() == [
        "lit_ddp: error: batch_size=1 with a BatchNorm model: BatchNorm cannot normalise a batch of one image"
        " per device; pass --data.batch_size=2 or more, or a model without BatchNorm"
    ], err


class Launched(Exception):
    """The doctor reached the launch of its checks' ranks, where these tests stop it."""


@pytest.fixture
def launches(monkeypatch, tmp_path: Path) -> dict[int, set[int]]:
    """The checks' per-device batches by world size, recorded as the doctor launches its ranks (``Launched``
    then stops it), in an empty working folder."""
    import pickle

    from lit_ddp.testing import checks

    batches: dict[int, set[int]] = {}

    def launch(world_size: int, command: list[str], *args) -> None:  # the launch, not its ranks
        batches[world_size] = {job.batch_size for job in pickle.loads(Path(command[-1]).read_bytes())}
        raise Launched

    monkeypatch.setattr(checks, "launch", launch)
    monkeypatch.chdir(tmp_path)
    return batches


@pytest.mark.parametrize(("devices", "sync"), [(2, True), (1, True), (2, False)])
def test_a_config_batch_of_one_with_sync_batchnorm_on_two_devices_is_checked_as_fit_trains_it(
    launches: dict[int, set[int]], capsys, devices: int, sync: bool
) -> None:
    """fit trains a batch of 1 per device when SyncBatchNorm spans 2 devices (their 2 images normalised
    together), and refuses it on 1 device or without sync: the doctor says the same, and runs its checks at
    that batch (2 processes × 1, 1 × 2) where fit trains it."""
    from lit_ddp.cli import main

    batches = launches
    args = ["doctor", "--checks=grads", "--model.batch_norm=true", "--data.batch_size=1"]
    args += [f"--trainer.devices={devices}", "--trainer.accelerator=cpu", "--trainer.strategy=ddp_spawn"]
    with pytest.raises(Launched if devices > 1 and sync else SystemExit):
        main([*args, f"--trainer.sync_batchnorm={str(sync).lower()}"])
    err = capsys.readouterr().err.strip()
    if devices > 1 and sync:
        assert batches == {2: {1}, 1: {2}} and "lit_ddp: error" not in err, err
    else:
        assert not batches and err.splitlines() == [
            "lit_ddp: error: batch_size=1 with a BatchNorm model: BatchNorm cannot normalise a batch of one"
            " image per device; pass --data.batch_size=2 or more, or a model without BatchNorm"
        ], err


def test_a_gpu_world_this_machine_cannot_count_is_not_refused_a_batch_of_one_with_sync_batchnorm(
    launches: dict[int, set[int]], monkeypatch, capsys
) -> None:
    """devices=auto on a GPU config, on a machine without one: the doctor judged the run as 1 device and
    gave fit's refusal of a batch of 1 with BatchNorm, though the run syncs BatchNorm over every GPU of its
    machine. It now says what it judged and how to give the count, and runs the checks."""
    import torch

    from lit_ddp.cli import main

    batches = launches
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    args = ["doctor", "--checks=grads", "--model.batch_norm=true", "--data.batch_size=1"]
    with pytest.raises(Launched):
        main([*args, "--trainer.accelerator=gpu", "--trainer.sync_batchnorm=true"])
    captured = capsys.readouterr()
    assert batches == {2: {1}, 1: {2}} and "lit_ddp: error" not in captured.err, captured.err
    assert captured.out.splitlines()[0].endswith(
        "; the run's devices (devices=auto, accelerator=gpu) cannot be counted on this machine: judged as 1"
        " device, SyncBatchNorm as spanning 2 or more; pass --trainer.devices=N, the run's count"
    ), captured.out


@pytest.mark.parametrize("resume", [False, True])
def test_the_doctor_reads_a_config_fit_printed(launches: dict[int, set[int]], capsys, resume: bool) -> None:
    """`fit --print_config > my.yaml` then `doctor --config my.yaml` (the README's road) was refused: the
    printed config holds fit's own arguments (ckpt_path, weights_only), which the doctor's parser lacked. A
    resume's config names its checkpoint: the doctor says it is not read, and checks the training."""
    from lit_ddp.cli import main

    args = ["--checks=grads", "--data.train_size=64", "--trainer.accelerator=cpu"]
    with pytest.raises(SystemExit):
        main(["fit", "--print_config", *(["--ckpt_path=some/last.ckpt"] if resume else [])])
    Path("my.yaml").write_text(capsys.readouterr().out)
    with pytest.raises(Launched):
        main(["doctor", "--config", "my.yaml", *args])
    captured = capsys.readouterr()
    assert launches and "lit_ddp: error" not in captured.err, captured.err
    noted = "doctor: note: ckpt_path=some/last.ckpt is not read: the checks train from the start"
    assert (noted in captured.out) == resume, captured.out


def test_doctor_exits_1_naming_the_fix_when_a_check_fails(monkeypatch, capsys) -> None:
    # The checks' own failures are test_ddp_kit.py's: here what doctor does with a report that has one.
    from lit_ddp.testing import doctor as doctor_module
    from lit_ddp.testing.checks import Report, Row

    failing = Report(
        [
            Row("grads", "first-step gradients 2×b = 1×2b", False, "relative difference 3.1e-01", "set sync"),
            Row(
                "batchnorm", "BatchNorm at small per-device batch", False, "per-device batch 2", "sync", True
            ),
        ]
    )
    got = {}

    def fake_checks(model, datamodule, **kwargs):
        got.update(kwargs)
        return failing

    monkeypatch.setattr(doctor_module, "check_ddp_invariants", fake_checks)
    config = {
        "trainer": {"devices": 4, "num_nodes": 2, "accumulate_grad_batches": 3, "gradient_clip_val": 1.0},
        "seed_everything": 7,
    }
    cli = SimpleNamespace(
        model=LeNetCIFAR(),
        datamodule=ShapesDataModule(batch_size=2),
        trainer=SimpleNamespace(num_devices=1, num_nodes=1),  # the checks' CPU trainer: the config counts
        config=config,
        parser=SimpleNamespace(parse_args=lambda args: config),
    )
    seen_args = []
    code = doctor_module.main(
        ["--config", "x.yaml", "--checks=grads", "--batch-size=2"], lambda a: seen_args.append(a) or cli
    )
    out = capsys.readouterr()
    assert code == 1 and "some checks do not hold (1 warning(s))" in out.err
    rows = table(out.out)
    assert rows[0][:2] == ["first-step gradients 2×b = 1×2b", "NO"] and rows[1][1] == "WARN"
    assert seen_args == [["--config", "x.yaml", "--trainer.accelerator=cpu"]]  # the checks run on CPU
    assert got["checks"] == ("grads",) and got["batch_size"] == 2 and got["devices"] == 8 and got["seed"] == 7
    assert (got["accumulate_grad_batches"], got["gradient_clip_val"], got["sync_batchnorm"]) == (
        3,
        1.0,
        False,
    )


@pytest.mark.parametrize(("image_size", "batch_size", "expected"), [(32, 128, 8), (224, 256, 4), (224, 2, 2)])
def test_the_check_runs_batch_is_smaller_for_large_images(monkeypatch, image_size, batch_size, expected):
    """The checks need a few steps, not a full batch: 8 per device, 4 above 64 px (ResNet-50 at 224 px then
    fits about two minutes on 2 cores), never more than the config's own batch."""
    from lit_ddp.testing import doctor as doctor_module
    from lit_ddp.testing.checks import Report

    got = {}
    fake_checks = lambda model, data, **kwargs: got.update(kwargs) or Report([])  # noqa: E731
    monkeypatch.setattr(doctor_module, "check_ddp_invariants", fake_checks)
    data = ShapesDataModule(batch_size=batch_size)
    data.image_size = image_size
    config = {"trainer": {}, "seed_everything": 0}
    cli = SimpleNamespace(
        model=LeNetCIFAR(),
        datamodule=data,
        config=config,
        parser=SimpleNamespace(parse_args=lambda args: config),
    )
    assert doctor_module.main(["--config", "x.yaml"], lambda a: cli) == 0
    assert got["batch_size"] == expected


@pytest.mark.parametrize(
    ("accelerator", "devices", "gpus", "world"),
    [
        ("auto", "auto", 0, 1),
        ("auto", "auto", 4, 4),
        ("gpu", "auto", 8, 8),
        ("cpu", "auto", 4, 1),
        ("gpu", "auto", 0, 0),
    ],
)
def test_the_world_judged_is_the_one_the_config_runs_in_on_this_machine(
    monkeypatch, capsys, accelerator: str, devices, gpus: int, world: int
) -> None:
    """devices=auto was judged as 1 device whatever the machine: a GPU machine's run starts every GPU (the
    config's batch against each one's shard, the padding warning). auto is counted as fit counts it here,
    from the config's own accelerator (the checks' parse runs on CPU); where this machine cannot (a GPU
    config on a machine without one), the header says 1 was judged."""
    import torch

    from lit_ddp.testing import doctor as doctor_module
    from lit_ddp.testing.checks import Report

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    got = {}
    fake_checks = lambda model, data, **kwargs: got.update(kwargs) or Report([])  # noqa: E731
    monkeypatch.setattr(doctor_module, "check_ddp_invariants", fake_checks)
    checks_config = {"trainer": {"accelerator": "cpu", "devices": devices}, "seed_everything": 0}
    own = {"trainer": {"accelerator": accelerator, "devices": devices}, "seed_everything": 0}
    cli = SimpleNamespace(
        model=LeNetCIFAR(),
        datamodule=ShapesDataModule(batch_size=64),
        config=checks_config,
        parser=SimpleNamespace(parse_args=lambda args: own),
    )
    assert doctor_module.main(["--config", "x.yaml"], lambda a: cli) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert got.get("devices") == (world or None), header
    if world:
        assert header.endswith(
            f"; judged for the run's {world} device{'s' if world > 1 else ''} (devices={devices} on this"
            f" machine): a global batch of 64 × {world} × 1 = {64 * world}"
        ), header
    else:
        assert header.endswith(
            f"; the run's devices (devices={devices}, accelerator={accelerator}) cannot be counted on this"
            " machine: judged as 1 device; pass --trainer.devices=N, the run's count"
        ), header


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            [],
            "judged for the run's 1 device (devices=auto on this machine): a global batch of 64 × 1 × 1 = 64",
        ),
        (
            ["--trainer.devices=3"],
            "judged for the run's 3 devices (devices=3): a global batch of 64 × 3 × 1 = 192",
        ),
        (
            ["--trainer.accelerator=gpu"],
            "the run's devices (devices=auto, accelerator=gpu) cannot be counted",
        ),
    ],
)
def test_the_doctor_names_the_world_it_judged_from_the_config_fit_reads(
    monkeypatch, capsys, args: list[str], says: str
) -> None:
    """The command's own parse (the checks' faked): on this CPU machine auto is fit's 1 process; a GPU
    config is not counted here, and says so."""
    import torch

    from lit_ddp.cli import main
    from lit_ddp.testing import doctor as doctor_module
    from lit_ddp.testing.checks import Report

    if torch.cuda.is_available():
        pytest.skip("counts this machine's GPUs: the case above fakes them")
    got = {}
    fake_checks = lambda model, data, **kwargs: got.update(kwargs) or Report([])  # noqa: E731
    monkeypatch.setattr(doctor_module, "check_ddp_invariants", fake_checks)
    with pytest.raises(SystemExit) as exit_info:
        main(["doctor", "--data.batch_size=64", *args])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and says in out.splitlines()[0], out


@pytest.mark.parametrize("batch_size", ["0", "-2"])
def test_a_batch_size_under_1_is_one_line(capsys, batch_size: str) -> None:
    """--batch-size=0 ran the checks at the default batch in silence; -2 ended in the ranks' tracebacks."""
    from lit_ddp.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["doctor", f"--batch-size={batch_size}"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err.splitlines() == [
        f"lit_ddp: error: batch_size={batch_size} must be 1 or more: the per-device batch of the checks"
    ], err


def test_state_outside_state_dict_is_recorded_by_name_metrics_left_out() -> None:
    """A counter in a plain attribute is what a checkpoint loses; torchmetrics' states are reduced and reset
    by design and are not named."""
    import torch
    from torchmetrics.classification import MulticlassAccuracy

    from lit_ddp.testing.checks import loose_changes
    from lit_ddp.testing.record import loose_state

    class Counting(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0
            self.lin = torch.nn.Linear(2, 2)

    system = torch.nn.Module()
    system.net, system.acc = Counting(), MulticlassAccuracy(3)
    before = loose_state(system)
    system.net.calls += 2
    system.acc.update(torch.tensor([0, 1]), torch.tensor([0, 2]))
    assert "net.calls" in before and not any(k.startswith("acc") for k in before), before
    assert loose_changes({"loose_init": before, "loose_final": loose_state(system)}) == ["net.calls (0 → 2)"]


def test_sample_hashes_tell_a_random_draw_in_getitem_from_a_fixed_dataset() -> None:
    import torch

    from lit_ddp.data.datasets import TensorImageDataset
    from lit_ddp.testing.record import content

    images = torch.randint(0, 255, (6, 3, 4, 4), dtype=torch.uint8)
    fixed = content(TensorImageDataset(images, torch.arange(6)))
    assert fixed["unstable"] == [] and len(set(fixed["digests"])) == 6

    class Noisy(TensorImageDataset):
        def __getitem__(self, index):
            x, y = super().__getitem__(index)
            return x ^ torch.randint(1, 4, x.shape, dtype=torch.uint8), y

    assert content(Noisy(images, torch.arange(6)))["unstable"] == list(range(6))


def test_a_gradient_scaled_by_exactly_one_half_is_found_and_rounding_is_not() -> None:
    import torch

    from lit_ddp.testing.checks import grad_scale

    one = {"w": torch.randn(50, 20), "b": torch.randn(20)}
    half = {k: v / 2 for k, v in one.items()}
    assert abs(grad_scale(half, one) - 0.5) < 1e-6
    rounded = {k: v * (1 + 1e-7 * torch.randn_like(v)) for k, v in one.items()}
    assert grad_scale(rounded, one) is None
    other = {k: torch.randn_like(v) for k, v in one.items()}
    assert grad_scale(other, one) is None


def test_an_in_worker_crop_is_read_by_its_seeded_key_and_a_plain_index_is_not_stable(tmp_path: Path) -> None:
    from lit_ddp.data import ImageNetDataModule
    from lit_ddp.testing.record import content
    from lit_ddp.testing.worker import seeds_each_sample

    special = make_tree(tmp_path / "tree")
    special["truncated"].unlink()
    special["corrupt"].unlink()
    dm = ImageNetDataModule(data_dir=str(tmp_path / "tree"), image_size=32, val_resize=36, num_workers=0)
    dm.setup("fit")
    # The recipe's random crop runs in the workers, seeded per (index, seed) by the training sampler:
    # a plain index draws anew, the seeded key reads the same crop twice.
    assert seeds_each_sample(dm, dm.train_set)
    assert content(dm.train_set)["unstable"]
    seeded = content(dm.train_set, seed=0)
    assert seeded["unstable"] == [] and len(set(seeded["digests"])) == len(dm.train_set)
    assert not seeds_each_sample(object(), dm.train_set)  # a data module without train_sampler: plain keys


class RecordsPrepareData(ShapesDataModule):
    """Appends a line to ``calls`` in each prepare_data and each setup: a naive download would run as
    often, and at the same moments."""

    calls: str = ""

    def prepare_data(self) -> None:
        with open(self.calls, "a") as out:
            out.write(f"prepare_data {os.getpid()}\n")

    def setup(self, stage: str) -> None:
        with open(self.calls, "a") as out:
            out.write(f"setup {os.getpid()}\n")
        super().setup(stage)


@pytest.mark.ddp
@pytest.mark.timeout(600)
def test_prepare_data_runs_once_before_any_run_of_the_checks(tmp_path: Path) -> None:
    """Every fit and validation of both launches called prepare_data on its local rank 0, the 2-process
    and the 1-process launch side by side: a download there wrote the same files from two processes. The
    first caller runs it in its rank, holding a lock; every other waits and skips it."""
    from lit_ddp.testing import check_ddp_invariants

    dm = RecordsPrepareData(train_size=64, val_size=40, test_size=8, batch_size=8)
    dm.calls = str(tmp_path / "calls.txt")
    check_ddp_invariants(LeNetCIFAR(), dm, checks=("grads", "metrics"))
    calls = Path(dm.calls).read_text().splitlines()
    assert [c.split()[0] for c in calls].count("prepare_data") == 1, calls
    assert calls[0].startswith("prepare_data "), calls  # before every run's setup
    assert sum(c.startswith("setup ") for c in calls) >= 6, calls  # 2 + 1 fits, 2 + 1 validations
