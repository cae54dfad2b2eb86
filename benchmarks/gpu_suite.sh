#!/usr/bin/env bash
# Every GPU figure of the project and the CUDA tests, on one GPU machine; logs and JSON in one folder.
#
#   bash benchmarks/gpu_suite.sh OUT_DIR [PART ...]
#
# PARTs, in the order they run with none given: setup versions tests resnet compile lenet lenet_cli lenet_compile
# lenet_cudagraphs lenet_graphed jpeg jpeg_workers jpeg_4cpus gpu_decode gpu_decode_inline gpu_decode_shards worker_memory collect; `profile`
# (not in that list) times the GPU-decode stages and profiles the LeNet step (benchmarks/profile_gpu.py), and
# `gpu_decode_profile` (nor that) profiles gpu_decode's training: the device time of the decode's stream and the
# training's, per step (bench_jpeg_gpu.py --profile-steps). Each runs under
# `timeout` within 10 minutes (PART_TIMEOUT, seconds), so a machine that allows 10 minutes per command runs
# one or a few at a time into the same OUT_DIR. `collect` writes benchmarks/results/gpu.json (or $GPU_JSON) from what the others left there:
# null for a figure that did not run or failed, never an estimate.
#
# On a GPU machine's own PyTorch image (Python 3.12, its torch, torchvision and Lightning; no jsonargparse
# and no package index), from a copy of this checkout:
#
#   pip download --no-deps -d .whl jsonargparse docstring-parser typeshed-client cloudpickle  # here, with an index;
#                                            # .whl/ is git-ignored: copy it along with the checkout
#   pip download --no-deps -d .whl torchcodec --python-version 3.12 --only-binary=:all: \
#       --platform manylinux_2_28_x86_64     # TorchCodec (>= 0.16: decode_jpeg; CUDA 13, torch >= 2.11): the
#                                            # decoder on the GPU, else torchvision's; versions.json says which
#   bash benchmarks/gpu_suite.sh /tmp/gpu setup versions tests   # then the other parts, a few at a time
#
# `setup` unzips those wheels into the interpreter's site-packages (a wheel is a zip of the installed files;
# pip install --target plus PYTHONPATH hung on that image) and checks that lit_ddp's CLI imports; the
# project itself runs from this checkout (PYTHONPATH). pytest must be there for `tests` (the images have it).
# Where the copy's .git is not the tree's own (a copied working tree), name the commit: BENCH_COMMIT=abc1234.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: bash benchmarks/gpu_suite.sh OUT_DIR [PART ...]}
shift
ALL="setup versions tests resnet compile lenet lenet_cli lenet_compile lenet_cudagraphs lenet_graphed jpeg jpeg_workers jpeg_4cpus gpu_decode \
gpu_decode_inline gpu_decode_shards worker_memory collect"
PARTS=${*:-$ALL}
PART_TIMEOUT=${PART_TIMEOUT:-590}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
run() { timeout "$PART_TIMEOUT" "$@"; }

for part in $PARTS; do
  echo "=== $part ($(date -u +%H:%M:%S))"
  case $part in
    setup)
      site=$(python3 -c 'import site; print(site.getsitepackages()[0])')
      for wheel in .whl/*.whl; do
        [ -e "$wheel" ] || { echo "no wheels in .whl/: see this script's header" >&2; exit 2; }
        python3 -m zipfile -e "$wheel" "$site" && echo "unzipped $wheel into $site"
      done
      python3 -c 'import jsonargparse, lit_ddp.cli; print("jsonargparse", jsonargparse.__version__)' ;;
    versions)
      python - > "$OUT/versions.json" <<'PY'
import json, os, platform, sys
import lightning, torch, torchmetrics, torchvision
sys.path.insert(0, "benchmarks")
from harness import git_commit  # BENCH_COMMIT, else the checkout's
from lit_ddp.data.codec import torchcodec_decoder
cuda = torch.cuda.is_available()
if torchcodec_decoder() is not None:
    from importlib.metadata import version
    torchcodec = version("torchcodec")
else:
    torchcodec = None  # not installed, or its libraries do not load with this torch: torchvision decodes
print(json.dumps({
    "commit": git_commit() or "unknown",
    "device": torch.cuda.get_device_name(0) if cuda else "no CUDA device",
    "cpus": len(os.sched_getaffinity(0)),
    "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
    "torchvision": torchvision.__version__, "lightning": lightning.__version__,
    "torchmetrics": torchmetrics.__version__, "torchcodec": torchcodec,
}))
PY
      cat "$OUT/versions.json"; echo ;;
    tests)  # a few at a time where pytest-xdist is there: they are mostly start-up and compiling, on the CPUs
      parallel=()
      python3 -c 'import xdist' 2>/dev/null && parallel=(-n "${TEST_WORKERS:-4}" --dist load)
      run python -m pytest -m cuda tests/test_cuda.py tests/test_cuda_resnet.py -p no:cacheprovider \
        -o addopts="" "${parallel[@]}" -rA --durations=0 2>&1 | tee "$OUT/cuda_tests.log"
      echo "${PIPESTATUS[0]}" > "$OUT/cuda_tests.rc" ;;
    resnet)
      run python benchmarks/bench_resnet_gpu.py --json "$OUT/resnet50.json" 2>&1 | tee "$OUT/resnet50.log" ;;
    compile)
      run python benchmarks/bench_resnet_gpu.py --compile --json "$OUT/resnet50_compile.json" 2>&1 \
        | tee "$OUT/resnet50_compile.log" ;;
    lenet)  # the recipe (its step replayed as CUDA graphs) and the same with --model.cuda_graph=false
      run python benchmarks/bench_lenet_gpu.py --json "$OUT/lenet.json" 2>&1 \
        | tee "$OUT/lenet.log" ;;
    lenet_cli)  # the same with every callback and the logger `python -m lit_ddp fit` adds: what a user's run gets
      # A run that hangs is stopped with SIGABRT, which faulthandler turns into every thread's stack in the log.
      PYTHONFAULTHANDLER=1 timeout -s ABRT -k 15 "$PART_TIMEOUT" python benchmarks/bench_lenet_gpu.py \
        --cli-callbacks --rounds 2 --json "$OUT/lenet_cli.json" 2>&1 | tee "$OUT/lenet_cli.log" ;;
    lenet_compile)  # lit_ddp compiled beside the others (each round compiles in its warm-up epoch)
      run python benchmarks/bench_lenet_gpu.py --compile --rounds 2 --json "$OUT/lenet_compile.json" 2>&1 \
        | tee "$OUT/lenet_compile.log" ;;
    lenet_cudagraphs)  # the same, compiled with mode reduce-overhead: forward and backward as CUDA graphs
      run python benchmarks/bench_lenet_gpu.py --compile reduce-overhead --rounds 2 \
        --json "$OUT/lenet_cudagraphs.json" 2>&1 | tee "$OUT/lenet_cudagraphs.log" ;;
    lenet_graphed)  # the floor's whole step as one CUDA graph, alone and in Lightning's loop
      run python benchmarks/bench_lenet_gpu.py --graphed --rounds 2 --json "$OUT/lenet_graphed.json" 2>&1 \
        | tee "$OUT/lenet_graphed.log" ;;
    jpeg)  # the recipe's loader with its automatic worker count
      run python benchmarks/bench_jpeg_gpu.py --dir "$OUT/jpegs" --json "$OUT/jpeg.json" 2>&1 \
        | tee "$OUT/jpeg.log" ;;
    jpeg_workers)  # other counts, shorter windows: collect takes the best
      cpus=$(python3 -c 'import os; print(len(os.sched_getaffinity(0)))')
      for n in ${JPEG_WORKERS:-$((cpus / 2)) $((cpus - 2)) $((cpus - 1)) $cpus}; do
        run python benchmarks/bench_jpeg_gpu.py --dir "$OUT/jpegs" --num-workers "$n" --steps 150 \
          --json "$OUT/jpeg_workers_$n.json" 2>&1 | tee "$OUT/jpeg_workers_$n.log"
      done ;;
    jpeg_4cpus)  # a node with 4 CPUs per GPU, decoding on them
      run taskset -c 0-3 python benchmarks/bench_jpeg_gpu.py --dir "$OUT/jpegs" --json "$OUT/jpeg_4cpus.json" \
        2>&1 | tee "$OUT/jpeg_4cpus.log" ;;
    gpu_decode)  # the same 4 CPUs, the batch decoded on the GPU (--data.gpu_decode=true), a batch ahead
      run taskset -c 0-3 python benchmarks/bench_jpeg_gpu.py --dir "$OUT/jpegs" --gpu-decode \
        --json "$OUT/gpu_decode.json" 2>&1 | tee "$OUT/gpu_decode.log" ;;
    gpu_decode_inline)  # the same, decoded in the training loop (--data.decode_ahead=false): the A/B
      run taskset -c 0-3 python benchmarks/bench_jpeg_gpu.py --dir "$OUT/jpegs" --gpu-decode --no-decode-ahead \
        --json "$OUT/gpu_decode_inline.json" 2>&1 | tee "$OUT/gpu_decode_inline.log" ;;
    gpu_decode_shards)  # gpu_decode's images read from MDS shards (StreamingDataModule), written beside them
      run taskset -c 0-3 python benchmarks/bench_jpeg_gpu.py --dir "$OUT/jpegs" --gpu-decode --shards \
        --json "$OUT/gpu_decode_shards.json" 2>&1 | tee "$OUT/gpu_decode_shards.log" ;;
    profile)  # where the time goes: the gpu_decode batch's stages (on 4 CPUs) and the LeNet step's operators
      run taskset -c 0-3 python benchmarks/profile_gpu.py decode --dir "$OUT/jpegs" \
        --json "$OUT/profile_decode.json" 2>&1 | tee "$OUT/profile_decode.log"
      for side in lit_ddp floor; do  # the floor's busy share says what CUDA graphs can still win
        run python benchmarks/profile_gpu.py lenet --side "$side" --json "$OUT/profile_lenet_$side.json" \
          --table "$OUT/profile_lenet_${side}_ops.txt" 2>&1 | tee "$OUT/profile_lenet_$side.log"
      done ;;
    gpu_decode_profile)  # gpu_decode, shorter, then 10 steps under torch.profiler: where the device time goes
      run taskset -c 0-3 python benchmarks/bench_jpeg_gpu.py --dir "$OUT/jpegs" --gpu-decode --steps 60 --warmup 30 \
        --profile-steps 10 --json "$OUT/gpu_decode_profile.json" 2>&1 | tee "$OUT/gpu_decode_profile.log" ;;
    worker_memory)
      run python benchmarks/bench_worker_memory_gpu.py --workers 4 --json "$OUT/worker_memory.json" 2>&1 \
        | tee "$OUT/worker_memory.log" ;;
    collect)
      python benchmarks/collect_gpu_results.py "$OUT" "${GPU_JSON:-benchmarks/results/gpu.json}" ;;
    *)
      echo "unknown part: $part ($ALL)" >&2; exit 2 ;;
  esac
done
