"""A process-wide switch for machines without the NVIDIA driver, set once by the CLI at start-up."""

import ctypes
import os
import sys


def skip_futile_nvml_checks() -> None:
    """Lets ``torch.cuda.is_available()`` skip NVML on Linux machines without the NVIDIA driver.

    Importing Lightning sets ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` (a fork-safe CUDA check). Without the
    driver, NVML cannot load, so every check tries ``dlopen`` in vain and falls back to the plain check
    anyway. Adam's and AdamW's ``step()`` run that check each time, a visible share of a small model's step
    on CPU with a CUDA build of torch (docs/benchmarks.md). Where NVML loads (a GPU machine), nothing changes.
    """
    if sys.platform != "linux" or os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") != "1":
        return
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "0"
