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

import os
import re
import socket
from datetime import timedelta

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

LOOPBACK = ("127.0.0.1", "localhost")


# What each launcher sets in every process it starts: (name, world size, processes on this node, the
# launcher's own flags for those two). Read in this order; srun only inside a job step (SLURM_STEP_ID), since
# a batch script's own shell sees the allocation's SLURM_NTASKS too.
LAUNCHERS = (
    ("torchrun", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "--nnodes and --nproc_per_node"),
    ("mpirun", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "-np and -npernode"),  # Open MPI
    ("mpirun", "PMI_SIZE", "MPI_LOCALNRANKS", "-np and -ppn"),  # MPICH, Intel MPI
    ("srun", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE", "--nodes and --ntasks-per-node"),
)


def launcher_world(environ=None) -> tuple[str, int, int | None, str] | None:
    """(launcher, processes it started, of which on this node, its flags), or None without a launcher."""
    environ = os.environ if environ is None else environ
    for name, world, local, flags in LAUNCHERS:
        if world not in environ or (name == "srun" and "SLURM_STEP_ID" not in environ):
            continue
        if world == "WORLD_SIZE" and "TORCHELASTIC_RUN_ID" not in environ:
            name = "the launcher"  # another that sets torch's variables (or Lightning's own ranks > 0)
        try:
            # SLURM_NTASKS_PER_NODE may read "4(x2)": the count is what comes first.
            per_node = int(re.match(r"\d+", environ[local]).group()) if local in environ else None
            return name, int(environ[world]), per_node, flags
        except (ValueError, AttributeError):
            continue
    return None


def check_launcher_world(trainer: Trainer, environ=None) -> None:
    """UserError unless the processes a launcher (torchrun, srun, mpirun) started are this job's
    ``devices × num_nodes`` processes, which Lightning joins into one training.

    Lightning compares the two only when its strategy uses the launcher's cluster environment; otherwise
    (``--trainer.devices`` left out or 1, or mpirun without mpi4py) each process trains alone: N separate
    trainings writing into the same folder. A single srun task is let through: Lightning then starts the
    devices' processes itself. ``--trainer.num_nodes`` > 1 needs a launcher (or the variables of a manual
    start) on every node."""
    environ = os.environ if environ is None else environ
    found = launcher_world(environ)
    if found is None:
        # Lightning's own launcher starts the processes of one node only: the other nodes' must be started
        # there, with the rendezvous address and the node's rank (Lightning's "general cluster" recipe).
        # Without those, rank 0 waits for nodes that never come, then blames a stuck rank.
        manual = {"MASTER_ADDR", "NODE_RANK"} & set(environ)
        if trainer.num_nodes > 1 and not manual:
            raise UserError(
                f"--trainer.num_nodes={trainer.num_nodes}, but nothing started this job on"
                f" {trainer.num_nodes} nodes: launch it on every node with torchrun"
                f" (--nnodes={trainer.num_nodes}) or srun, or set MASTER_ADDR, MASTER_PORT and NODE_RANK on"
                " each node; on one machine leave --trainer.num_nodes out"
            )
        return
    name, world, per_node, flags = found
    if name == "srun" and (world == 1 or SLURMEnvironment.job_name() in ("bash", "interactive")):
        return  # one task (Lightning starts the devices' processes), or a shell (Lightning's rule too)
    env = getattr(trainer.strategy, "cluster_environment", None)
    wanted = trainer.num_devices * trainer.num_nodes
    devices = f"--trainer.devices={trainer.num_devices} × --trainer.num_nodes={trainer.num_nodes} = {wanted}"
    if world != wanted:
        nodes = world // per_node if per_node else None
        fix = f"--trainer.devices={per_node}" if per_node else "--trainer.devices"
        fix += f" --trainer.num_nodes={nodes}" if nodes and nodes != trainer.num_nodes else ""
        raise UserError(
            f"{name} started {world} processes but {devices}: make them equal ({fix}, or {name}'s {flags})"
            if name != "the launcher"
            else f"the launcher started {world} processes (WORLD_SIZE) but {devices}: make them equal ({fix})"
        )
    if world > 1 and not (env is not None and env.creates_processes_externally):
        hint = " (Lightning reads mpirun's world with mpi4py: pip install mpi4py)" if name == "mpirun" else ""
        raise UserError(
            f"{name} started {world} processes, but Lightning does not join them into one training{hint}:"
            f" start the job with torchrun or srun, or without {name} (--trainer.devices={wanted})"
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
