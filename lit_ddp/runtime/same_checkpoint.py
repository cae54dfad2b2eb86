"""Every rank starts from the same checkpoint, or the run stops with one line saying which node differs.

Each process resolves ``--ckpt_path`` on its own (``last`` and ``best`` search the run folders; torchrun and
srun start one CLI per rank), and on a multi-node job each node searches its own filesystem. A node whose
disk does not hold the run (a node-local ``logs/``, a ``default_root_dir`` only one node mounts) found no
checkpoint and started a new run while the others resumed, and the job hung at their first disagreeing
collective. The ranks compare what they found once they can talk (``setup``), before any of them restores.
"""

import os
import socket
from datetime import datetime
from pathlib import Path

import torch.distributed as dist
from lightning import Callback, LightningModule, Trainer

from lit_ddp.errors import UserError

View = tuple[str | None, tuple | None]  # (the resolved path, what identifies that file on this rank)


def _identity(path: str | None) -> tuple | None:
    """Size and modification time: equal for one file read over a shared filesystem, and for copies made
    with their times kept (``rsync -a``), which hold the same bytes; different for another run's file."""
    if path is None:
        return None
    try:
        stat = os.stat(path)
    except (OSError, ValueError):  # a remote URL or Lightning's own lookup (``hpc``): named by its text
        return ("named", path)
    return (stat.st_size, stat.st_mtime_ns)


def _ranks(ranks: list[int]) -> str:
    """``rank 3``, ``ranks 0-7``, ``ranks 0-3, 8-11``."""
    spans: list[list[int]] = []
    for rank in ranks:
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)
    return f"rank{'s' if len(ranks) > 1 else ''} {text}"


def _describe(views: list[tuple[str, str | None, tuple | None]]) -> str:
    groups: dict[tuple | None, list[int]] = {}
    for rank, (_, _, identity) in enumerate(views):
        groups.setdefault(identity, []).append(rank)
    paths = [views[ranks[0]][1] for ranks in groups.values()]
    parts = []
    for identity, ranks in groups.items():
        hosts = sorted({views[rank][0] for rank in ranks})
        where = f" on {hosts[0]}" + (f" and {len(hosts) - 1} more hosts" if len(hosts) > 1 else "")
        path = views[ranks[0]][1]
        found = "no checkpoint (a new run)" if path is None else path
        if path is not None and paths.count(path) > 1 and identity and isinstance(identity[1], int):
            changed = datetime.fromtimestamp(identity[1] / 1e9).isoformat(sep=" ", timespec="seconds")
            found += f" ({identity[0]:,} bytes, modified {changed})"
        parts.append(f"{_ranks(ranks)}{where}: {found}")
    return "; ".join(parts)


class SameCheckpoint(Callback):
    """Compares the checkpoint each rank resolved (``starts_from``, set by the CLI before the run) over the
    ranks, at setup: one small all-gather per run, where there is more than one rank."""

    def __init__(self) -> None:
        self.given: str | None = None  # --ckpt_path as the user wrote it
        self.resolved: str | None = None  # the file this rank restores (None: a new run)

    def starts_from(self, given: str | None, resolved: str | Path | None) -> None:
        self.given, self.resolved = given, None if resolved is None else str(resolved)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if trainer.world_size < 2 or not (dist.is_available() and dist.is_initialized()):
            return
        mine = (socket.gethostname(), self.resolved, _identity(self.resolved))
        views: list = [None] * dist.get_world_size()
        dist.all_gather_object(views, mine)
        if len({identity for _, _, identity in views}) == 1:
            return
        raise UserError(
            f"--ckpt_path={self.given}: the ranks found different checkpoints ({_describe(views)}): each node"
            " resolves --ckpt_path on its own filesystem, so every node must see the same run folder: put"
            " --trainer.default_root_dir (or the logger's save_dir) on a filesystem every node mounts, or"
            " pass --ckpt_path=PATH to one file every node reads"
        )
