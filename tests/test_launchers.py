"""Launchers on CPU: torchrun, the sbatch templates under a simulated SLURM, rendezvous on loopback only."""

import os
import re
import shlex
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import (
    HELPERS,
    REPO,
    TINY_SHAPES,
    cli_env,
    forked_cli_server,
    read_scalars,
    run_dirs,
    run_python,
)

RUN = [
    *TINY_SHAPES,
    "--trainer.max_epochs=1",
    "--trainer.accelerator=cpu",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(
    cmd: list[str], cwd: Path, env: dict | None = None, timeout: float = 480
) -> subprocess.CompletedProcess:
    """A timeout is for a hang: on a 2-core machine other jobs load, a 2-process run takes minutes. A
    ``python`` command (lit_ddp's, torchrun's, fake_srun's) is forked as conftest.python forks it, with its
    first two ranks: they start without importing torch again."""
    if cmd[0] == sys.executable:
        return run_python(cmd[1:], cwd=cwd, env=cli_env(env), capture_output=True, text=True, timeout=timeout)
    return subprocess.run(cmd, cwd=cwd, env=cli_env(env), capture_output=True, text=True, timeout=timeout)


def torchrun(nproc: int) -> list[str]:
    # A fixed loopback rendezvous on a free port: tests running side by side must not share torchrun's 29500.
    port = free_port()
    return [
        *(sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"),
        *("--master_addr=127.0.0.1", f"--master_port={port}", "-m", "lit_ddp", "fit"),
    ]


@pytest.mark.ddp
@pytest.mark.timeout(600)
def test_torchrun_two_processes_train_and_write_once(tmp_path: Path) -> None:
    result = run([*torchrun(2), *RUN, "--trainer.devices=2"], cwd=tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    runs = run_dirs(tmp_path / "logs")
    assert len(runs) == 1 and (runs[0] / "checkpoints" / "last.ckpt").is_file()
    assert 0.0 <= read_scalars(runs[0])["val/acc"][-1] <= 1.0
    assert out.count("global batch = 32 per device × 2 devices") == 1
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in out


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(600)
def test_torchrun_preemption_at_an_epochs_last_batch_with_uneven_val_shards_stops_every_rank_cleanly(
    tmp_path: Path,
) -> None:
    """SIGTERM to rank 0 during batch 2 of 4 is agreed after batch 3, the epoch's last, which validation
    follows; 65 validation images are 2 batches on rank 0 and 1 on rank 1. Lightning alone stops a validation
    after the batch that sees the flag unless it is that rank's last: rank 0 then saved a checkpoint while
    rank 1 waited in the metric sync, and the job failed. Every rank finishes validation, then stops."""
    probe = ["--trainer.callbacks+=fault_probe.Fault", "--trainer.callbacks.action=sigterm"]
    probe += ["--trainer.callbacks.at_step=2", "--resilience.check_every_n_batches=1"]
    uneven = ["--data.val_size=65", "--trainer.max_epochs=2", "--trainer.devices=2"]
    env = {"PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests' / 'helpers'}"}
    result = run([*torchrun(2), *RUN, *uneven, *probe], cwd=tmp_path, env=env)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert "stopped by SIGTERM at the end of epoch 1, step 4" in out and "mid-epoch" not in out
    (last,) = tmp_path.glob("logs/lightning_logs/version_0/checkpoints/last.ckpt")
    assert torch.load(last, weights_only=True)["global_step"] == 4
    # The validation the stop followed ran to its end, on all 65 images, and was logged.
    scalars = read_scalars(last.parent.parent)
    assert len(scalars["val/acc"]) == 1 and round(scalars["val/acc"][0] * 65, 4).is_integer()


@pytest.mark.ddp
@pytest.mark.timeout(200)
def test_torchrun_world_and_devices_disagree_is_one_clear_error(tmp_path: Path) -> None:
    result = run([*torchrun(2), *RUN, "--trainer.devices=3"], cwd=tmp_path, timeout=180)
    assert result.returncode != 0
    line = "lit_ddp: error: torchrun started 2 processes but --trainer.devices=3 × --trainer.num_nodes=1 = 3"
    assert line in result.stderr
    assert "Initializing distributed" not in result.stdout + result.stderr  # before any rendezvous
    assert not (tmp_path / "logs").exists()


def render_sbatch(template: Path, nodes: int, tasks_per_node: int) -> tuple[str, dict[str, str]]:
    """The script with sample #SBATCH values, and the variables sbatch would set for that allocation."""
    text = template.read_text()
    text = re.sub(r"^#SBATCH --nodes=\d+", f"#SBATCH --nodes={nodes}", text, flags=re.M)
    text = re.sub(
        r"^#SBATCH --ntasks-per-node=\d+", f"#SBATCH --ntasks-per-node={tasks_per_node}", text, flags=re.M
    )
    text = re.sub(r"^#SBATCH --gpus-per-node=\d+\n", "", text, flags=re.M)  # this machine has none
    sbatch = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", text, flags=re.M))
    assert sbatch["signal"] == "SIGUSR1@90" and "#SBATCH --requeue" in text and "--ckpt_path=last" in text
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": sbatch["job-name"],
        "SLURM_NNODES": sbatch["nodes"],
        "SLURM_NTASKS_PER_NODE": sbatch["ntasks-per-node"],
        "SLURM_NODELIST": "127.0.0.1",  # Lightning's SLURMEnvironment: MASTER_ADDR = first host of the list
    }
    return text, env


def slurm_job(tmp_path: Path, template: str, nodes: int, per_node: int) -> tuple[Path, dict[str, str]]:
    """The rendered script, and an environment where ``srun`` and ``scontrol`` are local stand-ins."""
    text, env = render_sbatch(REPO / "scripts" / template, nodes, per_node)
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = [sys.executable, str(HELPERS / "fake_srun.py")]
    server = forked_cli_server()
    if server is not None:  # fake_srun forked with its first two tasks: they start without importing torch
        srun[1:1] = [str(HELPERS / "forked_cli.py"), "--client", server.path]
    stand_ins = {
        "srun": f'exec {shlex.join(srun)} "$@"',
        "scontrol": f'echo "$@" >> {tmp_path / "scontrol.log"}',  # records `requeue <job id>`
    }
    for name, body in stand_ins.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod((bin_dir / name).stat().st_mode | stat.S_IEXEC)
    env |= {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "CONFIG": str(REPO / "configs" / "lenet_shapes.yaml"),
        "MASTER_PORT": str(free_port()),
    }
    return script, env


@pytest.mark.ddp
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    # The single-node template runs in the SIGUSR1 test below.
    ("template", "nodes", "per_node"),
    [("sbatch_multi_node.sh", 2, 1)],
)
def test_sbatch_template_runs_under_simulated_slurm(
    tmp_path: Path, template: str, nodes: int, per_node: int
) -> None:
    """The script itself runs, with a stand-in srun that starts one process per task (2 in all)."""
    script, env = slurm_job(tmp_path, template, nodes, per_node)
    result = run(["bash", str(script), *RUN], cwd=tmp_path, env=env)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert out.count("global batch = 32 per device × 2 devices") == 1, out[-3000:]
    ranks = re.findall(r"Initializing distributed: GLOBAL_RANK: (\d), MEMBER: \d/2", out)
    assert sorted(ranks) == ["0", "1"]
    runs = run_dirs(tmp_path / "logs")
    assert len(runs) == 1 and (runs[0] / "checkpoints" / "last.ckpt").is_file()
    # --ckpt_path=last on the first start of a job: nothing to resume yet, so it starts fresh
    assert "resuming from" not in out


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(600)
@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
def test_shards_under_torchrun_and_slurm_train_the_model_of_lightnings_own_launch(
    tmp_path: Path, launcher: str, cifar_shards: Path, streaming_reference
) -> None:
    """StreamingDataModule takes its ranks from the trainer, whatever started the processes: torchrun's 2,
    or the multi-node sbatch template's 2 tasks on 2 (simulated) nodes, end with the weights of the same run
    that Lightning launched on 2 processes (streaming_reference(2))."""
    from streaming_runs import ARGS, CONFIG, PROCESSES, assert_same_weights, weights

    args = [*ARGS, f"--data.url={cifar_shards}", "--data.batch_size=32"]
    if launcher == "torchrun":
        cmd, env = [*torchrun(2), f"--config={CONFIG}", *args, *PROCESSES[2]], {}
    else:
        script, env = slurm_job(tmp_path, "sbatch_multi_node.sh", nodes=2, per_node=1)
        cmd, env["CONFIG"] = ["bash", str(script), *args], str(CONFIG)
    result = run(cmd, cwd=tmp_path, env=env, timeout=500)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert out.count("global batch = 32 per device × 2 devices") == 1, out[-3000:]
    assert sorted(re.findall(r"Initializing distributed: GLOBAL_RANK: (\d), MEMBER: \d/2", out)) == ["0", "1"]
    assert_same_weights(weights(tmp_path), weights(streaming_reference(2)), atol=1e-6)


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(900)
def test_sbatch_sigusr1_before_the_time_limit_checkpoints_requeues_and_the_next_start_resumes(
    tmp_path: Path,
) -> None:
    """SLURM's ``--signal=SIGUSR1@90`` mid-epoch → last.ckpt, ``scontrol requeue 4242``, exit 0; the requeued
    job (the same script, run again) continues from that step and finishes the run."""
    script, env = slurm_job(tmp_path, "sbatch_single_node.sh", 1, 2)
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{REPO / 'tests' / 'helpers'}"
    two_epochs = [*RUN, "--trainer.max_epochs=2"]  # 4 steps per epoch
    probe = ["--trainer.callbacks+=fault_probe.Fault", "--trainer.callbacks.action=sigusr1"]
    every_batch = "--resilience.check_every_n_batches=1"
    first = run(
        ["bash", str(script), *two_epochs, *probe, "--trainer.callbacks.at_step=5", every_batch],
        tmp_path,
        env,
    )
    out = first.stdout + first.stderr
    assert first.returncode == 0, out[-3000:]
    assert "stopped by SIGUSR1 at epoch 2, step 7" in out  # the batch after the signal
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]  # once, by rank 0

    requeued = run(["bash", str(script), *two_epochs], tmp_path, env)
    out = requeued.stdout + requeued.stderr
    assert requeued.returncode == 0, out[-3000:]
    (last,) = tmp_path.glob("logs/lenet_shapes/version_*/checkpoints/last.ckpt")  # $CONFIG's folder
    assert f"resuming from {last.relative_to(tmp_path)}" in out
    assert torch.load(last, weights_only=True)["global_step"] == 8
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]  # no second requeue


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(900)
def test_sbatch_sigusr1_during_set_up_stops_before_the_first_step_requeues_and_the_next_start_trains_it_all(
    tmp_path: Path,
) -> None:
    """SLURM's SIGUSR1 to one task while the job still set up (before the sanity check; Lightning's handler
    not yet in place) killed it by the default action: no checkpoint, no requeue. It is recorded from set-up
    on, as in the sanity check: every rank stops before the first step with last.ckpt, rank 0 requeues, exit
    0, and the requeued start trains the whole run."""
    script, env = slurm_job(tmp_path, "sbatch_single_node.sh", 1, 2)
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{REPO / 'tests' / 'helpers'}"
    two_epochs = [*RUN, "--trainer.max_epochs=2"]  # 4 steps per epoch
    probe = ["--trainer.callbacks+=fault_probe.Fault", "--trainer.callbacks.action=sigusr1"]
    probe += ["--trainer.callbacks.rank=1", "--trainer.callbacks.in_setup=true"]
    first = run(["bash", str(script), *two_epochs, *probe], tmp_path, env)
    out = first.stdout + first.stderr
    assert first.returncode == 0, out[-3000:]
    assert "lit_ddp: rank 1 received SIGUSR1: every rank stops at the next check, with last.ckpt" in out
    assert "lit_ddp: stopped by SIGUSR1 at the start of epoch 1, step 0: saved" in out, out[-3000:]
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]  # once, by rank 0
    (last,) = tmp_path.glob("logs/lenet_shapes/version_*/checkpoints/last.ckpt")
    assert torch.load(last, weights_only=True)["global_step"] == 0

    requeued = run(["bash", str(script), *two_epochs], tmp_path, env)
    out = requeued.stdout + requeued.stderr
    assert requeued.returncode == 0, out[-3000:]
    assert f"resuming from {last.relative_to(tmp_path)}" in out
    assert torch.load(last, weights_only=True)["global_step"] == 8


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(600)
def test_sbatch_sigusr1_after_the_last_epoch_says_the_fit_is_complete_and_does_not_requeue(
    tmp_path: Path,
) -> None:
    """SIGUSR1 as the run's last epoch ends (the time limit's warning came as it finished): the line said
    "stopped by SIGUSR1 at the end of epoch 2 ...: resume with --ckpt_path=last" and rank 0 requeued the
    job, whose next start found nothing to train. It says the fit is complete, and requeues nothing."""
    script, env = slurm_job(tmp_path, "sbatch_single_node.sh", 1, 2)
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{REPO / 'tests' / 'helpers'}"
    probe = ["--trainer.callbacks+=fault_probe.Fault", "--trainer.callbacks.action=sigusr1"]
    done = run(
        ["bash", str(script), *RUN, "--trainer.max_epochs=2", *probe, "--trainer.callbacks.at_epoch_end=1"],
        tmp_path,
        env,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "lit_ddp: SIGUSR1 came after the run's last training step, step 8: the fit is complete" in out
    assert "resume with --ckpt_path=last" not in out and "stopped by" not in out, out[-3000:]
    assert not (tmp_path / "scontrol.log").exists()  # no requeue: nothing is left to train
    (last,) = tmp_path.glob("logs/lenet_shapes/version_*/checkpoints/last.ckpt")
    assert torch.load(last, weights_only=True)["global_step"] == 8


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(500)
def test_single_node_rendezvous_listens_on_loopback_only(tmp_path: Path) -> None:
    """Every socket a 2-process ``ddp`` run listens on is bound to 127.0.0.1 (torch's store would use all)."""
    result = run(
        [
            sys.executable,
            "-m",
            "lit_ddp",
            "fit",
            *RUN,
            "--trainer.devices=2",
            "--trainer.strategy=ddp",
            "--trainer.callbacks+=fault_probe.Listening",
            f"--trainer.callbacks.out_dir={tmp_path / 'probe'}",
        ],
        cwd=tmp_path,
        env={"PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests' / 'helpers'}"},
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    listening = {p.name: p.read_text().split() for p in (tmp_path / "probe").glob("listen_rank*.txt")}
    assert sorted(listening) == ["listen_rank0.txt", "listen_rank1.txt"]
    addresses = [a for found in listening.values() for a in found]
    assert "0100007F" in listening["listen_rank0.txt"]  # rank 0 hosts the store: 127.0.0.1 (hex, as in /proc)
    loopback = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}
    assert set(addresses) <= loopback, addresses


@pytest.mark.ddp
@pytest.mark.timeout(200)
def test_torchrun_with_devices_left_out_is_one_clear_error_not_two_trainings(tmp_path: Path) -> None:
    """--trainer.devices left out is 1 on a CPU: Lightning took each of torchrun's processes as a job of its
    own (two trainings, two run folders)."""
    result = run([*torchrun(2), *RUN], cwd=tmp_path, timeout=180)
    assert result.returncode != 0
    line = "lit_ddp: error: torchrun started 2 processes but --trainer.devices=1 × --trainer.num_nodes=1 = 1"
    assert line + ": make them equal (--trainer.devices=2, or torchrun's" in result.stderr
    assert result.stderr.count(line) == 1, result.stderr[-3000:]  # said by one rank, not by each
    assert not (tmp_path / "logs").exists()


def two_nodes(args: list[str], cwds: list[Path], timeout: float = 240) -> list[subprocess.CompletedProcess]:
    """One torchrun per node, as on two machines: each in its own folder (a node's own disk), both on
    loopback. A timeout is for a hang."""
    port = free_port()
    nodes = [
        subprocess.Popen(
            [
                *(sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={rank}"),
                *("--nproc_per_node=1", "--master_addr=127.0.0.1", f"--master_port={port}"),
                *("-m", "lit_ddp", "fit", *args, "--trainer.num_nodes=2", "--trainer.devices=1"),
            ],
            cwd=cwd,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank, cwd in enumerate(cwds)
    ]
    try:
        outs = [node.communicate(timeout=timeout) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    return [
        subprocess.CompletedProcess(n.args, n.returncode, *out) for n, out in zip(nodes, outs, strict=True)
    ]


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(600)
def test_a_node_that_finds_no_run_to_resume_stops_the_job_with_one_line_instead_of_a_hang(
    tmp_path: Path,
) -> None:
    """Each node resolves --ckpt_path=last on its own disk: the node without the run folder started a new run
    while the other resumed, and both hung at the first collective they disagreed on."""
    first, second = tmp_path / "node0", tmp_path / "node1"
    first.mkdir()
    second.mkdir()
    trained = run([sys.executable, "-m", "lit_ddp", "fit", *RUN], cwd=first)
    assert trained.returncode == 0, trained.stderr[-3000:]
    last = first / "logs" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    before = last.read_bytes()

    args = [*RUN, "--trainer.max_epochs=2", "--ckpt_path=last", "--trainer.strategy=ddp"]
    nodes = two_nodes(args, [first, second])
    line = (
        "lit_ddp: error: --ckpt_path=last: the ranks found different checkpoints (rank 0 on"
        f" {socket.gethostname()}: logs/lightning_logs/version_0/checkpoints/last.ckpt; rank 1 on"
        f" {socket.gethostname()}: no checkpoint (a new run)): each node resolves --ckpt_path on its own"
        " filesystem, so every node must see the same run folder: put --trainer.default_root_dir"
    )
    for node in nodes:
        assert node.returncode != 0, node.stderr[-3000:]
        assert node.stderr.count(line) == 1, node.stderr[-3000:]  # each node's log says it once
    assert last.read_bytes() == before  # the run is as it was: nothing trained, nothing written over
    assert not list(second.iterdir())  # and node 1 left no new run behind


def test_the_line_for_ranks_that_disagree_groups_them_by_what_they_found() -> None:
    from lit_ddp.runtime.same_checkpoint import _describe

    last, stamp = "logs/r/version_3/checkpoints/last.ckpt", 1_796_000_000 * 10**9
    views = [(f"node-{'ab'[r // 8]}", last, (1234, stamp)) for r in range(8)]
    views += [(f"node-{r // 8}", None, None) for r in range(8, 32)]
    assert (
        _describe(views)
        == f"ranks 0-7 on node-a: {last}; ranks 8-31 on node-1 and 2 more hosts: no checkpoint (a new run)"
    )
    # One path, two files (each node's own older run): what tells them apart.
    views = [("a", last, (1234, stamp)), ("b", last, (999, stamp)), ("a", last, (1234, stamp))]
    described = _describe(views)
    assert described.startswith(f"ranks 0, 2 on a: {last} (1,234 bytes, modified 20")
    assert f"; rank 1 on b: {last} (999 bytes, modified 20" in described


def _trainer(devices: int = 1, num_nodes: int = 1, strategy: str = "auto"):
    from lightning import Trainer

    return Trainer(
        accelerator="cpu",
        devices=devices,
        num_nodes=num_nodes,
        strategy=strategy,
        logger=False,
        barebones=True,
    )


LAUNCHER_ENVIRONMENTS = {
    "torchrun": {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none", "RANK": "0"},
    "mpirun": {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"},
    "mpirun (MPICH)": {"PMI_SIZE": "2", "MPI_LOCALNRANKS": "2", "PMI_RANK": "0"},
    "srun": {"SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0"},
}


@pytest.mark.parametrize("launcher", list(LAUNCHER_ENVIRONMENTS))
def test_every_launchers_world_must_match_the_trainers_devices(
    launcher: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes started by the launcher and --trainer.devices=1: the check ran only when Lightning's
    strategy used the launcher's environment, which it does not for one device, so each process trained
    alone. (The trainer is built first: the check reads what each launcher sets, whatever Lightning chose.)"""
    from lit_ddp.errors import UserError
    from lit_ddp.runtime.launch import check_launcher_world

    trainer = _trainer(devices=1)
    for key, value in LAUNCHER_ENVIRONMENTS[launcher].items():
        monkeypatch.setenv(key, value)
    name = launcher.split()[0]
    with pytest.raises(UserError, match=rf"^{name} started 2 processes but --trainer.devices=1 × "):
        check_launcher_world(trainer)
    if launcher == "srun":  # one task is Lightning's own launch of the devices' processes; a shell is a shell
        monkeypatch.setenv("SLURM_JOB_NAME", "bash")
        check_launcher_world(trainer)
        monkeypatch.setenv("SLURM_JOB_NAME", "train")
        monkeypatch.setenv("SLURM_NTASKS", "1")
        check_launcher_world(trainer)


def test_mpirun_without_mpi4py_is_one_error_not_separate_trainings(monkeypatch: pytest.MonkeyPatch) -> None:
    from lit_ddp.errors import UserError
    from lit_ddp.runtime.launch import check_launcher_world

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    trainer = _trainer(devices=2, strategy="ddp")  # Lightning's own environment: it would start 2 more each
    for key, value in LAUNCHER_ENVIRONMENTS["mpirun"].items():
        monkeypatch.setenv(key, value)
    with pytest.raises(UserError, match="Lightning does not join them into one training.*pip install mpi4py"):
        check_launcher_world(trainer)


def test_several_nodes_without_a_launcher_is_one_line_not_a_600_s_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from lit_ddp.cli import main

    for key in ("MASTER_ADDR", "NODE_RANK", "GROUP_RANK", "WORLD_SIZE", "SLURM_NTASKS", "SLURM_STEP_ID"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(SystemExit) as stop:
        main(["fit", *RUN, "--trainer.num_nodes=2", f"--trainer.default_root_dir={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("lit_ddp: error: --trainer.num_nodes=2, but nothing started this job on 2 nodes")
    assert not (tmp_path / "lightning_logs").exists()


@pytest.mark.ddp
@pytest.mark.timeout(600)
@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_a_mistake_every_rank_finds_after_the_launch_is_one_line_not_one_per_rank(
    tmp_path: Path, strategy: str
) -> None:
    """The data's check fails in every rank: under ddp each printed the same line; under ddp_spawn the main
    process printed it once, after torch's log of each rank it terminated."""
    args = [*RUN, "--trainer.devices=2", f"--trainer.strategy={strategy}", "--data.batch_size=100000"]
    result = run([sys.executable, "-m", "lit_ddp", "fit", *args], cwd=tmp_path)
    lines = [line for line in result.stderr.splitlines() if line.startswith("lit_ddp: error:")]
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Terminating process" not in result.stderr, result.stderr[-3000:]
    assert lines == [
        "lit_ddp: error: --data.batch_size=100000 is more than the 128 training images on each of 2 devices:"
        " every step would take 128, not 100000 (the global batch and a scaled lr would be wrong): pass"
        " --data.batch_size=128 or less"
    ], result.stderr[-3000:]


@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_under_srun_a_mistake_every_task_finds_is_one_line_not_one_per_task(tmp_path: Path) -> None:
    """srun's tasks (children of one slurmstepd per node, with no LOCAL_RANK) each printed the data's line."""
    _, env = slurm_job(tmp_path, "sbatch_single_node.sh", nodes=1, per_node=2)
    srun = [sys.executable, str(REPO / "tests" / "helpers" / "fake_srun.py")]
    args = [*RUN, "--trainer.devices=2", "--data.batch_size=100000"]
    result = run([*srun, sys.executable, "-m", "lit_ddp", "fit", *args], cwd=tmp_path, env=env, timeout=280)
    lines = [line for line in result.stderr.splitlines() if line.startswith("lit_ddp: error:")]
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(lines) == 1 and "--data.batch_size=100000 is more than" in lines[0], result.stderr[-3000:]


@pytest.mark.timeout(90)
def test_python_without_srun_in_a_batch_script_is_one_line_not_a_wait_for_tasks_that_never_come(
    tmp_path: Path,
) -> None:
    """A batch script's own shell sees the allocation's SLURM_NTASKS (and no job step): Lightning took it for
    srun's task 0 of 2 and waited for task 1 until --dist_timeout. It names the missing srun instead."""
    _, env = slurm_job(tmp_path, "sbatch_single_node.sh", nodes=1, per_node=2)
    env |= {"SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
    cmd = [sys.executable, "-m", "lit_ddp", "fit", *RUN, "--trainer.devices=2", "--trainer.strategy=ddp"]
    result = run(cmd, cwd=tmp_path, env=env, timeout=60)
    lines = [line for line in result.stderr.splitlines() if line.startswith("lit_ddp: error:")]
    assert result.returncode == 2, result.stderr[-3000:]
    assert lines == [
        "lit_ddp: error: this process runs in the SLURM job's batch shell (SLURM_NTASKS=2, no srun step), so"
        " Lightning would take it for task 0 and wait for the others, which never start: put srun in front"
        " of python (srun python -m lit_ddp fit ...), as scripts/sbatch_single_node.sh does"
    ], result.stderr[-3000:]
    assert "Initializing distributed" not in result.stderr and not (tmp_path / "logs").exists()


@pytest.mark.timeout(90)
def test_srun_tasks_of_an_allocation_without_ntasks_per_node_are_one_line_not_a_traceback_per_task(
    tmp_path: Path,
) -> None:
    """``#SBATCH --ntasks=2`` (no --ntasks-per-node): every task printed Lightning's RuntimeError from the
    Trainer's construction as a traceback. One line names the #SBATCH settings to use instead."""
    _, env = slurm_job(tmp_path, "sbatch_single_node.sh", nodes=1, per_node=2)
    del env["SLURM_NTASKS_PER_NODE"]
    env |= {"SLURM_NTASKS": "2", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
    env["SLURM_NODEID"] = "0"
    cmd = [sys.executable, "-m", "lit_ddp", "fit", *RUN, "--trainer.devices=2", "--trainer.strategy=ddp"]
    result = run(cmd, cwd=tmp_path, env=env, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        "lit_ddp: error: srun started 2 tasks with no --ntasks-per-node (SLURM_NTASKS_PER_NODE is unset),"
        " which Lightning needs: ask for --nodes and --ntasks-per-node in place of --ntasks=2 (#SBATCH"
        " --nodes=1 --ntasks-per-node=2 for 2 tasks on one node)"
    ], result.stderr[-3000:]


def test_the_ranks_of_a_job_say_a_line_once_and_other_jobs_and_lines_are_said(
    tmp_path: Path, monkeypatch
) -> None:
    from lit_ddp.runtime.launch import JOB_ENV, first_to_say, mark_job

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    # The launcher's process names the job; a rank it started (its child, LOCAL_RANK > 0) keeps the name.
    launcher = {JOB_ENV: "1-stale"}
    mark_job(launcher)
    assert launcher[JOB_ENV].startswith(f"{os.getpid()}-") and launcher[JOB_ENV] != "1-stale"
    started = {JOB_ENV: f"{os.getppid()}-job", "LOCAL_RANK": "1"}  # as this process's parent had named it
    mark_job(started)
    assert started[JOB_ENV] == f"{os.getppid()}-job"
    # A rank whose name is not its parent's (another job's, a lit_ddp command's subprocess) names its own.
    other = {JOB_ENV: "1-another", "LOCAL_RANK": "1"}
    mark_job(other)
    assert other[JOB_ENV].startswith(f"{os.getpid()}-")
    # torchrun's ranks are siblings, children of its agent: one job for the agent's ranks, one per restart.
    workers = [{"TORCHELASTIC_RUN_ID": "none", "LOCAL_RANK": str(rank)} for rank in (0, 1)]
    workers.append({**workers[0], "TORCHELASTIC_RESTART_COUNT": "1"})
    for worker in workers:
        mark_job(worker)
    assert workers[0][JOB_ENV] == workers[1][JOB_ENV] != workers[2][JOB_ENV]
    assert workers[0][JOB_ENV].startswith(f"{os.getppid()}-")  # its claims go when the agent has ended
    # An srun step's tasks are siblings too (children of slurmstepd); a step of one task is a job alone.
    tasks = [{"SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_PROCID": str(rank)} for rank in (0, 1)]
    tasks += [{**tasks[0], "SLURM_RESTART_COUNT": "1"}, {**tasks[0], "SLURM_NTASKS": "1"}]
    for task in tasks:
        mark_job(task)
    assert tasks[0][JOB_ENV] == tasks[1][JOB_ENV] != tasks[2][JOB_ENV] != tasks[0][JOB_ENV]
    assert tasks[3][JOB_ENV].startswith(f"{os.getpid()}-")
    assert first_to_say("s", tasks[0]) and not first_to_say("s", tasks[1])

    ranks = [{JOB_ENV: f"{os.getpid()}-job", "LOCAL_RANK": str(rank)} for rank in (0, 1)]
    assert first_to_say("a", ranks[1]) and not first_to_say("a", ranks[0]) and first_to_say("b", ranks[0])
    assert first_to_say("a", {**ranks[0], JOB_ENV: f"{os.getpid()}-another"})  # another job says it too
    assert first_to_say("a", {JOB_ENV: f"{os.getpid()}-job"})  # one process: always
    # The claims of a job whose first process has ended go when another job claims a line.
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    gone = {JOB_ENV: f"{ended.stdout.strip()}-job", "LOCAL_RANK": "0"}
    assert first_to_say("a", gone) and (tmp_path / "lit_ddp-said" / gone[JOB_ENV]).is_dir()
    first_to_say("c", ranks[0])
    assert not (tmp_path / "lit_ddp-said" / gone[JOB_ENV]).exists()
