"""The GPU suite's plumbing, on CPU: what benchmarks/gpu_suite.sh records and how the headline figures are
collected. The GPU figures themselves come only from a GPU machine (docs/benchmarks.md). And the CPU
benchmarks that have no other test, run on a few steps."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import REPO, TINY_RUN, cli_env, run_python

from lit_ddp.data.codec import torchcodec_decoder

sys.path.insert(0, str(REPO / "benchmarks"))
from collect_gpu_results import collect  # noqa: E402


def test_collected_figures_are_read_never_filled_in(tmp_path: Path) -> None:
    (tmp_path / "versions.json").write_text(json.dumps({"device": "NVIDIA H100", "commit": "abc1234"}))
    (tmp_path / "resnet50.json").write_text(json.dumps({"raw_img_s": 3600.0, "lightning_img_s": 3540.5}))
    lenet = {"lenet_cifar_epoch_s": 0.8, "lenet_cifar_workers_epoch_s": {"1": 0.7, "2": None}}
    (tmp_path / "lenet.json").write_text(json.dumps(lenet))  # no tutorial figure; 2 workers failed
    decode = {"jpeg_pipeline_img_s": 3000.0, "step_ms": 85.3, "decode_ms": 41.0, "decode_device_ms": None}
    decode["decoder"] = "torchcodec 0.17.0"
    (tmp_path / "gpu_decode.json").write_text(json.dumps(decode))
    result = collect(tmp_path)
    assert (result["device"], result["commit"]) == ("NVIDIA H100", "abc1234")
    assert (result["resnet50_raw_img_s"], result["resnet50_lightning_img_s"]) == (3600.0, 3540.5)
    assert result["lenet_cifar_epoch_s"] == 0.8 and result["lenet_cifar_workers_epoch_s"] == {"1": 0.7}
    assert result["tutorial_lenet_epoch_s"] is None and result["jpeg_pipeline_img_s"] is None
    assert result["raw_lenet_epoch_s"] is None and result["lenet_cifar_compiled_epoch_s"] is None
    assert result["lightning_lenet_epoch_s"] is None
    assert (result["gpu_decode_step_ms"], result["gpu_decode_ms"]) == (85.3, 41.0)
    assert result["gpu_decode_decoder"] == "torchcodec 0.17.0"
    assert result["gpu_decode_device_ms"] is None and result["gpu_decode_inline_ms"] is None
    assert result["resnet50_compile_img_s"] is None and result["gpu_tests_passed"] is None  # not run


@pytest.mark.parametrize(
    "rc, summary, passed",
    [
        ("0", "==== 9 passed in 312.40s (0:05:12) ====", True),
        ("0", "==== 7 passed, 2 skipped in 200.1s ====", False),  # skipped tests did not run on the GPU
        ("0", "==== 9 skipped in 4.01s ====", False),
        ("1", "==== 1 failed, 8 passed in 300.0s ====", False),
    ],
)
def test_gpu_tests_count_as_passed_only_when_all_ran_and_passed(
    tmp_path: Path, rc: str, summary: str, passed: bool
) -> None:
    (tmp_path / "cuda_tests.rc").write_text(rc + "\n")
    (tmp_path / "cuda_tests.log").write_text(f"tests/test_cuda.py ....\n{summary}\n")
    assert collect(tmp_path)["gpu_tests_passed"] is passed


@pytest.mark.timeout(120)
def test_the_suite_records_versions_and_collects_on_a_machine_without_a_gpu(tmp_path: Path) -> None:
    out, gpu_json = tmp_path / "run", tmp_path / "gpu.json"
    result = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu_suite.sh"), str(out), "versions", "collect"],
        capture_output=True,
        text=True,
        timeout=110,
        env={**os.environ, "GPU_JSON": str(gpu_json)},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    versions = json.loads((out / "versions.json").read_text())
    assert versions["lightning"] and versions["torch"] and versions["commit"]
    collected = json.loads(gpu_json.read_text())
    assert collected["versions"] == versions and collected["gpu_tests_passed"] is None
    assert all(collected[key] is None for key in ("resnet50_lightning_img_s", "lenet_cifar_epoch_s"))
    assert collected["lenet_cifar_workers_epoch_s"] is None


STEP_OVERHEAD = [str(REPO / "benchmarks" / "bench_step_overhead.py")]
FEW_STEPS = ["--steps", "6", "--warmup", "2", "--procs", "1", "--rounds", "1"]


def _step_overhead(*args: str) -> str:
    """benchmarks/bench_step_overhead.py, shrunk: its standard output, after it exits 0."""
    out = run_python([*STEP_OVERHEAD, *args], capture_output=True, text=True, timeout=240, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


# The benchmark's three modes, a test each: each mode is a few fresh processes, and one test of all three
# outlived its 300 s on a 2-core machine that other jobs loaded.
@pytest.mark.slow
def test_the_step_overhead_benchmark_prints_its_side_by_side_table() -> None:
    """Its side-by-side table (1 process; lit_ddp's module alone and a left-out callback included)."""
    # `callbacks` itself runs as callbacks_without_resilience: every default callback but one.
    table = _step_overhead(*FEW_STEPS, "--variants", "bare", "module", "--without", "resilience")
    assert all(f"| 1 | {v} |" in table for v in ("bare", "module", "callbacks_without_resilience")), table


@pytest.mark.slow
def test_the_step_overhead_benchmark_prints_each_hooks_cost() -> None:
    hooks = _step_overhead(*FEW_STEPS, "--hook-costs")
    assert "| NanGuard.on_before_optimizer_step |" in hooks and "| all of them |" in hooks


@pytest.mark.slow
def test_the_step_overhead_benchmark_counts_the_ops_a_whole_step_dispatches() -> None:
    """--step-ops: a row per variant; lit_ddp's module and data path dispatch ops the bare step does not,
    and callbacks that do nothing dispatch none."""
    table = _step_overhead(
        "--step-ops", "--steps", "5", "--warmup", "2", "--variants", "bare", "lit_ddp", "empty_callbacks"
    )
    ops = {
        cells[1].strip(): float(cells[2])
        for cells in (line.split("|") for line in table.splitlines() if line.startswith("|"))
        if cells[1].strip() in ("bare", "lit_ddp", "empty_callbacks")
    }
    assert ops["empty_callbacks"] == ops["bare"] > 0 and ops["lit_ddp"] > ops["bare"], table


@pytest.mark.slow
def test_the_step_overhead_benchmark_counts_the_device_ops_of_the_data_path_and_the_checks() -> None:
    """The device-op counts: the data path, the accuracy update and the gradients' check."""
    table_rows = (
        line.split("|") for line in _step_overhead("--device-ops").splitlines() if line.startswith("|")
    )
    rows = {cells[1].strip(): cells[2:5] for cells in table_rows}
    after, before = (int(rows[label][1]) for label in ("after the copy", "before the copy"))
    assert before < after  # fewer device kernels when the draws are hashed on the host
    ours, theirs = (
        int(rows[f"{name}"][1]) for name in ("lit_ddp TopKAccuracy", "torchmetrics MulticlassAccuracy")
    )
    assert ours < theirs  # the accuracy's update launches fewer kernels than torchmetrics' stat scores
    checks = [label for label in rows if label.startswith(("torch get_total_norm, ", "lit_ddp NanGuard, "))]
    assert len(checks) == 4  # the gradients' check, torch's and the guard's, on two models' shapes


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_streaming_benchmark_records_every_variant_through_the_harness(tmp_path: Path) -> None:
    """benchmarks/bench_streaming.py on 30 images, one round: its JSON record is the harness's."""
    out = tmp_path / "streaming.json"
    script = [str(REPO / "benchmarks" / "bench_streaming.py")]
    args = ["--images", "30", "--rounds", "1", "--shard-mb", "0.05", "--out", str(out)]
    env = cli_env({"TMPDIR": str(tmp_path)})
    result = run_python([*script, *args], capture_output=True, text=True, timeout=280, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["command"] and record["machine"] and "commit" in record
    mosaic = {"mosaic"} if importlib.util.find_spec("streaming") else set()  # where it is installed
    assert set(record["summary"]) == {"folder", "shards_1proc", "shards_2proc", *mosaic}
    assert all(row["median"] > 0 and row["n"] == 1 for row in record["summary"].values())
    bytes_read = record["bytes_read_node0_per_epoch"]
    assert bytes_read["1"]["lit_ddp_order"] == bytes_read["1"]["dataset"]  # one node reads every shard


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_default_fit_benchmark_times_a_fresh_fit_and_records_its_outcome(tmp_path: Path) -> None:
    """benchmarks/bench_default_fit.py on a one-epoch, 64-image fit (not the 12-epoch default), one round:
    its JSON record holds the wall time, the run's val/acc by epoch and the load it ran under."""
    out = tmp_path / "default_fit.json"
    script = [
        str(REPO / "benchmarks" / "bench_default_fit.py"),
        "--rounds",
        "1",
        "--out",
        str(out),
    ]
    result = run_python([*script, *TINY_RUN], capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["command"] and record["machine"] and "commit" in record
    assert record["fit_args"] == TINY_RUN and record["summary"]["fit"]["n"] == 1
    assert record["summary"]["fit"]["median"] > 0 and len(record["load_average_1min"]) == 1
    ((acc,),) = record["val_acc_by_epoch"]  # one round, one epoch
    assert 0.0 <= acc <= 1.0


@pytest.mark.timeout(600)  # two runs of up to 240 s each
def test_the_gpu_profile_times_the_decode_stages_and_profiles_the_lenet_step_on_a_cpu(tmp_path: Path) -> None:
    run = [str(REPO / "benchmarks" / "profile_gpu.py")]
    env = cli_env()
    decode = [*run, "decode", "--device=cpu", "--images=24", "--batch-size=4", "--batches=2"]
    decode += ["--num-workers=1", f"--dir={tmp_path / 'jpegs'}", f"--json={tmp_path / 'decode.json'}"]
    result = run_python(decode, cwd=tmp_path, env=env, timeout=240, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    stages = json.loads((tmp_path / "decode.json").read_text())["ms_per_batch"]
    assert set(stages) == {"load", "nvjpeg", "decode", "crop", "crop_each"}
    assert all(stages[k] > 0 for k in ("load", "nvjpeg", "decode", "crop_each"))
    assert stages["crop"] == pytest.approx(stages["decode"] - stages["nvjpeg"])
    for side in ("lit_ddp", "floor"):
        lenet = [*run, "lenet", f"--side={side}", "--device=cpu", "--warmup=2", "--steps=3", "--batch-size=8"]
        lenet += [f"--json={tmp_path / side}.json", f"--table={tmp_path / side}.txt"]
        result = run_python(lenet, cwd=tmp_path, env=env, timeout=240, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-3000:]
        step = json.loads((tmp_path / f"{side}.json").read_text())
        assert step["side"] == side and step["ms_per_step"] > 0 and step["host_self_ms_per_step"] > 0
        # No device kernels on a CPU, so the device is never busy.
        assert step["kernels_per_step"] == 0 and step["device_busy_ms_per_step"] == 0
        assert "aten::convolution_backward" in (tmp_path / f"{side}.txt").read_text()


def test_the_profiles_device_busy_time_counts_overlapping_kernels_once() -> None:
    from profile_gpu import busy_us

    span = lambda start, end: SimpleNamespace(time_range=SimpleNamespace(start=start, end=end))  # noqa: E731
    # [0, 10) and [5, 12) overlap on two streams; [20, 25) alone; [21, 22) inside it.
    kernels = [span(20, 25), span(0, 10), span(21, 22), span(5, 12)]
    assert busy_us(kernels) == 12 + 5
    assert busy_us([]) == 0


def test_the_profiles_device_work_leaves_out_annotations_spanning_the_step() -> None:
    from profile_gpu import device_work

    cuda, cpu = SimpleNamespace(name="CUDA"), SimpleNamespace(name="CPU")
    event = lambda device, annotation: SimpleNamespace(device_type=device, is_user_annotation=annotation)  # noqa: E731
    kernel, annotation, host_op = event(cuda, False), event(cuda, True), event(cpu, False)
    assert device_work([kernel, annotation, host_op]) == [kernel]


@pytest.mark.parametrize("compile", [None, pytest.param("reduce-overhead", marks=pytest.mark.slow)])
def test_the_lenet_gpu_benchmark_times_lit_ddp_the_floors_and_the_tutorial_on_a_cpu(
    tmp_path: Path, compile: str | None
) -> None:
    """benchmarks/bench_lenet_gpu.py (the suite's lenet part), one round of 2 batches: every side's epoch
    (the floor without a framework and inside Lightning's loop too), and no compiled figure unless asked
    (null, never filled in); asked with a mode (the lenet_cudagraphs part), lit_ddp compiled in it. Without
    compile, lit_ddp with one DataLoader worker too (``--workers 1``)."""
    out = tmp_path / "lenet.json"
    script = [str(REPO / "benchmarks" / "bench_lenet_gpu.py"), "--device=cpu"]
    script += ["--train-size=256", "--rounds=1", "--tutorial-workers=0", f"--json={out}"]
    script += [f"--compile={compile}"] if compile else ["--workers", "1"]
    result = run_python(script, cwd=tmp_path, env=cli_env(), timeout=300, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(out.read_text())
    sides = ("lenet_cifar_epoch_s", "lenet_cifar_eager_epoch_s", "tutorial_lenet_epoch_s")
    assert all(record[key] > 0 for key in (*sides, "raw_lenet_epoch_s", "lightning_lenet_epoch_s"))
    assert set(record["samples"]) == {"lit_ddp", "lit_ddp_eager", "tutorial", "raw", "lightning"} | (
        {"lit_ddp_compiled"} if compile else {"lit_ddp_workers_1"}
    )
    assert list(record["lenet_cifar_workers_epoch_s"]) == ([] if compile else ["1"])
    assert all(seconds > 0 for seconds in record["lenet_cifar_workers_epoch_s"].values())
    if compile:
        assert record["lenet_cifar_compiled_epoch_s"] > 0 and record["settings"]["compile"] == compile
    else:
        assert record["lenet_cifar_compiled_epoch_s"] is None
    # The whole step as one CUDA graph only where asked, on a CUDA device: null here, never filled in.
    graphed = ("raw_graphed_lenet_epoch_s", "lightning_graphed_lenet_epoch_s")
    assert all(record[key] is None for key in graphed)


def test_the_lenet_gpu_benchmarks_graphed_sides_refuse_a_device_without_cuda_graphs() -> None:
    script = [str(REPO / "benchmarks" / "bench_lenet_gpu.py"), "--device=cpu", "--graphed"]
    result = run_python(script, env=cli_env(), timeout=120, capture_output=True, text=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .endswith("--graphed captures CUDA graphs: it needs a CUDA device, not --device=cpu")
    )


def test_the_floors_graphed_sides_run_their_step_eagerly_on_a_cpu() -> None:
    """bench_lenet_gpu's raw_graphed and lightning_graphed sides off CUDA: ``GraphedStep`` runs the step it
    would capture eagerly, so the sides' plumbing (static index, Lightning's manual optimisation, the time
    scaled from full batches) is run here before a GPU captures it."""
    import torch
    from bench_lenet_gpu import cifar_shaped, lightning_graphed_epoch, raw_graphed_epoch, read_recipe

    args = SimpleNamespace(precision="32-true", batch_size=32)
    data = cifar_shaped(100)
    for side in (raw_graphed_epoch, lightning_graphed_epoch):
        assert side(args, read_recipe(), data, torch.device("cpu")) > 0


def test_a_graphed_side_that_fails_is_named_and_left_null_and_the_others_still_count(capsys) -> None:
    import math

    from bench_lenet_gpu import guarded, shortest

    failing = guarded("raw_graphed", lambda: 1 / 0)
    assert math.isnan(failing()) and shortest([1.25, math.nan, 1.5]) == 1.25
    assert shortest([math.nan, math.nan]) is None  # what the JSON then holds: null
    err = capsys.readouterr().err
    assert "ZeroDivisionError" in err
    assert err.strip().splitlines()[-1] == (
        "bench_lenet_gpu: side raw_graphed failed (above); its figure is left null"
    )


@pytest.mark.parametrize(
    "ahead, shards, profile",
    [(True, False, False), (False, False, False), (True, True, False), (True, False, True)],
)
def test_the_jpeg_benchmark_decodes_on_the_device_ahead_or_in_the_loop_on_a_cpu(
    tmp_path: Path, ahead: bool, shards: bool, profile: bool
) -> None:
    """benchmarks/bench_jpeg_gpu.py --gpu-decode (the suite's gpu_decode, gpu_decode_inline,
    gpu_decode_shards and gpu_decode_profile parts) on a few small JPEGs: the figure, which of them it
    measured, and the decode's own time beside the step's (on a CPU, no device span). With --shards, the
    images are read from the shards written beside them (DIR-shards). With --profile-steps, the profiled
    steps' summary: on a CPU, no device events, the host's operators only."""
    out = tmp_path / "jpeg.json"
    script = [str(REPO / "benchmarks" / "bench_jpeg_gpu.py"), "--device=cpu", "--gpu-decode"]
    script += ["--images=32", "--width=64", "--height=48", "--batch-size=8", "--image-size=32"]
    script += ["--arch=resnet18", "--num-classes=10", "--num-workers=1", "--warmup=1", "--steps=2"]
    script += [f"--dir={tmp_path / 'jpegs'}", f"--json={out}", *([] if ahead else ["--no-decode-ahead"])]
    script += ["--shards"] if shards else []
    script += ["--profile-steps=2", f"--trace={tmp_path / 'trace.json'}"] if profile else []
    result = run_python(script, cwd=tmp_path, env=cli_env(), timeout=240, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["decode_ahead"] is ahead and record["gpu_decode"] is True
    assert record["source"] == ("shards" if shards else "folder")
    assert (tmp_path / "jpegs-shards" / "lit_ddp.json").is_file() is shards
    assert record["jpeg_pipeline_img_s"] > 0 and 0 <= record["jpeg_data_wait_share"] <= 1
    assert record["step_ms"] > 0 and record["decode_ms"] > 0 and record["decode_device_ms"] is None
    assert record["decoder"].split()[0] == ("torchcodec" if torchcodec_decoder() else "torchvision")
    if not profile:
        assert record["profile"] is None and "profiled" not in result.stdout
        return
    summary = record["profile"]
    assert summary["steps"] == 2 and summary["ms_per_step"] > 0 and summary["host_ops_ms_per_step"] > 0
    assert summary["top_host_ops"] and summary["device_busy_ms_per_step"] is None
    assert summary["decode"] is None and summary["top_kernels"] == [] and summary["streams"] == {}
    assert "no device events" in result.stdout and (tmp_path / "trace.json").is_file()


def fake_event(name: str, device: str, id: int, resource: int, start: float = 0.0, end: float = 0.0):
    interval = SimpleNamespace(start=start, end=end, elapsed_us=lambda: end - start)
    return SimpleNamespace(
        name=name, device_type=SimpleNamespace(name=device), id=id, device_resource_id=resource,
        time_range=interval, is_user_annotation=False, self_cpu_time_total=1000.0,
    )  # fmt: skip


def test_the_jpeg_benchmarks_profile_tells_the_decodes_stream_by_the_thread_that_launched_its_kernels() -> (
    None
):
    """What a CUDA profile holds, faked: kernels on two streams, each with the runtime call that launched
    it (same correlation id; the call's resource id is its thread). The decode thread's stream is the
    decode's; its kernels are grouped by name; the overlap is what both streams ran at once."""
    from bench_jpeg_gpu import profile_summary

    events = [
        fake_event("aten::conv2d", "CPU", 1, 100),
        fake_event("cudaLaunchKernel", "CPU", 11, 100),  # the training thread (native id 100)
        fake_event("cudaLaunchKernel", "CPU", 12, 200),  # the decode thread (200)
        fake_event("cudaLaunchKernel", "CPU", 13, 200),
        fake_event("sm90_xmma_fprop_implicit_gemm", "CUDA", 11, 7, 0.0, 4000.0),
        fake_event("nvjpeg::decode_huffman_kernel", "CUDA", 12, 21, 1000.0, 2000.0),
        fake_event("upsample_bilinear2d_aa_out_frame", "CUDA", 13, 21, 5000.0, 6000.0),
    ]
    summary = profile_summary(events, 2, 0.02, {200})
    assert summary["decode_streams"] == [21] and summary["decode_stream_rule"] == "launch thread"
    assert summary["decode"]["groups_ms_per_step"] == {
        "nvjpeg": 0.5,
        "resize": 0.5,
        "copy": 0.0,
        "other": 0.0,
    }
    assert summary["training"]["kernel_ms_per_step"] == 2.0 and summary["device_busy_ms_per_step"] == 2.5
    assert summary["overlap_ms_per_step"] == 0.5 and summary["streams"]["21"]["launches_other_decode"] == [
        0,
        2,
    ]
    assert [k["stream"] for k in summary["top_kernels"]] == [7, 21, 21]
    assert summary["host_ops_ms_per_step"] == 0.5  # the operator's, not the runtime calls'
    without_launches = [e for e in events if not e.name.startswith("cuda")]  # the names decide instead
    assert profile_summary(without_launches, 2, 0.02, {200})["decode_stream_rule"] == "kernel names"
    assert profile_summary(events, 2, 0.02, set())["decode"] is None  # decoded in the loop: no split
