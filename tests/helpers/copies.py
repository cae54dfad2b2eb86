"""Which copies from host memory reach a device while a block runs, and from what memory: for the test that
the per-sample draws reach a GPU in one copy from pinned memory (test_cuda.py), and its CPU twin
(test_augment.py), which keeps this recorder's reading of torch's dispatch alive where CI has no GPU."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class HostToDeviceCopies(TorchDispatchMode):
    """(source pinned, non_blocking) of each copy dispatched while entered from host memory to a device of
    type ``device_type``, in ``copies``."""

    def __init__(self, device_type: str = "cuda") -> None:
        super().__init__()
        self.device_type = device_type
        self.copies: list[tuple[bool, bool]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        source = args[0] if name == "_to_copy" else args[1] if name == "copy_" else None
        if (
            isinstance(out, torch.Tensor)
            and out.device.type == self.device_type
            and isinstance(source, torch.Tensor)
            and source.device.type == "cpu"
        ):
            self.copies.append((source.is_pinned(), bool(kwargs.get("non_blocking", False))))
        return out
