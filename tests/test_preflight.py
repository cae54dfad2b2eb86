"""The preflight table (lit_ddp/preflight/): a command line → the one line it gets before any Trainer or
process exists (exit 2, nothing written), or the plan field it gives. Rows that depend on the machine (its
CUDA devices) are checked on a plan with the machine given, so they hold on any test machine."""

import importlib.util
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import REPO, TINY_RUN
from torch import nn

from lit_ddp.callbacks import EMA
from lit_ddp.cli import main
from lit_ddp.models.arch_classifier import ArchClassifier
from lit_ddp.models.classifier import BATCH_OF_ONE, ImageClassifier
from lit_ddp.preflight import ROWS, Launcher, RunPlan, launcher_world, notes, problems
from lit_ddp.preflight.arguments import SUBCOMMANDS, argument_problems
from lit_ddp.preflight.checkpoint import packages_of, resumes_averages

# A project's model as a subclass that builds its network in its own constructor (OwnNetClassifier).
OWN_NET = "test_preflight.OwnNetClassifier"

# Command line → the start of the line it gets. Each case was a traceback or Lightning's own words once.
LINES = [
    ("devices", ["--trainer.devices=0"], "--trainer.devices=0 asks for no device: pass a count"),
    # Lightning raised a TypeError traceback for a value that is no count, list or auto.
    ("devices", ["--trainer.devices=abc"], "--trainer.devices=abc is not a number of devices: pass a count"),
    ("devices", ["--trainer.devices=-2"], "--trainer.devices=-2 is not a number of devices: pass a count"),
    # -1 on the CPU, on any machine: Lightning's TypeError traceback (`should be an int > 0`).
    (
        "devices",
        ["--trainer.accelerator=cpu", "--trainer.devices=-1"],
        "--trainer.devices=-1 means every GPU, and --trainer.accelerator=cpu runs on the CPU: pass a number"
        " of CPU processes (--trainer.devices=2 --trainer.strategy=ddp), or --trainer.devices=auto (one"
        " process)",
    ),
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
    # fit trained no batch and validated none, exited 0 and left an empty run folder.
    *(
        (
            "nothing_to_run",
            [f"--trainer.{option}"],
            f"--trainer.{said or option} leaves fit nothing to train",
        )
        for option, said in (
            ("limit_train_batches=0", None),
            ("limit_train_batches=0.0", None),
            ("max_epochs=0", None),
            ("max_steps=0", None),
            ("max_time=00:00:00:00", None),
            ("max_time={minutes: 0}", "max_time={'minutes': 0}"),
        )
    ),
    # validate, test and predict ran no batch, exited 0 and left an empty run folder.
    *(
        (
            "nothing_to_run",
            [command, "--ckpt_path=untrained", f"--trainer.{key}=0"],
            f"--trainer.{key}=0 leaves {command} no batch to {verb}: pass a number of batches",
        )
        for command, key, verb in (
            ("validate", "limit_val_batches", "score"),
            ("test", "limit_test_batches", "score"),
            ("predict", "limit_predict_batches", "predict"),
        )
    ),
    # Lightning divides by both: a ZeroDivisionError traceback at the first batch.
    (
        "validation_cadence",
        ["--trainer.check_val_every_n_epoch=0"],
        "--trainer.check_val_every_n_epoch=0 must be 1 or more (validate after every Nth training epoch), or",
    ),
    (
        "validation_cadence",
        ["--trainer.check_val_every_n_epoch=-2"],
        "--trainer.check_val_every_n_epoch=-2 must be 1 or more",
    ),
    (
        "validation_cadence",
        ["--trainer.val_check_interval=0"],
        "--trainer.val_check_interval=0 must be 1 or more (validate every N training batches), or a fraction",
    ),
    # A fraction of 0 validated after every batch, without a word.
    (
        "validation_cadence",
        ["--trainer.val_check_interval=0.0"],
        "--trainer.val_check_interval=0.0 is no fraction of an epoch (Lightning would validate after every",
    ),
    # torch's rendezvous timed out at once: a C++ traceback of 58 lines under ddp, exit 1.
    *(
        (
            "dist_timeout",
            [f"--dist_timeout={value}"],
            f"--dist_timeout={shown} must be a number of seconds above 0 (how long the start-up and each",
        )
        for value, shown in (("0", "0.0"), ("-5", "-5.0"))
    ),
    # Lightning's seed_everything raised its ValueError as a traceback.
    *(
        ("seed", [f"--seed_everything={seed}"], f"--seed_everything={seed} is outside 0..4294967295")
        for seed in (-1, 2**32)
    ),
    # Lightning's Timer named itself, not the option; a negative duration stopped the fit at once.
    *(
        ("max_time", [f"--trainer.max_time={value}"], f"--trainer.max_time={shown} is not a duration of 0 or")
        for value, shown in (("garbage", "garbage"), ("1:2:3", "1:2:3"), ("{hours: -1}", "{'hours': -1}"))
    ),
    # Lightning stopped at the maximum and dropped the minimum, with no word.
    (
        "minimum_above_maximum",
        ["--trainer.min_epochs=3", "--trainer.max_epochs=1"],
        "--trainer.min_epochs=3 is more than --trainer.max_epochs=1, where Lightning stops: pass a min_epochs"
        " of 1 or less, or a max_epochs of 3 or more",
    ),
    (
        "minimum_above_maximum",
        ["--trainer.min_steps=10", "--trainer.max_steps=2"],
        "--trainer.min_steps=10 is more than --trainer.max_steps=2, where Lightning stops",
    ),
    # Lightning took both without a word: no clipping at all, a log write after every step.
    (
        "negative_settings",
        ["--trainer.gradient_clip_val=-1"],
        "--trainer.gradient_clip_val=-1 is negative: Lightning then clips nothing (0 turns clipping off;",
    ),
    # Lightning clipped nothing, with no word: the algorithm alone does not turn clipping on.
    (
        "clip_algorithm",
        ["--trainer.gradient_clip_algorithm=value"],
        "--trainer.gradient_clip_algorithm=value clips nothing without --trainer.gradient_clip_val: pass the"
        " largest value kept (--trainer.gradient_clip_val=0.5), or leave the algorithm out",
    ),
    # Lightning's MisconfigurationException line, which named neither the option nor the fix.
    (
        "clip_algorithm",
        ["--trainer.gradient_clip_algorithm=nrom", "--trainer.gradient_clip_val=1"],
        "--trainer.gradient_clip_algorithm=nrom is not a clipping algorithm: pass one of value, norm, or"
        " leave it out to clip by norm",
    ),
    (
        "negative_settings",
        ["--trainer.log_every_n_steps=-5"],
        "--trainer.log_every_n_steps=-5 is negative: Lightning then logs after every step (0 turns step",
    ),
    (
        "run_dir",
        ["--trainer.default_root_dir=a_file/logs"],
        "--trainer.default_root_dir=a_file/logs cannot be",
    ),
    # predict scored every image, then failed at the last step naming --trainer.default_root_dir.
    (
        "predictions_file",
        ["predict", "--ckpt_path=untrained", "--predictions.filename=/dev/null/p.csv"],
        "could not write predictions /dev/null/p.csv (Not a directory): move away the file",
    ),
    # A logger's own folder as the run's: it was an OSError traceback from the logger's first write.
    (
        "logger_dir",
        ["--trainer.logger=CSVLogger", "--trainer.logger.init_args.save_dir=a_file/logs"],
        "--trainer.logger.init_args.save_dir=a_file/logs cannot be written",
    ),
    # A remote run folder without its store's package (s3fs, not a lit_ddp dependency) was an ImportError
    # traceback from the logger's creation.
    *(
        [
            (
                "run_dir",
                ["--trainer.default_root_dir=s3://bucket/runs"],
                "--trainer.default_root_dir=s3://bucket/runs needs the s3fs package, which is not installed:"
                " pip install s3fs",
            ),
            (
                "logger_dir",
                ["--trainer.logger=CSVLogger", "--trainer.logger.init_args.save_dir=s3://bucket/runs"],
                "--trainer.logger.init_args.save_dir=s3://bucket/runs needs the s3fs package",
            ),
        ]
        if importlib.util.find_spec("s3fs") is None
        else []
    ),
    # An unknown scheme was a 107-line traceback from the logger's creation (test_trackers: a server that does
    # not answer, which took minutes of MLflow's retries).
    *(
        [
            (
                "mlflow_store",
                ["--trainer.logger=MLFlowLogger", "--trainer.logger.init_args.tracking_uri=foo://bar"],
                "--trainer.logger.init_args.tracking_uri=foo://bar: MLflow has no tracking store",
            )
        ]
        if importlib.util.find_spec("mlflow")
        else []
    ),
    # validate and test scored the random initial weights, and predict labelled images with them, with no
    # word (a leading word is the subcommand).
    *(
        (
            "random_weights",
            [command],
            f"{command} with no --ckpt_path would score the model's random initial weights: pass"
            " --ckpt_path=PATH to a checkpoint (or last, the newest of this recipe's runs), or"
            " --ckpt_path=untrained to score them on purpose",
        )
        for command in ("validate", "test")
    ),
    (
        "random_weights",
        ["predict"],
        "predict with no --ckpt_path would label the images with the model's random initial weights: pass"
        " --ckpt_path=PATH to a checkpoint (or last, the newest of this recipe's runs), or"
        " --ckpt_path=untrained to predict with them on purpose",
    ),
    # A --ckpt_path that cannot be read is a line among the others (test_every_problem_is_a_line_of_its_own),
    # not the only one; test_faults has the file's other faults.
    (
        "checkpoint_file",
        ["validate", "--ckpt_path=a_file"],
        "checkpoint a_file is corrupt or truncated",
    ),
    # A relative path that does not exist names the folder it was read from (each row runs in tmp_path).
    (
        "checkpoint_file",
        ["validate", "--ckpt_path=no_such.ckpt"],
        "checkpoint no_such.ckpt (read from the current folder, as /",
    ),
    (
        "checkpoint_file",
        ["validate", "--ckpt_path=last"],
        "validate --ckpt_path=last: no last.ckpt from an earlier run under logs/lightning_logs (read from the"
        " current folder, as /",
    ),
    # A new fit into an earlier run's folder, its version given, wrote over its config.yaml and checkpoints.
    (
        "pinned_run",
        [
            "--trainer.logger=CSVLogger",
            "--trainer.logger.init_args.save_dir=held",
            "--trainer.logger.version=0",
        ],
        "--trainer.logger.init_args.version names held/lightning_logs/version_0, which holds an earlier run:"
        " a new fit would write over its config.yaml and checkpoints; resume that run with --ckpt_path=last,"
        " or give the logger another version, or none (--trainer.logger.init_args.version=null: a new run)",
    ),
    # ...and a fit from a file that does not go on in that run (here one outside any run, a URL)
    # trained its weights there, over that run's files alike.
    (
        "pinned_run",
        [
            "--trainer.logger=CSVLogger",
            "--trainer.logger.init_args.save_dir=held",
            "--trainer.logger.version=0",
            "--ckpt_path=https://example.org/model.ckpt",
        ],
        "--ckpt_path=https://example.org/model.ckpt starts a new run, and --trainer.logger.init_args.version"
        " names held/lightning_logs/version_0, which holds an earlier run: the fit would write over its"
        " config.yaml and checkpoints; give the logger a new version, or none"
        " (--trainer.logger.init_args.version=null: a new run from that checkpoint)",
    ),
    # A batch of one image per device through BatchNorm: BatchNorm's ValueError traceback at the first step
    # (the data module refused it later, once the Trainer was built); a network given by class and a named
    # architecture are read alike, and SyncBatchNorm on one process is still one image.
    *(
        ("batch_of_one", ["--data.batch_size=1", *model], BATCH_OF_ONE)
        for model in (
            ["--model.batch_norm=true"],
            ["--model=ImageClassifier", "--model.net=LeNet", "--model.net.batch_norm=true"],
            ["--model=ArchClassifier", "--model.arch=resnet18"],
            ["--model.batch_norm=true", "--trainer.sync_batchnorm=true", "--trainer.devices=1"],
            ["--model.batch_norm=true", "--trainer.devices=2", "--trainer.strategy=ddp"],
            [f"--model={OWN_NET}"],  # a subclass of your own that builds its network: read on the meta device
        )
    ),
    # Lightning raised a ValueError after start-up; lit_ddp's stop writes last.ckpt, not hpc_ckpt_N.ckpt.
    ("hpc_checkpoint", ["--ckpt_path=hpc"], "--ckpt_path=hpc: no hpc_ckpt_N.ckpt in "),
    # Resumed without the EMA preset, fit trained on from the averaged weights, with Lightning's warning only.
    (
        "checkpoint_average",
        ["--ckpt_path=ema.ckpt"],
        "ema.ckpt holds averaged weights (EMA) beside the raw ones, and this fit has no EMA callback to"
        " resume them: it would train on from the average, not from where the run stopped; resume with the"
        " EMA it was trained with (--config configs/presets/ema.yaml, or your recipe's)",
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
    torch.save(AVERAGED, tmp_path / "ema.ckpt")  # a run's checkpoint, as EMA writes it
    (held := tmp_path / "held" / "lightning_logs" / "version_0").mkdir(parents=True)
    (held / "config.yaml").write_text("seed_everything: 0\n")  # an earlier run's folder
    seen = _spy(monkeypatch)
    command, args = (
        (args[0], args[1:]) if args[:1] in (["validate"], ["test"], ["predict"]) else ("fit", args)
    )
    with pytest.raises(SystemExit) as stop:
        main([command, *TINY_RUN, *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(f"lit_ddp: error: {line}"), err[0]
    assert ROWS[row](seen[0]) == err[0].removeprefix("lit_ddp: error: ")
    assert not (tmp_path / "logs").exists()


def test_every_problem_is_a_line_of_its_own(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["--trainer.precision=64", "--trainer.accumulate_grad_batches=0", "--ckpt_path=no_such.ckpt"]
    with pytest.raises(SystemExit) as stop:
        main(["fit", *TINY_RUN, *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2
    assert [e.split("=")[0].split(" ")[:3] for e in err] == [
        ["lit_ddp:", "error:", "--trainer.accumulate_grad_batches"],
        ["lit_ddp:", "error:", "--trainer.precision"],
        ["lit_ddp:", "error:", "checkpoint"],
    ]


class _Checked(BaseException):
    """Raised by the spy once the plan is checked: a faked GPU's plan is not built."""


# -1 with accelerator auto, in each subcommand and from a YAML config: every GPU where there are some, and
# on a machine without one it was Lightning's TypeError traceback (`should be an int > 0`).
EVERY_GPU = [
    ["fit", "--trainer.devices=-1"],
    ["fit", "--trainer.devices", "-1"],
    ["fit", "--config=every_gpu.yaml"],  # devices: "-1", a text
    *(
        [command, "--ckpt_path=untrained", "--trainer.devices=-1"]
        for command in ("validate", "test", "predict")
    ),
]


@pytest.mark.parametrize("args", EVERY_GPU, ids=" ".join)
@pytest.mark.parametrize("gpus", [0, 2])
def test_devices_minus_one_is_every_gpu_and_one_line_without_one(
    tmp_path: Path, monkeypatch, capsys, args: list[str], gpus: int
) -> None:
    import torch

    monkeypatch.chdir(tmp_path)
    (tmp_path / "every_gpu.yaml").write_text('trainer:\n  devices: "-1"\n')
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    seen: list[tuple[object, int, list[str]]] = []

    def spy(plan: RunPlan) -> list[str]:
        seen.append((plan.devices, plan.cuda_devices, problems(plan)))
        if gpus:
            raise _Checked
        return seen[-1][2]

    monkeypatch.setattr("lit_ddp.cli.problems", spy)
    with pytest.raises(SystemExit if not gpus else _Checked) as stop:
        main([args[0], *TINY_RUN, *args[1:]])
    if gpus:  # Lightning's to count: every GPU
        assert [(str(devices), cuda, found) for devices, cuda, found in seen] == [("-1", 2, [])], seen
        return
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and err == [
        "lit_ddp: error: --trainer.devices=-1 means every GPU, and this machine has none: pass a number of"
        " CPU processes (--trainer.devices=2 --trainer.strategy=ddp), or --trainer.devices=auto (one process)"
    ], err
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize("accelerator", ["mps", "tpu"])
def test_devices_minus_one_on_apple_silicon_or_a_tpu_is_lightnings_to_count(
    tmp_path: Path, monkeypatch, accelerator: str
) -> None:
    # A Mac's (or a TPU VM's) --trainer.devices=-1 got the CPU's line ("this machine has none"), while
    # Lightning's auto runs it on MPS (or every TPU core).
    import torch
    from lightning.pytorch.accelerators import MPSAccelerator, XLAAccelerator

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(MPSAccelerator, "is_available", staticmethod(lambda: accelerator == "mps"))
    monkeypatch.setattr(XLAAccelerator, "is_available", staticmethod(lambda: accelerator == "tpu"))
    seen: list[tuple[object, str | None, list[str]]] = []

    def spy(plan: RunPlan) -> list[str]:
        seen.append((plan.devices, plan.other_accelerator, problems(plan)))
        raise _Checked

    monkeypatch.setattr("lit_ddp.cli.problems", spy)
    with pytest.raises(_Checked):
        main(["fit", *TINY_RUN, "--trainer.devices=-1"])
    assert [(str(devices), other, found) for devices, other, found in seen] == [("-1", accelerator, [])], seen


TORCHRUN = Launcher("torchrun", 2, 2, "--nnodes and --nproc_per_node")

# (plan, the start of its line) for the rows that read the machine or the launcher that started the process:
# given here, not this machine's or this process's.
MACHINE = [
    # Rank 0 waited 600 s for nodes nothing would start, then blamed a stuck rank.
    (
        RunPlan(num_nodes=2),
        "--trainer.num_nodes=2, but nothing started this job on 2 nodes: launch it on every node with"
        " torchrun (--nnodes=2) or srun, or set MASTER_ADDR, MASTER_PORT and NODE_RANK on each node",
    ),
    # Two processes that each trained alone into the same folder.
    (
        RunPlan(devices=1, launcher=TORCHRUN),
        "torchrun started 2 processes but --trainer.devices=1 × --trainer.num_nodes=1 = 1: make them equal"
        " (--trainer.devices=2, or torchrun's --nnodes and --nproc_per_node)",
    ),
    # python without srun in a batch script: Lightning took the shell for task 0 of 2 and waited for task 1.
    (
        RunPlan(devices=2, batch_shell_tasks=2),
        "this process runs in the SLURM job's batch shell (SLURM_NTASKS=2, no srun step), so Lightning would"
        " take it for task 0 and wait for the others, which never start: put srun in front of python (srun"
        " python -m lit_ddp fit ...), as scripts/sbatch_single_node.sh does",
    ),
    # Lightning's RuntimeError from the Trainer's construction, a traceback in every task.
    (
        RunPlan(devices=2, launcher=Launcher("srun", 2, None, "--nodes and --ntasks-per-node")),
        "srun started 2 tasks with no --ntasks-per-node (SLURM_NTASKS_PER_NODE is unset), which Lightning"
        " needs: ask for --nodes and --ntasks-per-node in place of --ntasks=2",
    ),
    (
        RunPlan(devices=2, num_nodes=2, launcher=Launcher("the launcher", 2, None, "")),
        "the launcher started 2 processes (WORLD_SIZE) but --trainer.devices=2 × --trainer.num_nodes=2 = 4:"
        " make them equal (--trainer.devices)",
    ),
    # Each of torchrun's processes would draw a seed of its own (lightning#18846): the CLI draws one only
    # where every rank can take it.
    (
        RunPlan(devices=2, launcher=TORCHRUN, seed_everything=True),
        "--seed_everything=true would draw a seed in each of the 2 processes torchrun started, and they would"
        " differ: pass one seed for all of them (--seed_everything=N)",
    ),
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
        RunPlan(devices=-1, cuda_devices=0),
        "--trainer.devices=-1 means every GPU, and this machine has none: pass a number of CPU processes",
    ),
    (  # a CPU run asked for, though the machine has MPS
        RunPlan(accelerator="cpu", devices=-1, other_accelerator="mps"),
        "--trainer.devices=-1 means every GPU, and --trainer.accelerator=cpu runs on the CPU",
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
        RunPlan(devices=-1, cuda_devices=2),  # every GPU
        RunPlan(devices=-1, other_accelerator="mps"),  # Apple silicon: Lightning's auto runs on MPS
        RunPlan(accelerator="cuda", devices="-1", cuda_devices=2),
        RunPlan(strategy="fsdp", cuda_devices=1),
        RunPlan(accelerator="cpu", devices=8, strategy="ddp", cuda_devices=0),
        RunPlan(root_dir="s3://bucket/runs"),  # a remote store checks its own permissions
        RunPlan(num_nodes=2, manual_start=True),  # MASTER_ADDR and NODE_RANK set on each node by hand
        RunPlan(devices=2, launcher=TORCHRUN),
        RunPlan(devices=2, launcher=TORCHRUN, seed_everything=7),
        RunPlan(devices="auto", launcher=TORCHRUN),  # Lightning's count: checked against the built Trainer
        RunPlan(devices=1, launcher=Launcher("srun", 1, 1, "", starts_devices=True)),  # Lightning starts them
        RunPlan(subcommand="validate", ckpt_path="untrained"),  # the weights as built, on purpose
        RunPlan(subcommand="test", loads_weights=True),  # --model.weights: a file's weights
        RunPlan(
            subcommand="predict", ckpt_path="last"
        ),  # refused later if no run has one (runtime/resume.py)
        RunPlan(subcommand="predict", ckpt_path="untrained"),
        RunPlan(ckpt_path="hpc", root_dir="s3://bucket/runs"),  # Lightning looks in a remote folder itself
        RunPlan(ckpt_path="hpc"),  # with hpc_ckpt_1.ckpt in the run's folder (below)
        RunPlan(min_epochs=2, max_epochs=2),
        RunPlan(min_epochs=5, max_epochs=-1, min_steps=100),  # -1: no maximum
    ]
    (tmp_path / "hpc_ckpt_1.ckpt").write_bytes(b"")
    # Without s3fs an s3:// folder has one line, the package's (LINES), and no other.
    remote = [] if importlib.util.find_spec("s3fs") else ["run_dir"]
    for plan in fits:
        remote_root = plan.root_dir.startswith("s3")
        plan = plan if remote_root else replace(plan, root_dir=str(tmp_path))
        found = [name for name, row in ROWS.items() if row(plan)]
        assert found == (remote if remote_root else []), plan


COMPOSED = "lit_ddp.models.ImageClassifier"
# Every form jsonargparse reads a class path from: a dict, YAML or JSON in a string, the path of a YAML file,
# a dotted key, a class under init_args, a list, in any argument.
FORMS = [
    ({"_class_path": COMPOSED, "net": {"class_path": "helpers.Net"}}, "helpers.Net", "net.class_path"),
    ({"_class_path": COMPOSED, "net.class_path": "helpers.Net"}, "helpers.Net", "net.class_path"),
    (
        {
            "_class_path": COMPOSED,
            "net": {"class_path": "lit_ddp.models.LeNet", "init_args": {"block": "class_path: helpers.Net"}},
        },
        "helpers.Net",
        "net.init_args.block.class_path",
    ),
    ({"optim": "class_path: helpers.Net"}, "helpers.Net", "optim.class_path"),
    ({"top_k": '[{"class_path": "helpers.Net"}]'}, "helpers.Net", "top_k[0].class_path"),
    ({"top_k": [1, "class_path: helpers.Net"]}, "helpers.Net", "top_k[1].class_path"),
]
WEIGHTS = {"state_dict": {}}  # torch.save({"state_dict": ...}), ModelCheckpoint(save_weights_only=True)
RUN = {"state_dict": {}, "pytorch-lightning_version": "2.6", "loops": {}, "optimizer_states": []}
# An EMA run's: the average as state_dict, the raw weights beside it (callbacks/ema.py)
AVERAGED = {**RUN, "current_model_state": {}, "averaging_state": {}, "callbacks": {"EMA": {}}}
THEIRS = {
    **RUN,
    "hyper_parameters": {"_class_path": "helpers.Net", "weights": "ResNet50_Weights.IMAGENET1K_V2"},
}

# (plan, a pattern its line matches from the start, or None for none) for the rows that read the --ckpt_path
# file, loaded as data: test_surface_checkpoint.py gives such files on the command line (nothing imported,
# nothing written).
CHECKPOINTS = [
    *[
        (RunPlan(ckpt_path="x.ckpt", checkpoint={**RUN, "hyper_parameters": hparams}), pattern)
        for hparams, named, key in FORMS
        for pattern in [rf"x.ckpt names {named} \(hyper_parameters.{re.escape(key)}\),"]
    ],
    # named by the command, it is the user's choice
    *[
        (RunPlan(ckpt_path="x.ckpt", checkpoint={**RUN, "hyper_parameters": h}, named=frozenset({n})), None)
        for h, n, _ in FORMS
    ],
    # A name the command gives is trusted on purpose; a dotted string that names no module is data.
    (RunPlan(ckpt_path="x.ckpt", checkpoint=THEIRS), ".*names helpers.Net"),
    (RunPlan(ckpt_path="x.ckpt", checkpoint=THEIRS, named=frozenset({"helpers.Net"})), None),
    # the project's own classes (the packages of main()'s default model and data)
    (
        RunPlan(
            ckpt_path="x.ckpt",
            checkpoint={
                **RUN,
                "hyper_parameters": {"_class_path": COMPOSED, "net": {"class_path": "proj.Net"}},
            },
            packages=frozenset(packages_of({"class_path": "proj.models.X"})),
        ),
        None,
    ),
    # weights only: fit started again at epoch 1 with no word, or a KeyError traceback
    (
        RunPlan(ckpt_path="w.pt", checkpoint=WEIGHTS, takes_weights=True),
        r".*: to train a new run from its weights, pass --model.weights=w.pt in",
    ),
    (
        RunPlan(subcommand="test", ckpt_path="w.pt", checkpoint=WEIGHTS, takes_weights=True),
        r".*: to test with its weights, pass --model.weights=w.pt and no --ckpt",
    ),
    (RunPlan(ckpt_path="last.ckpt", checkpoint=RUN, takes_weights=True), None),
    # an EMA run's resumed without its EMA: training went on from the average
    (RunPlan(ckpt_path="last.ckpt", checkpoint=AVERAGED), r"last.ckpt holds averaged weights \(EMA\) beside"),
    (
        RunPlan(ckpt_path="last.ckpt", checkpoint=AVERAGED, takes_weights=True),
        r".*, or train a new run from the average: --model.weights=last.ckpt in place of --ckpt_path$",
    ),
    (RunPlan(ckpt_path="last.ckpt", checkpoint=AVERAGED, averages=True), None),
    *(
        (RunPlan(subcommand=c, ckpt_path="x.ckpt", checkpoint=AVERAGED), None)
        for c in ("validate", "predict")
    ),
]


@pytest.mark.parametrize(("plan", "pattern"), CHECKPOINTS)
def test_the_checkpoint_rows_read_the_file_as_data(
    tmp_path: Path, monkeypatch, plan: RunPlan, pattern: str | None
) -> None:
    # A string naming a file is read from the working folder, as jsonargparse reads it.
    monkeypatch.chdir(tmp_path)
    found = problems(replace(plan, root_dir=str(tmp_path)))
    if pattern is None:
        assert found == [], found
    else:
        assert len(found) == 1 and re.match(pattern, found[0]), found


class OwnNetClassifier(ImageClassifier):
    """A project's model: a subclass that builds its network in its own constructor, without ``net``."""

    def __init__(self, num_classes: int = 10, batch_norm: bool = True, **kwargs) -> None:
        norm = nn.BatchNorm2d(4) if batch_norm else nn.Identity()
        net = nn.Sequential(
            nn.Conv2d(3, 4, 3), norm, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, num_classes)
        )
        super().__init__(net, num_classes=num_classes, **kwargs)


class UnbuildableClassifier(OwnNetClassifier):
    """A constructor that cannot run on the meta device: it reads a file that is not there."""

    def __init__(self, **kwargs) -> None:
        torch.load("no_such_weights.pt")
        super().__init__(**kwargs)


class FrozenBatchNormClassifier(OwnNetClassifier):
    """BatchNorm kept in eval mode by a model of its own, which says it trains on one image."""

    def batch_of_one_failure(self) -> str | None:
        return None


def test_a_subclass_that_builds_its_own_network_is_read_as_built_and_never_fails_the_reading() -> None:
    assert OwnNetClassifier.batch_norm_in({"batch_norm": True}) is True
    assert OwnNetClassifier.batch_norm_in({"batch_norm": False}) is False
    assert FrozenBatchNormClassifier.batch_norm_in({"batch_norm": True}) is False  # as the data module asks
    assert UnbuildableClassifier.batch_norm_in({}) is None  # the fit's own start says what fails
    assert ImageClassifier.batch_norm_in({}) is None  # no network: not a model to build


def test_a_named_architecture_that_cannot_be_built_on_the_meta_device_is_not_read() -> None:
    # regnet's constructor reads a tensor's values: the fit crashed in its preflight with a traceback.
    assert ArchClassifier.batch_norm_in({"arch": "regnet_x_400mf"}) is None
    assert ArchClassifier.batch_norm_in({"arch": "no_such_net"}) is None
    assert ArchClassifier.batch_norm_in({"arch": "resnet18"}) is True


class OwnEMA(EMA):
    """A user's EMA: it resumes the weight sets as lit_ddp's does."""


@pytest.mark.parametrize(
    ("callbacks", "averages"),
    [
        ([{"class_path": "lit_ddp.callbacks.EMA"}], True),
        ({"class_path": "lit_ddp.callbacks.ema.EMA", "init_args": {"decay": 0.9}}, True),  # one, not a list
        (
            [
                {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint"},
                {"class_path": "test_preflight.OwnEMA"},
            ],
            True,
        ),
        ([{"class_path": "lightning.pytorch.callbacks.EMAWeightAveraging"}], True),  # Lightning's layout too
        ([{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint"}], False),
        ([], False),
        (None, False),
    ],
)
def test_the_plan_knows_which_callbacks_resume_averaged_weights(callbacks, averages: bool) -> None:
    assert resumes_averages(callbacks) is averages


# Command line → plan fields, read from the parsed config before anything is built.
FIELDS = [
    (["--trainer.devices=1"], {"accelerator": "cpu", "per_device_batch": 32, "global_batch": 32}),
    (
        ["--trainer.devices=2", "--trainer.strategy=ddp", "--trainer.accumulate_grad_batches=3"],
        {"device_count": 2, "strategy": "ddp", "global_batch": 2 * 32 * 3},
    ),
    (["--trainer.devices=auto"], {"device_count": None, "global_batch": None}),
    # A frozen backbone's BatchNorm normalises with its frozen statistics: a batch of one image trains.
    (["--model=ArchClassifier", "--model.arch=resnet18"], {"batch_norm": True}),
    (
        ["--model=ArchClassifier", "--model.arch=resnet18", "--model.freeze_backbone=true"],
        {"batch_norm": False},
    ),
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


# Command line → the notes it is told once, before anything is built. Two processes of b images each with
# plain BatchNorm train another model than one process of 2b (docs/ddp.md): the fit said nothing of it.
PLAIN_BN = ["--model.batch_norm=true", "--data.batch_size=4", "--trainer.devices=2", "--trainer.strategy=ddp"]
SPLIT_BN = (
    "lit_ddp: note: BatchNorm normalises each device's 4 images alone, not the 8 of all 2 devices together as"
    " one process would: --trainer.sync_batchnorm=true normalises them together"
)
NOTES = [
    (PLAIN_BN, [SPLIT_BN]),
    (["--model=ArchClassifier", "--model.arch=resnet18", *PLAIN_BN[1:]], [SPLIT_BN]),
    (
        ["--model=ImageClassifier", "--model.net=LeNet", "--model.net.batch_norm=true", *PLAIN_BN[1:]],
        [SPLIT_BN],
    ),
    ([f"--model={OWN_NET}", *PLAIN_BN[1:]], [SPLIT_BN]),
    ([f"--model={OWN_NET}", "--model.batch_norm=false", *PLAIN_BN[1:]], []),
    (["--model.batch_norm=false", *PLAIN_BN[1:]], []),
    (["--model=ArchClassifier", "--model.arch=vit_b_16", *PLAIN_BN[1:]], []),  # LayerNorm: nothing per device
    ([*PLAIN_BN[:2], "--trainer.devices=1"], []),  # one process normalises them all
    ([*PLAIN_BN, "--trainer.sync_batchnorm=true"], []),
    # Per-device statistics chosen: on the command line, or in a recipe (resnet50_imagenet_modern.yaml's).
    ([*PLAIN_BN, "--trainer.sync_batchnorm=false"], []),
    (["--config=per_device.yaml", *PLAIN_BN], []),
]


class _Planned(BaseException):
    """Raised once the plan is made and told: nothing is built, and a recipe's data folder need not exist."""


def _built(*_) -> None:
    raise _Planned


@pytest.mark.parametrize(("args", "expected"), NOTES)
def test_the_notes_are_told_from_the_plan_before_anything_is_built(
    tmp_path: Path, monkeypatch, caplog, args: list[str], expected: list[str]
) -> None:
    from lit_ddp.cli import LitDDPCLI, build_cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "per_device.yaml").write_text("trainer:\n  sync_batchnorm: false  # per-device statistics\n")
    seen = _spy(monkeypatch)
    monkeypatch.setattr(LitDDPCLI, "instantiate_classes", _built)
    with caplog.at_level("INFO"), pytest.raises(_Planned):
        build_cli(["fit", *TINY_RUN, "--trainer.accelerator=cpu", *args])
    told = [m for m in caplog.messages if "BatchNorm normalises each device" in m]
    assert told == expected == [n for n in notes(seen[0]) if "BatchNorm" in n]


# devices auto or -1 on a machine with CUDA GPUs runs on every one of them, as Lightning counts them: the run
# of 4 devices was told nothing of its per-device BatchNorm. Another accelerator, or the CPU: Lightning's.
AUTO_WORLDS = [
    (RunPlan(devices="auto", cuda_devices=4), 4),
    (RunPlan(devices=-1, cuda_devices=4, num_nodes=2), 8),
    (RunPlan(accelerator="gpu", devices="-1", cuda_devices=4), 4),
    (RunPlan(accelerator="cuda", devices="auto", cuda_devices=1), 1),
    (RunPlan(devices="auto", cuda_devices=0), None),
    (RunPlan(accelerator="cpu", devices="auto", cuda_devices=4), None),
    (RunPlan(devices="auto", other_accelerator="tpu"), None),
    (RunPlan(accelerator="gpu", devices=-1, other_accelerator="mps"), None),
]


@pytest.mark.parametrize(("plan", "world"), AUTO_WORLDS)
def test_devices_auto_on_cuda_counts_every_gpu_for_the_batch_norm_rows(
    plan: RunPlan, world: int | None
) -> None:
    assert plan.world_size == world
    per_device = replace(plan, batch_norm=True, per_device_batch=4)
    noted = [n for n in notes(per_device) if "BatchNorm normalises each device's 4 images alone" in n]
    assert len(noted) == (1 if world and world > 1 else 0), noted
    # One image per device through SyncBatchNorm trains on several devices, not on one.
    synced = replace(per_device, per_device_batch=1, sync_batchnorm=True)
    assert (BATCH_OF_ONE in problems(synced)) is (world == 1)


@pytest.mark.parametrize(
    ("recipe", "noted"), [("resnet50_imagenet_modern", False), ("finetune_imagefolder", True)]
)
def test_a_recipe_that_chooses_per_device_batch_norm_is_not_told_of_it(
    monkeypatch, recipe: str, noted: bool
) -> None:
    """resnet50_imagenet_modern.yaml sets sync_batchnorm: false (torchvision's recipe normalises 128 images
    per GPU); finetune_imagefolder.yaml leaves it at the default, so 8 GPUs each normalise their own 64."""
    from lit_ddp.cli import build_cli

    seen: list[RunPlan] = []

    def spy(plan: RunPlan) -> list[str]:
        seen.append(plan)
        raise _Planned

    monkeypatch.setattr("lit_ddp.cli.problems", spy)
    with pytest.raises(_Planned):
        build_cli([f"--config={REPO / 'configs' / recipe}.yaml", "--trainer.devices=8"], run=False)
    assert (seen[0].sync_batchnorm, seen[0].batch_norm, seen[0].world_size) == (
        None if noted else False,
        True,
        8,
    )
    assert bool(notes(seen[0])) is noted


def test_the_plan_names_the_run_folder_after_the_recipe(tmp_path: Path, monkeypatch) -> None:
    from lit_ddp.cli import build_cli

    monkeypatch.chdir(tmp_path)
    recipe = tmp_path / "my_recipe.yaml"
    recipe.write_text("model:\n  class_path: lit_ddp.models.LeNetCIFAR\n")
    seen = _spy(monkeypatch)
    build_cli([f"--config={recipe}", *TINY_RUN], run=False)
    build_cli(TINY_RUN, run=False)
    assert [plan.experiment for plan in seen] == ["my_recipe", "lightning_logs"]


def test_every_row_has_a_case_in_the_table(tmp_path: Path) -> None:
    machine = {
        name
        for plan, _ in MACHINE
        for name, row in ROWS.items()
        if row(replace(plan, root_dir=str(tmp_path)))
    }
    files = {name for plan, _ in CHECKPOINTS for name, row in ROWS.items() if row(plan)}
    tables = machine | files | {row for row, _, _ in LINES}
    assert tables | ({"mlflow_store"} if importlib.util.find_spec("mlflow") is None else set()) == set(ROWS)


def test_the_global_batch_counts_every_process_and_accumulated_batch() -> None:
    assert RunPlan(devices=[0, 1], num_nodes=2, per_device_batch=32).global_batch == 2 * 2 * 32
    assert RunPlan(devices="0,1,2", per_device_batch=8).device_count is None  # Lightning reads the text
    assert RunPlan(devices=-1, per_device_batch=8).global_batch is None  # every device: known once built


# What each launcher sets in every process it starts (test_launchers.py starts them for real).
ENVIRONMENTS = [
    ({"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none"}, ("torchrun", 2, 2, False)),
    ({"WORLD_SIZE": "4"}, ("the launcher", 4, None, False)),  # torch's variables, not torchrun's
    ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, ("mpirun", 2, 2, False)),
    ({"PMI_SIZE": "2", "MPI_LOCALNRANKS": "2"}, ("mpirun", 2, 2, False)),
    ({"SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4(x2)", "SLURM_STEP_ID": "0"}, ("srun", 8, 4, False)),
    ({"SLURM_NTASKS": "1", "SLURM_STEP_ID": "0"}, ("srun", 1, None, True)),  # one task: Lightning's launch
    ({"SLURM_NTASKS": "2", "SLURM_STEP_ID": "0", "SLURM_JOB_NAME": "bash"}, ("srun", 2, None, True)),
    ({"SLURM_NTASKS": "2"}, None),  # a batch script's own shell, outside a job step
    ({}, None),
]


@pytest.mark.parametrize(("environ", "expected"), ENVIRONMENTS)
def test_the_plan_reads_the_launcher_from_the_environment(environ: dict, expected) -> None:
    found = launcher_world(environ)
    got = found and (found.name, found.world, found.per_node, found.starts_devices)
    assert got == expected
    assert RunPlan.of({}, cuda_devices=0, environ=environ).launcher == found
    assert RunPlan.of({}, cuda_devices=0, environ={"MASTER_ADDR": "10.0.0.1"}).manual_start


# ---- the command line and its files, before jsonargparse reads them (preflight/arguments.py) ------------

RECIPE = str(REPO / "configs" / "lenet_shapes.yaml")
OTHER_RECIPE = str(REPO / "configs" / "lenet_cifar.yaml")
DEBUG = str(REPO / "configs" / "presets" / "debug.yaml")
EMA = str(REPO / "configs" / "presets" / "ema.yaml")
ADDED = "--trainer.callbacks+=lightning.pytorch.callbacks.EarlyStopping"
LATER_WINS = "(later arguments override earlier ones)"
NUM_CLASSES = "would not be used: the data decides the number of classes (its dataset or class folders)"
# Files the cases name by key, written under tmp_path: a preset of the model's and the data's settings, a
# file setting num_classes, and nine levels of ten aliases (10^9 nodes: jsonargparse hung with no output).
FILES = {
    "bs.yaml": "data:\n  init_args:\n    batch_size: 16\nmodel:\n  init_args:\n    optim:\n      lr: 0.01\n",
    "c.yaml": "model:\n  init_args:\n    num_classes: 5\n",
    "twice.yaml": "trainer:\n  max_epochs: 1\n  log_every_n_steps: 5\n  max_epochs: 90\n",
    "empty.yaml": "",
    "comments.yaml": "# a recipe to write\n",
    "commented.yaml": "trainer:\n  # max_epochs: 3\nseed_everything: 1\n",
    "value.yaml": "seed_everything: 1\ntrainer: 5\n",
    "list.yaml": "trainer:\n- max_epochs\n",
    "top_list.yaml": "- trainer\n- model\n",
    "scalar.yaml": "max_epochs\n",
    "nested.yaml": "fit:\n  trainer:\n",
    "root.yaml": "fit:\n  trainer:\n    max_epochs: 1\n",
    "predict_dir.yaml": "data:\n  init_args:\n    predict_dir: imgs\n",
    "bomb.yaml": "\n".join(
        ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
        + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    ),
}

# Command line → the start of each line it gets. Each case ran something other than what was asked, once.
ARGUMENTS = [
    # `fit --trainer.max_epochs=1 --config configs/lenet_shapes.yaml` ran the recipe's 12 epochs.
    (
        ["--trainer.max_epochs=1", "--config", RECIPE],
        [
            f"--config {RECIPE} sets trainer.max_epochs after --trainer.max_epochs=1 did, and the later one"
            f" wins: put --trainer.max_epochs=1 after --config {RECIPE} {LATER_WINS}"
        ],
    ),
    # Spelled with a space, or through init_args, it is the same setting.
    (
        ["--model.init_args.batch_norm", "true", "--config", RECIPE],
        [f"--config {RECIPE} sets model.batch_norm after --model.init_args.batch_norm true"],
    ),
    # A preset's trainer.callbacks list replaced the list the option appended to: no EarlyStopping ran.
    (
        [ADDED, "--trainer.callbacks.monitor=val/loss", "--config", EMA],
        [
            f"--config {EMA} sets trainer.callbacks after {ADDED} did, and the later one wins: put {ADDED}"
            f" after --config {EMA} {LATER_WINS}"
        ],
    ),
    # An argument of an entry of that list is replaced with it.
    (
        ["--trainer.callbacks.decay=0.5", "--config", EMA],
        [f"--config {EMA} sets trainer.callbacks after --trainer.callbacks.decay=0.5 did"],
    ),
    # `--config presets/debug.yaml --config configs/lenet_cifar.yaml` ran the full recipe.
    (
        ["--config", DEBUG, "--config", RECIPE],
        [
            f"--config {RECIPE} sets trainer.max_epochs after {DEBUG} did, and the later one wins: give"
            f" --config {DEBUG} after --config {RECIPE}"
        ],
    ),
    # A preset of the model's or the data's settings is replaced by a recipe after it.
    (
        ["--config", "bs.yaml", "--config", RECIPE],
        [f"--config {RECIPE} sets data.batch_size after bs.yaml did, and the later one wins: give --config"],
    ),
    # Two recipes were refused in either order, each time advising the other order.
    *(
        (
            ["--config", first, "--config", second],
            [f"--config {second} sets data after {first} did, and the later one wins: {first} and {second}"],
        )
        for first, second in ((RECIPE, OTHER_RECIPE), (OTHER_RECIPE, RECIPE))
    ),
    # `--model.num_classes=5` was accepted and ignored: the data's 10 classes won.
    (["--model.num_classes=5"], [f"--model.num_classes=5 {NUM_CLASSES}"]),
    (["--config", "c.yaml"], [f"c.yaml: model.num_classes {NUM_CLASSES}"]),
    # Every line at once; a file too large to read is the only line (reading it further would hang).
    (
        ["--model.num_classes=5", "--trainer.max_epochs=1", "--config", RECIPE],
        [f"--config {RECIPE} sets trainer.max_epochs after", f"--model.num_classes=5 {NUM_CLASSES}"],
    ),
    (
        ["--model.num_classes=5", "--config", "bomb.yaml"],
        [
            "bomb.yaml expands to more than 100,000 YAML nodes (anchors and aliases repeated inside each"
            " other): it is not read; write the settings out plainly"
        ],
    ),
    # A duplicate key silently took the last value (90 epochs); an empty file was `Unexpected config: `.
    (["--config", "twice.yaml"], ["twice.yaml, line 4: 'max_epochs' is given already on line 2: keep one"]),
    (
        ["--config", "empty.yaml"],
        ["empty.yaml holds no settings (it is empty or only comments): put settings in it, or leave out"],
    ),
    (["--config", "comments.yaml"], ["comments.yaml holds no settings (it is empty or only comments)"]),
    # A list or a bare value where the settings go: jsonargparse's "Unexpected config: - trainer".
    (
        ["--config", "top_list.yaml"],
        ["top_list.yaml holds a list, not settings: a config maps keys to values (trainer:, model:, data:)"],
    ),
    (["--config", "scalar.yaml"], ["scalar.yaml holds the value max_epochs, not settings"]),
    # trainer's settings all commented out, a value, a list: an AttributeError traceback.
    (
        ["--config", "commented.yaml"],
        ["commented.yaml, line 1: trainer: holds no Trainer settings: write them on the lines below it"],
    ),
    (["--config", "value.yaml"], ["value.yaml, line 2: trainer: 5 holds no Trainer settings"]),
    (["--config", "list.yaml"], ["list.yaml, line 1: trainer: [max_epochs] holds no Trainer settings"]),
    (["--config", "nested.yaml"], ["nested.yaml, line 2: trainer: holds no Trainer settings"]),  # fit: {...}
    # A config of the root parser's (a command's settings under its name) after the command: jsonargparse's
    # "Group 'fit' does not accept option 'trainer.max_epochs'".
    (
        ["--config", "root.yaml"],
        [
            "--config root.yaml after fit holds fit at its top, as a config given before the command does:"
            " give it before the command (--config root.yaml fit), or write its settings at its top, not"
            " under fit:"
        ],
    ),
    # `test --data.predict_dir=DIR` scored the test split, not DIR, without a word: only predict reads it.
    (
        ["test", "--data.predict_dir=imgs"],
        [
            "--data.predict_dir=imgs would not be used: test scores the data's test split; only predict reads"
            " it (every image file under it, labelled into predictions.csv): run predict with it, or leave it"
            " out"
        ],
    ),
    (
        ["validate", "--data.init_args.predict_dir", "imgs"],
        ["--data.init_args.predict_dir imgs would not be used: validate scores the data's val split; only"],
    ),
    (["test", "--predictions.filename=p.csv"], ["--predictions.filename=p.csv would not be used: test"]),
    # predict's own; null asks for nothing; a recipe file serves every command.
    (["predict", "--data.predict_dir=imgs", "--predictions.filename=p.csv"], []),
    (["test", "--data.predict_dir=null", "--predictions=null"], []),
    (["test", "--config", "predict_dir.yaml"], []),
    # In the order that does what was asked: no line. A preset after a recipe adjusts it.
    (["--config", RECIPE, "--config", DEBUG, "--config", "bs.yaml", "--trainer.max_epochs=1"], []),
    (["--config", EMA, ADDED, "--trainer.callbacks.monitor=val/loss"], []),
]


@pytest.mark.parametrize(("argv", "starts"), ARGUMENTS)
def test_the_argument_rows_read_the_command_line_and_its_files(
    tmp_path: Path, monkeypatch, argv: list[str], starts: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    lines = argument_problems(argv if argv[0] in SUBCOMMANDS else ["fit", *argv])
    assert len(lines) == len(starts) and all(map(str.startswith, lines, starts)), lines
    assert all(LATER_WINS in line for line in lines if "later one wins" in line)
