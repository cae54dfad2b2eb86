#!/usr/bin/env bash
# Every GPU figure of issue 17 and the CUDA tests, on one GPU machine, logs and JSON in one folder:
#
#   bash benchmarks/gpu_suite.sh OUT_DIR [PART ...]   # PART: versions tests resnet compile lenet jpeg collect
#
# With no PART it runs them all (about 25 minutes on an H100); a machine that allows 10 minutes per command
# runs them a few parts at a time into the same OUT_DIR. `collect` writes benchmarks/results/gpu.json (or
# $GPU_JSON) from what the others left there: null for a figure that did not run, never an estimate. The project must be importable
# (PYTHONPATH is set to this checkout) with jsonargparse and its pure-Python companions installed or on the
# path, and pytest for `tests` (bring the wheels to a machine without a package registry).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: bash benchmarks/gpu_suite.sh OUT_DIR [PART ...]}
shift
PARTS=${*:-versions tests resnet compile lenet jpeg collect}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

for part in $PARTS; do
  echo "=== $part ($(date -u +%H:%M:%S))"
  case $part in
    versions)
      python - "$(git rev-parse --short HEAD 2>/dev/null || cat COMMIT 2>/dev/null || echo unknown)" \
        > "$OUT/versions.json" <<'PY'
import json, platform, sys
import lightning, torch, torchmetrics, torchvision
cuda = torch.cuda.is_available()
print(json.dumps({
    "commit": sys.argv[1],
    "device": torch.cuda.get_device_name(0) if cuda else "no CUDA device",
    "cpus": __import__("os").cpu_count(),
    "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
    "torchvision": torchvision.__version__, "lightning": lightning.__version__,
    "torchmetrics": torchmetrics.__version__,
}))
PY
      cat "$OUT/versions.json"; echo ;;
    tests)
      python -m pytest -m cuda tests/test_cuda.py -p no:cacheprovider -o addopts="" -rA 2>&1 \
        | tee "$OUT/cuda_tests.log"
      echo "${PIPESTATUS[0]}" > "$OUT/cuda_tests.rc" ;;
    resnet)
      python benchmarks/bench_resnet_gpu.py --json "$OUT/resnet50.json" 2>&1 | tee "$OUT/resnet50.log" ;;
    compile)
      python benchmarks/bench_resnet_gpu.py --compile --json "$OUT/resnet50_compile.json" 2>&1 \
        | tee "$OUT/resnet50_compile.log" ;;
    lenet)
      python benchmarks/bench_lenet_gpu.py --json "$OUT/lenet.json" 2>&1 | tee "$OUT/lenet.log" ;;
    jpeg)
      python benchmarks/bench_jpeg_gpu.py --json "$OUT/jpeg.json" 2>&1 | tee "$OUT/jpeg.log" ;;
    collect)
      python benchmarks/collect_gpu_results.py "$OUT" "${GPU_JSON:-benchmarks/results/gpu.json}" ;;
    *)
      echo "unknown part: $part (versions tests resnet compile lenet jpeg collect)" >&2; exit 2 ;;
  esac
done
