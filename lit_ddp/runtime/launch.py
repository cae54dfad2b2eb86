"""Launcher checks before any rank starts: the world agrees with --trainer.devices; rendezvous on loopback.

* Under torchrun, srun or mpirun the launcher decides the number of processes; Lightning compares it with
  ``devices × num_nodes`` only when its strategy takes the launcher's environment (else every process
  trains alone), and then once the ranks are running, with a traceback per rank. The same check here is
  one line, before training starts, with the flag to change.
* On one node, Lightning's launcher rendezvouses on ``MASTER_ADDR=127.0.0.1``, but torch's rendezvous server
  (the TCPStore that rank 0 hosts on ``MASTER_PORT``) listens on every interface: any host that can reach the
  machine could join or disturb the job. Rank 0 here opens that server itself on 127.0.0.1 only; torch's
  ``init_process_group`` then reuses it (TCPStore ``multi_tenant``). torchrun hosts its own store in the
  torchrun process, which this cannot reach: see the README for its flags.
"""

import hashlib
import os
import shutil
import socket
import tempfile
import uuid
from datetime import timedelta
from pathlib import Path

from lightning import Trainer
from lightning.fabric.plugins.environments import (
    LightningEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)
from lightning.pytorch.utilities import rank_zero_warn
from torch.distributed import TCPStore

from lit_ddp.compat import is_subprocess_launch
from lit_ddp.errors import UserError
from lit_ddp.preflight import launcher_mismatch, launcher_world
from lit_ddp.writes import WriteError, create_file, gone

LOOPBACK = ("127.0.0.1", "localhost")


def check_launcher_world(trainer: Trainer, environ=None) -> None:
    """UserError unless the processes a launcher (torchrun, srun, mpirun) started are this job's
    ``devices × num_nodes`` processes, which Lightning joins into one training.

    Preflight checks the counts where the config names the devices (``preflight.launcher_mismatch``); here
    they are checked again with the Trainer's own count (auto, -1), and what only the built strategy tells:
    whether Lightning joins the launcher's processes at all (not without mpi4py under mpirun: N separate
    trainings writing into the same folder) and whether the launcher's settings agree with it."""
    launcher = launcher_world(environ)
    if launcher is None or launcher.starts_devices:
        return
    mismatch = launcher_mismatch(launcher, trainer.num_devices, trainer.num_nodes)
    if mismatch is not None:
        raise UserError(mismatch)
    env = getattr(trainer.strategy, "cluster_environment", None)
    name, world = launcher.name, launcher.world
    if world > 1 and not (env is not None and env.creates_processes_externally):
        hint = " (Lightning reads mpirun's world with mpi4py: pip install mpi4py)" if name == "mpirun" else ""
        raise UserError(
            f"{name} started {world} processes, but Lightning does not join them into one training{hint}:"
            f" start the job with torchrun or srun, or without {name}"
            f" (--trainer.devices={trainer.num_devices * trainer.num_nodes})"
        )
    if isinstance(env, TorchElasticEnvironment | SLURMEnvironment):
        try:
            env.validate_settings(num_devices=trainer.num_devices, num_nodes=trainer.num_nodes)
        except ValueError as err:  # e.g. SLURM's --ntasks-per-node differs from --trainer.devices
            raise UserError(f"{name} and the trainer disagree: {err}") from err


def bind_rendezvous_to_loopback(trainer: Trainer, timeout_s: float) -> tuple[socket.socket, TCPStore] | None:
    """On a single node launched by Lightning, host rank 0's rendezvous store on 127.0.0.1 only. Returns
    the socket and store, which the caller keeps alive for the run (torch's process group joins the store
    on that port), or None where nothing was bound."""
    strategy = trainer.strategy
    env = getattr(strategy, "cluster_environment", None)
    if (
        not is_subprocess_launch(strategy)
        or type(env) is not LightningEnvironment
        or env.creates_processes_externally  # torchrun, or a rank > 0 that Lightning started
        or trainer.num_nodes != 1
        or trainer.num_devices < 2
        or env.main_address not in LOOPBACK
    ):
        return None
    port = env.main_port  # chosen now, and the same that the launcher will hand to the other ranks
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
        store = TCPStore(
            "127.0.0.1",
            port,
            is_master=True,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
            multi_tenant=True,
            master_listen_fd=sock.fileno(),
        )
    except (OSError, RuntimeError, TypeError) as err:  # a port taken meanwhile, or an older torch
        sock.close()
        rank_zero_warn(f"lit_ddp: rendezvous not bound to 127.0.0.1 ({err}); torch's default binding is used")
        return None
    return sock, store


# "<pid>-<uuid>" of the process that started the job: the ranks Lightning's launcher starts inherit it.
JOB_ENV = "LIT_DDP_JOB"


def _sibling_job(environ) -> str | None:
    """The job of a rank that a launcher started beside the others, each a child of the same process: the
    ranks of a node under torchrun (its agent) or of an ``srun`` step of several tasks (slurmstepd). Named
    after that parent and the start (a restart is another job); None for any other process."""
    if "TORCHELASTIC_RUN_ID" in environ:
        return f"{os.getppid()}-torchrun-{environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    tasks = environ.get("SLURM_NTASKS", "")
    if "SLURM_STEP_ID" in environ and tasks.isdigit() and int(tasks) > 1:
        return f"{os.getppid()}-srun-{environ['SLURM_STEP_ID']}-{environ.get('SLURM_RESTART_COUNT', '0')}"
    return None


def mark_job(environ=None) -> None:
    """Name the job this process belongs to (``main()``, once): a rank that Lightning's launcher started
    (LOCAL_RANK > 0, child of the process that named it) keeps its launcher's name; a rank of torchrun or
    of an srun step is named as its siblings are (``_sibling_job``); any other process, a doctor's or a
    test's subprocess included, names a job of its own."""
    environ = os.environ if environ is None else environ
    if (sibling := _sibling_job(environ)) is not None:
        environ[JOB_ENV] = sibling
        return
    inherited = environ.get(JOB_ENV, "").partition("-")[0]
    if environ.get("LOCAL_RANK", "0") in ("", "0") or inherited != str(os.getppid()):
        environ[JOB_ENV] = f"{os.getpid()}-{uuid.uuid4().hex}"


def first_to_say(line: str, environ=None) -> bool:
    """Whether no other rank of this node's job has said ``line`` yet, claiming it if not: a mistake every
    rank finds after the launch (the data, the schedule) is then one line, not one per rank. Outside a
    multi-process job (and where the claim cannot be made) every line is said. The claims of jobs whose
    first process has ended are removed here."""
    environ = os.environ if environ is None else environ
    job = environ.get(JOB_ENV)
    # LOCAL_RANK: set in every rank a launcher runs, its own included; srun's tasks have SLURM_PROCID.
    if not job or ("LOCAL_RANK" not in environ and _sibling_job(environ) is None):
        return True
    jobs = Path(tempfile.gettempdir()) / "lit_ddp-said"
    for claims in jobs.glob("*-*"):
        pid = claims.name.partition("-")[0]
        if pid.isdigit() and gone(int(pid)):
            shutil.rmtree(claims, ignore_errors=True)
    try:
        create_file(jobs / job / hashlib.sha1(line.encode()).hexdigest(), "", "a claim", elsewhere=None)
    except FileExistsError:
        return False
    except WriteError:  # the claim cannot be made: better said twice than not at all
        return True
    return True
