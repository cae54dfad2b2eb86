"""benchmarks/results/gpu.json from one gpu_suite.sh run: the headline figures, each read from the JSON its
benchmark wrote, or null where that benchmark did not run or failed. Nothing is estimated.

    python benchmarks/collect_gpu_results.py RUN_DIR [OUT]   # OUT: benchmarks/results/gpu.json
"""

import json
import re
import sys
from pathlib import Path

# gpu.json key → (the file in RUN_DIR, the key in it)
FIGURES = {
    "resnet50_lightning_img_s": ("resnet50.json", "lightning_img_s"),
    "resnet50_raw_img_s": ("resnet50.json", "raw_img_s"),
    "resnet50_compile_img_s": ("resnet50_compile.json", "lightning_img_s"),
    "resnet50_compile_raw_img_s": ("resnet50_compile.json", "raw_img_s"),
    "lenet_cifar_epoch_s": ("lenet.json", "lenet_cifar_epoch_s"),
    "lenet_cifar_eager_epoch_s": ("lenet.json", "lenet_cifar_eager_epoch_s"),  # --model.cuda_graph=false
    "lenet_cifar_cli_epoch_s": ("lenet_cli.json", "lenet_cifar_epoch_s"),  # with fit's callbacks and logger
    "lenet_cifar_cli_eager_epoch_s": ("lenet_cli.json", "lenet_cifar_eager_epoch_s"),
    "tutorial_lenet_epoch_s": ("lenet.json", "tutorial_lenet_epoch_s"),
    "raw_lenet_epoch_s": ("lenet.json", "raw_lenet_epoch_s"),  # the same math without a framework
    "lightning_lenet_epoch_s": ("lenet.json", "lightning_lenet_epoch_s"),  # ... in Lightning's loop
    "lenet_cifar_compiled_epoch_s": ("lenet_compile.json", "lenet_cifar_compiled_epoch_s"),
    "lenet_cifar_cudagraphs_epoch_s": ("lenet_cudagraphs.json", "lenet_cifar_compiled_epoch_s"),
    # the whole step as one CUDA graph: the floor's without a framework and in Lightning's loop
    "raw_graphed_lenet_epoch_s": ("lenet_graphed.json", "raw_graphed_lenet_epoch_s"),
    "lightning_graphed_lenet_epoch_s": ("lenet_graphed.json", "lightning_graphed_lenet_epoch_s"),
    "jpeg_pipeline_img_s": ("jpeg.json", "jpeg_pipeline_img_s"),  # the automatic worker count
    "jpeg_data_wait_share": ("jpeg.json", "jpeg_data_wait_share"),
    "jpeg_num_workers": ("jpeg.json", "num_workers"),
    "jpeg_4cpus_img_s": ("jpeg_4cpus.json", "jpeg_pipeline_img_s"),  # 4 CPUs, decoded on them
    "jpeg_4cpus_data_wait_share": ("jpeg_4cpus.json", "jpeg_data_wait_share"),
    "gpu_decode_img_s": ("gpu_decode.json", "jpeg_pipeline_img_s"),  # 4 CPUs, decoded on the GPU
    "gpu_decode_data_wait_share": ("gpu_decode.json", "jpeg_data_wait_share"),
    "gpu_decode_inline_img_s": ("gpu_decode_inline.json", "jpeg_pipeline_img_s"),  # decoded between steps
    "gpu_decode_inline_data_wait_share": ("gpu_decode_inline.json", "jpeg_data_wait_share"),
    "gpu_decode_shards_img_s": ("gpu_decode_shards.json", "jpeg_pipeline_img_s"),  # ... read from MDS shards
    "gpu_decode_shards_data_wait_share": ("gpu_decode_shards.json", "jpeg_data_wait_share"),
    # a batch's decode under training (median, host and device) beside the step: is the decode the limit?
    "gpu_decode_step_ms": ("gpu_decode.json", "step_ms"),
    "gpu_decode_ms": ("gpu_decode.json", "decode_ms"),
    "gpu_decode_device_ms": ("gpu_decode.json", "decode_device_ms"),
    "gpu_decode_inline_ms": ("gpu_decode_inline.json", "decode_ms"),
    "gpu_decode_shards_step_ms": ("gpu_decode_shards.json", "step_ms"),
    "gpu_decode_shards_ms": ("gpu_decode_shards.json", "decode_ms"),
    "worker_cost_mib": ("worker_memory.json", "worker_cost_mib"),
}
# Ratios to the on-device ResNet-50 figure (the compute limit): the goals of issue 30 are >= 0.95.
RATIOS = {
    "jpeg_vs_on_device": "jpeg_pipeline_img_s",
    "jpeg_best_vs_on_device": "jpeg_best_img_s",
    "gpu_decode_vs_on_device": "gpu_decode_img_s",
    "gpu_decode_inline_vs_on_device": "gpu_decode_inline_img_s",
    "gpu_decode_shards_vs_on_device": "gpu_decode_shards_img_s",
}


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def cuda_tests_passed(run_dir: Path) -> bool | None:
    """True only if the CUDA tests ran (none skipped) and all passed: pytest's exit code and summary line;
    None where they did not run."""
    rc, log = run_dir / "cuda_tests.rc", run_dir / "cuda_tests.log"
    if not rc.is_file() or not log.is_file():
        return None
    if rc.read_text().strip() != "0":
        return False
    summary = log.read_text().strip().splitlines()[-1] if log.read_text().strip() else ""
    return bool(re.search(r"\b\d+ passed\b", summary)) and not re.search(r"skipped|failed|error", summary)


def collect(run_dir: Path) -> dict:
    versions = _read(run_dir / "versions.json")
    result = {"device": versions.get("device"), "commit": versions.get("commit"), "versions": versions}
    for key, (file, field) in FIGURES.items():
        value = _read(run_dir / file).get(field)
        result[key] = float(value) if isinstance(value, int | float) else None
    # lit_ddp's LeNet epoch with N DataLoader workers (the recipe has none): {"N": seconds}, or null.
    workers = _read(run_dir / "lenet.json").get("lenet_cifar_workers_epoch_s") or {}
    timed = {n: float(s) for n, s in workers.items() if isinstance(s, int | float)}
    result["lenet_cifar_workers_epoch_s"] = timed or None
    # The loader at the automatic worker count and the others (jpeg_workers_N.json): the fastest, its count.
    runs = [_read(run_dir / "jpeg.json"), *map(_read, sorted(run_dir.glob("jpeg_workers_*.json")))]
    runs = [r for r in runs if isinstance(r.get("jpeg_pipeline_img_s"), int | float)]
    best = max(runs, key=lambda r: r["jpeg_pipeline_img_s"], default={})
    result["jpeg_best_img_s"] = float(best["jpeg_pipeline_img_s"]) if best else None
    result["jpeg_best_num_workers"] = best.get("num_workers")
    on_device = result["resnet50_lightning_img_s"]
    for key, figure in RATIOS.items():
        value = result[figure]
        result[key] = value / on_device if value is not None and on_device else None
    result["gpu_tests_passed"] = cuda_tests_passed(run_dir)
    # Whose nvJPEG call the GPU decode ran: TorchCodec's or torchvision's (the fallback), with its version.
    result["gpu_decode_decoder"] = _read(run_dir / "gpu_decode.json").get("decoder")
    return result


def main() -> None:
    run_dir = Path(sys.argv[1])
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(__file__).parent / "results" / "gpu.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    result = collect(run_dir)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
