"""benchmarks/gpu_suite.sh's collection of issue 30's figures (collect_gpu_results.py), on fake part outputs:
what ran is read, what did not stays null, the best worker count is the measured one."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from collect_gpu_results import FIGURES, RATIOS, collect  # noqa: E402


def write(path: Path, figures: dict) -> None:
    path.write_text(json.dumps(figures))


def test_nothing_run_is_all_null(tmp_path: Path) -> None:
    result = collect(tmp_path)
    for key in [*FIGURES, *RATIOS, "jpeg_best_img_s", "jpeg_best_num_workers", "gpu_tests_passed"]:
        assert result[key] is None, key


def test_the_best_worker_count_and_the_ratios_come_from_what_ran(tmp_path: Path) -> None:
    write(tmp_path / "resnet50.json", {"lightning_img_s": 4000.0, "raw_img_s": 4010.0})
    write(
        tmp_path / "jpeg.json",
        {"jpeg_pipeline_img_s": 3800.0, "num_workers": 15, "jpeg_data_wait_share": 0.04},
    )
    write(tmp_path / "jpeg_workers_8.json", {"jpeg_pipeline_img_s": 2400.0, "num_workers": 8})
    write(tmp_path / "jpeg_workers_16.json", {"jpeg_pipeline_img_s": 3900.0, "num_workers": 16})
    write(tmp_path / "jpeg_workers_14.json", {"error": "timed out"})  # a part that failed: no figure
    result = collect(tmp_path)
    assert (result["jpeg_pipeline_img_s"], result["jpeg_num_workers"]) == (3800.0, 15.0)
    assert (result["jpeg_best_img_s"], result["jpeg_best_num_workers"]) == (3900.0, 16)
    assert result["jpeg_vs_on_device"] == 3800.0 / 4000.0
    assert result["gpu_decode_img_s"] is None and result["gpu_decode_vs_on_device"] is None
    assert result["worker_cost_mib"] is None and result["gpu_tests_passed"] is None


def test_a_ratio_without_the_on_device_figure_stays_null(tmp_path: Path) -> None:
    write(tmp_path / "gpu_decode.json", {"jpeg_pipeline_img_s": 3000.0, "jpeg_data_wait_share": 0.2})
    write(tmp_path / "gpu_decode_inline.json", {"jpeg_pipeline_img_s": 2000.0, "jpeg_data_wait_share": 0.5})
    write(tmp_path / "gpu_decode_shards.json", {"jpeg_pipeline_img_s": 3200.0, "step_ms": 80.0})
    result = collect(tmp_path)
    assert result["gpu_decode_img_s"] == 3000.0 and result["gpu_decode_vs_on_device"] is None
    assert result["gpu_decode_inline_img_s"] == 2000.0 and result["gpu_decode_inline_vs_on_device"] is None
    write(tmp_path / "resnet50.json", {"lightning_img_s": 4000.0})
    assert result["gpu_decode_shards_img_s"] == 3200.0 and result["gpu_decode_shards_vs_on_device"] is None
    assert result["gpu_decode_shards_step_ms"] == 80.0 and result["gpu_decode_shards_ms"] is None
    assert collect(tmp_path)["gpu_decode_inline_vs_on_device"] == 0.5
    assert collect(tmp_path)["gpu_decode_shards_vs_on_device"] == 0.8


def test_the_script_names_each_part_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    result = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu_suite.sh"), str(tmp_path), "nonsense"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "unknown part: nonsense" in result.stderr
    parts = (
        "setup",
        "tests",
        "lenet_cli",
        "lenet_compile",
        "lenet_cudagraphs",
        "lenet_graphed",
        "jpeg_workers",
        "gpu_decode",
    )
    parts += ("gpu_decode_inline", "gpu_decode_shards", "collect")
    for part in parts:
        assert part in result.stderr


@pytest.mark.slow
def test_the_tests_part_runs_the_cuda_tests_a_few_at_a_time_and_collect_reads_their_outcome(tmp_path) -> None:
    """Where torch sees no GPU every CUDA test is skipped: the part still runs them (in parallel where
    pytest-xdist is installed, as on the GPU images), and a skipped test does not count as passed."""
    out = tmp_path / "out"
    result = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu_suite.sh"), str(out), "tests", "collect"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "TEST_WORKERS": "2", "GPU_JSON": str(tmp_path / "gpu.json")},
        cwd=tmp_path,  # the script runs from its checkout, wherever it is started
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    log = (out / "cuda_tests.log").read_text()
    assert "2 workers" in log and " skipped" in log and (out / "cuda_tests.rc").read_text().strip() == "0"
    assert json.loads((tmp_path / "gpu.json").read_text())["gpu_tests_passed"] is False


def test_setup_unzips_the_wheels_it_was_brought_into_site_packages_or_says_what_is_missing(tmp_path) -> None:
    checkout = tmp_path / "checkout"
    (checkout / "benchmarks").mkdir(parents=True)
    (checkout / "benchmarks" / "gpu_suite.sh").write_text((REPO / "benchmarks" / "gpu_suite.sh").read_text())
    result = subprocess.run(
        ["bash", str(checkout / "benchmarks" / "gpu_suite.sh"), str(tmp_path / "out"), "setup"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "no wheels in .whl/" in result.stderr
