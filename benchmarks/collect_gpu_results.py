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
    "tutorial_lenet_epoch_s": ("lenet.json", "tutorial_lenet_epoch_s"),
    "jpeg_pipeline_img_s": ("jpeg.json", "jpeg_pipeline_img_s"),
    "jpeg_data_wait_share": ("jpeg.json", "jpeg_data_wait_share"),
}


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def cuda_tests_passed(run_dir: Path) -> bool:
    """True only if the CUDA tests ran (none skipped) and all passed: pytest's exit code and summary line."""
    rc, log = run_dir / "cuda_tests.rc", run_dir / "cuda_tests.log"
    if not rc.is_file() or not log.is_file() or rc.read_text().strip() != "0":
        return False
    summary = log.read_text().strip().splitlines()[-1] if log.read_text().strip() else ""
    return bool(re.search(r"\b\d+ passed\b", summary)) and not re.search(r"skipped|failed|error", summary)


def collect(run_dir: Path) -> dict:
    versions = _read(run_dir / "versions.json")
    result = {"device": versions.get("device"), "commit": versions.get("commit"), "versions": versions}
    for key, (file, field) in FIGURES.items():
        value = _read(run_dir / file).get(field)
        result[key] = float(value) if isinstance(value, int | float) else None
    result["gpu_tests_passed"] = cuda_tests_passed(run_dir)
    return result


def main() -> None:
    run_dir = Path(sys.argv[1])
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(__file__).parent / "results" / "gpu.json"
    result = collect(run_dir)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
