"""The automatic DataLoader worker count (data/workers.py): the CPUs each device's process has, less one, as
many as memory holds; no fixed cap."""

import os
from pathlib import Path

import pytest

from lit_ddp.data import workers
from lit_ddp.data.workers import WORKER_BYTES, auto_num_workers, available_cpus, available_memory

PLENTY = 1 << 50  # bytes: memory that bounds nothing


@pytest.fixture(autouse=True)
def not_under_slurm(monkeypatch) -> None:
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)


@pytest.mark.parametrize(
    ("cpus", "devices", "workers"),
    [
        (2, 2, 0),  # README's CPU DDP run: a worker per process would only compete with training
        (2, 1, 1),
        (1, 1, 0),
        (16, 1, 15),  # the H100 node of issue 30: 8 (the old cap) left the GPU waiting half the time
        (32, 8, 3),  # 4 cores per GPU: one for the training process, three decode
        (8, 8, 0),
        (96, 8, 11),
        (0, 0, 0),
    ],
)
def test_workers_follow_each_devices_share_of_the_cpus(cpus: int, devices: int, workers: int) -> None:
    assert auto_num_workers(cpus, devices, memory=PLENTY) == workers


def test_memory_bounds_the_workers_at_half_the_available_over_the_devices() -> None:
    # 8 GiB for 2 devices: half of it, 2 GiB each, holds 8 workers of 256 MiB.
    assert auto_num_workers(64, 2, memory=8 << 30, worker_bytes=256 << 20) == 8
    assert auto_num_workers(64, 2, memory=8 << 30, worker_bytes=1 << 30) == 2
    assert auto_num_workers(64, 1, memory=WORKER_BYTES, worker_bytes=WORKER_BYTES) == 0  # less than 2
    assert auto_num_workers(4, 1, memory=PLENTY) == 3  # memory never adds workers beyond the CPUs


def test_unknown_memory_bounds_nothing_and_none_reads_it(monkeypatch) -> None:
    monkeypatch.setattr(workers, "available_memory", lambda: None)
    assert auto_num_workers(16, 1) == 15
    monkeypatch.setattr(workers, "available_memory", lambda: 4 * WORKER_BYTES)
    assert auto_num_workers(16, 1) == 2


def test_a_launcher_that_gives_each_task_its_own_cpus_is_not_divided_again(monkeypatch) -> None:
    # srun --ntasks-per-node=8 --cpus-per-task=12: each rank's affinity mask holds its own 12 CPUs.
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "12")
    assert auto_num_workers(12, 8, memory=PLENTY) == 11
    # Not bound (each task sees the node's 96): shared over the devices as without SLURM.
    assert auto_num_workers(96, 8, memory=PLENTY) == 11


def test_this_machines_cpus_and_memory_are_read() -> None:
    assert 1 <= available_cpus() <= (os.cpu_count() or 1)
    memory = available_memory()
    if Path("/proc/meminfo").exists():
        total = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0]) * 1024
        assert memory is not None and 0 < memory <= total


def test_a_cgroup_cpu_quota_limits_the_cpus(monkeypatch, tmp_path) -> None:
    real_path = Path

    def fake_path(name: str) -> Path:
        return tmp_path / "cpu.max" if name == "/sys/fs/cgroup/cpu.max" else real_path(name)

    (tmp_path / "cpu.max").write_text("150000 100000\n")  # docker --cpus=1.5
    monkeypatch.setattr(workers, "Path", fake_path)
    assert available_cpus() == 1
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert available_cpus() == (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    )
