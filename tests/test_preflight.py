"""The preflight table (lit_ddp/preflight.py): a command line → the one line it gets before any Trainer or
process exists (exit 2, nothing written), or the plan field it gives. Rows that depend on the machine (its
CUDA devices) are checked on a plan with the machine given, so they hold on any test machine."""

from dataclasses import replace
from pathlib import Path

import pytest
from conftest import TINY_RUN

from lit_ddp.cli import main
from lit_ddp.preflight import ROWS, RunPlan, problems

# Command line → the start of the line it gets. Each case was a traceback or Lightning's own words once.
LINES = [
    ("devices", ["--trainer.devices=0"], "--trainer.devices=0 asks for no device: pass a count"),
    # Lightning raised a TypeError traceback for a value that is no count, list or auto.
    ("devices", ["--trainer.devices=abc"], "--trainer.devices=abc is not a number of devices: pass a count"),
    (
        "precision",
        ["--trainer.precision=16-true"],
        "--trainer.precision=16-true keeps the weights in float16, and",
    ),
    (
        "precision",
        ["--trainer.precision=bf16-true"],
        "--trainer.precision=bf16-true keeps the weights in bfloat16,",
    ),
    (
        "precision",
        ["--trainer.precision=64"],
        "--trainer.precision=64 keeps the weights in float64, and lit_ddp's",
    ),
    (
        "accumulation",
        ["--trainer.accumulate_grad_batches=0"],
        "--trainer.accumulate_grad_batches=0 must be 1 or more",
    ),
    (
        "accumulation",
        ["--trainer.accumulate_grad_batches=-1"],
        "--trainer.accumulate_grad_batches=-1 must be 1 or more",
    ),
    (
        "run_dir",
        ["--trainer.default_root_dir=a_file/logs"],
        "--trainer.default_root_dir=a_file/logs cannot be",
    ),
    # A logger's own folder as the run's: it was an OSError traceback from the logger's first write.
    (
        "logger_dir",
        ["--trainer.logger=CSVLogger", "--trainer.logger.init_args.save_dir=a_file/logs"],
        "--trainer.logger.init_args.save_dir=a_file/logs cannot be written",
    ),
]


def _spy(monkeypatch) -> list[RunPlan]:
    """The plans the CLI checks, recorded as it checks them."""
    seen: list[RunPlan] = []
    monkeypatch.setattr("lit_ddp.cli.problems", lambda plan: seen.append(plan) or problems(plan))
    return seen


@pytest.mark.parametrize(("row", "args", "line"), LINES)
def test_each_row_is_one_line_before_anything_is_built(
    tmp_path: Path, monkeypatch, capsys, row: str, args: list[str], line: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("")
    seen = _spy(monkeypatch)
    with pytest.raises(SystemExit) as stop:
        main(["fit", *TINY_RUN, *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(f"lit_ddp: error: {line}"), err[0]
    assert ROWS[row](seen[0]) == err[0].removeprefix("lit_ddp: error: ")
    assert not (tmp_path / "logs").exists()


def test_every_problem_is_a_line_of_its_own(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["--trainer.precision=64", "--trainer.accumulate_grad_batches=0"]
    with pytest.raises(SystemExit) as stop:
        main(["fit", *TINY_RUN, *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2
    assert [e.split("=")[0] for e in err] == [
        "lit_ddp: error: --trainer.accumulate_grad_batches",
        "lit_ddp: error: --trainer.precision",
    ]


# (plan, the start of its line) for the rows that read the machine: given here, not this machine's.
MACHINE = [
    (
        RunPlan(accelerator="gpu", cuda_devices=0),
        "--trainer.accelerator=gpu, but this machine has no CUDA GPU: pass --trainer.accelerator=cpu",
    ),
    (
        RunPlan(accelerator="cuda", devices=4, cuda_devices=2),
        "--trainer.accelerator=cuda --trainer.devices=4, but this machine has 2 CUDA GPUs: pass"
        " --trainer.devices=2",
    ),
    (
        RunPlan(strategy="fsdp", cuda_devices=0),
        "--trainer.strategy=fsdp shards the model across CUDA GPUs, and this machine has none",
    ),
    (
        RunPlan(strategy="lightning.pytorch.strategies.FSDPStrategy", cuda_devices=0),
        "--trainer.strategy=lightning.pytorch.strategies.FSDPStrategy shards the model across CUDA GPUs",
    ),
]


@pytest.mark.parametrize(("plan", "line"), MACHINE)
def test_the_machine_rows_name_what_it_has(tmp_path: Path, plan: RunPlan, line: str) -> None:
    plan = replace(plan, root_dir=str(tmp_path))
    found = problems(plan)
    assert len(found) == 1 and found[0].startswith(line), found


def test_plans_that_fit_the_machine_have_no_problem(tmp_path: Path) -> None:
    fits = [
        RunPlan(accelerator="gpu", devices=2, cuda_devices=2),
        RunPlan(accelerator="gpu", devices=[0, 1], cuda_devices=2),
        RunPlan(strategy="fsdp", cuda_devices=1),
        RunPlan(accelerator="cpu", devices=8, strategy="ddp", cuda_devices=0),
        RunPlan(root_dir="s3://bucket/runs"),  # a remote store checks its own permissions
    ]
    for plan in fits:
        plan = plan if plan.root_dir.startswith("s3") else replace(plan, root_dir=str(tmp_path))
        assert problems(plan) == [], plan


# Command line → plan fields, read from the parsed config before anything is built.
FIELDS = [
    (["--trainer.devices=1"], {"accelerator": "cpu", "per_device_batch": 32, "global_batch": 32}),
    (
        ["--trainer.devices=2", "--trainer.strategy=ddp", "--trainer.accumulate_grad_batches=3"],
        {"device_count": 2, "strategy": "ddp", "global_batch": 2 * 32 * 3},
    ),
    (["--trainer.devices=auto"], {"device_count": None, "global_batch": None}),
    (["--trainer.logger=CSVLogger", "--trainer.logger.init_args.save_dir=csv"], {"logger_dirs": ("csv",)}),
]


@pytest.mark.parametrize(("args", "fields"), FIELDS)
def test_the_plan_reads_the_command_line(tmp_path: Path, monkeypatch, args: list[str], fields: dict) -> None:
    from lit_ddp.cli import build_cli

    monkeypatch.chdir(tmp_path)
    seen = _spy(monkeypatch)
    build_cli([*TINY_RUN, "--trainer.accelerator=cpu", *args], run=False)  # run=False: no subcommand
    plan = seen[0]
    assert {key: getattr(plan, key) for key in fields} == fields, plan


def test_every_row_has_a_case_in_the_table(tmp_path: Path) -> None:
    machine = {
        name
        for plan, _ in MACHINE
        for name, row in ROWS.items()
        if row(replace(plan, root_dir=str(tmp_path)))
    }
    assert machine | {row for row, _, _ in LINES} == set(ROWS)


def test_the_global_batch_counts_every_process_and_accumulated_batch() -> None:
    assert RunPlan(devices=[0, 1], num_nodes=2, per_device_batch=32).global_batch == 2 * 2 * 32
    assert RunPlan(devices="0,1,2", per_device_batch=8).device_count is None  # Lightning reads the text
    assert RunPlan(devices=-1, per_device_batch=8).global_batch is None  # every device: known once built
