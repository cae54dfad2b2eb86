"""How many DataLoader workers each device's process gets when ``num_workers`` is null: the CPUs and the
memory this process may use, as a container, a cgroup or a scheduler allots them (not the whole machine's).
"""

import os
from pathlib import Path


def available_cpus() -> int:
    """The CPUs this process may run on: a container's or a scheduler's allotment, not the whole machine's
    (``os.cpu_count()`` counts those): its affinity mask (Linux-only, hence the fallback), within a cgroup
    CPU quota where one is set (``docker --cpus``, a Kubernetes CPU limit), which the mask does not show."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:  # cgroup v2: "max 100000", or "<quota> <period>" in µs of CPU time per period
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cpus = min(cpus, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return cpus


def available_memory() -> int | None:
    """Bytes this process could still take: the kernel's estimate of available memory (``MemAvailable``),
    within a cgroup v2 memory limit where one is set; free pages where there is no /proc (other Unixes);
    None where none of these can be read."""
    try:
        meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        available = int(meminfo["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            available = min(available, int(limit) - used)
    except (OSError, ValueError):
        pass
    return max(available, 0)


# A worker of the ImageNet recipe (batch 256 of 224 px) at its peak: its private memory and its prefetched
# batches in shared memory (docs/gpu.md, benchmarks/bench_worker_memory_gpu.py). Workers may take half the
# available memory: the rest stays for the training process (pinned batches, checkpoints) and the page cache,
# which keeps the dataset's files.
WORKER_BYTES = 256 << 20
WORKER_MEMORY_SHARE = 0.5


def auto_num_workers(
    cpus: int, devices: int, memory: int | None = None, worker_bytes: int = WORKER_BYTES
) -> int:
    """DataLoader workers per device for ``num_workers=None``. Each device's process has its CPUs: an equal
    share of the ``cpus`` this process may use, or all of them where the launcher gave each device's process
    CPUs of its own (SLURM's ``--cpus-per-task``, which srun binds each task to). It keeps one core for
    itself (the training loop, feeding the GPU); the rest decode, as many as ``WORKER_MEMORY_SHARE`` of the
    ``memory`` (bytes; None: ``available_memory()``) shared over the devices holds at ``worker_bytes`` each.

    No fixed cap: a fast GPU takes every core a node gives it (docs/gpu.md: a ResNet-50 eats more images per
    second than a few workers decode). A share of one core or less gets 0 workers: a worker would only
    compete with its own main process (docs/benchmarks.md measures it on 2 cores)."""
    devices = max(devices, 1)
    own_cpus = os.environ.get("SLURM_CPUS_PER_TASK") == str(cpus)
    workers = (cpus if own_cpus else cpus // devices) - 1
    memory = available_memory() if memory is None else memory
    if memory is not None:
        workers = min(workers, int(memory * WORKER_MEMORY_SHARE / devices) // worker_bytes)
    return max(0, workers)
