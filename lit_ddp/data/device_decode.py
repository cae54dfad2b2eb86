"""JPEG decoding on the training device (``ImageNetDataModule(gpu_decode=True)``), for nodes with few CPU
cores per GPU: the DataLoader workers only read each file's bytes and its header (PIL's lazy open: the size,
the format, the EXIF orientation) and draw the sample's crop box and flip; the batch is decoded where it is
trained, with nvJPEG on CUDA (codec.py ``decode_jpegs``: TorchCodec's, one call for the batch), and
cropped, resized and flipped there with the CPU path's geometry and resize (jpeg.py ``crop_region``,
``center_crop_band``, ``resize_uint8``; through float32 on a GPU, for the whole batch at once). On a CPU
device the same code decodes with libjpeg-turbo, which is how CI tests it.

Each sample's draws are the CPU path's: the box and the flip come from torch's global RNG, seeded per sample
by (seed, epoch, index) around the read (image_folder.py), in the same order as ``load_train_crop`` draws
them; decoding draws nothing. So a sample gets the same crop whichever rank, worker or batch handles it, and
the same as with ``gpu_decode=False`` (the pixels too where both decode in full: ``draft=False``).

The decode runs one batch ahead of training, on a thread with its own CUDA stream (``DecodeAheadLoader``):
while the device trains on batch k, batch k+1's bytes are decoded. The CUDA decoder (TorchCodec's, as
torchvision's) returns only when its batch is decoded (it synchronises its stream; JPEGs the hardware
decoder does not take have their Huffman stage on the host), and each image's crop and resize is launched
from Python. In the training loop the host does nothing else meanwhile: the device runs what was queued,
but the next step's launches wait. On a thread they go on, as with a DataLoader worker's decode; torch's
operators release the GIL while they run, so the thread leaves the training loop's Python free.

What the device path does not take is decoded in the worker as before and travels as pixels beside the
encoded bytes: files that are not JPEG, JPEGs not stored as RGB (grayscale, CMYK), and photos stored turned
(EXIF orientation other than 1, which TorchCodec's decoder turns whatever ``exif_transpose`` says); and the
black placeholder of an unreadable file, which the data module drops before the copy.
"""

import io
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import NamedTuple

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor
from torch.utils.data import DataLoader

from lit_ddp.data.ahead import started_ahead
from lit_ddp.data.batch import Batch
from lit_ddp.data.batch_transforms import to_device
from lit_ddp.data.codec import decode_jpegs, reason
from lit_ddp.data.jpeg import (
    Box,
    _orientation,
    center_crop_band,
    crop_region,
    load_eval_crop,
    load_train_crop,
    random_resized_crop_box,
    resize_float,
    resize_uint8,
    to_uint8_,
)


def resizes_in_float(device: torch.device) -> bool:
    """Whether the batch is resized through float32: everywhere but on the CPU, whose antialiased kernel
    takes uint8 (and is fastest so); CUDA's takes floating point only."""
    return device.type != "cpu"


class Encoded:
    """One sample's file bytes (a 1-d uint8 tensor) and what the device does with them: a training crop
    ``box`` and ``flip``, or (``box`` None) the evaluation resize of the stored ``size`` (width, height)."""

    __slots__ = ("data", "box", "flip", "size")

    def __init__(self, data: Tensor, box: Box | None, flip: bool, size: tuple[int, int]) -> None:
        self.data, self.box, self.flip, self.size = data, box, flip, size


def _read(source: str | np.ndarray) -> np.ndarray:
    """A file's bytes, or the bytes given (an image read from a shard)."""
    return source if isinstance(source, np.ndarray) else np.fromfile(source, dtype=np.uint8)


def _device_decodable(data: np.ndarray) -> tuple[int, int] | None:
    """The stored (width, height) of a JPEG the device path takes (RGB, stored upright: TorchCodec turns
    the others as their EXIF says, whatever ``exif_transpose``), else None. Reads only the header."""
    try:
        img = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        return None  # the worker's CPU path names the problem
    with img:
        return img.size if img.format == "JPEG" and img.mode == "RGB" and _orientation(img) == 1 else None


def read_train_sample(
    path: str,
    size: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    draft: bool = True,
    flip_p: float = 0.0,
    exif_transpose: bool = True,
) -> Encoded | np.ndarray:
    """The worker's share of ``load_train_crop``: the file's bytes, the RandomResizedCrop box and the flip,
    drawn as it draws them; the CPU path's (size, size, 3) crop for what the device does not decode. ``path``:
    a file, or its bytes (a shard's)."""
    data = _read(path)
    stored = _device_decodable(data)
    if stored is None:  # nothing drawn yet: the CPU path draws exactly what it would have
        return load_train_crop(path, size, scale, ratio, draft, flip_p, None, exif_transpose)
    box = random_resized_crop_box(*stored, scale, ratio)
    flip = flip_p > 0 and float(torch.rand(())) < flip_p
    return Encoded(torch.from_numpy(data), box, flip, stored)


def read_eval_sample(
    path: str, size: int, resize: int, draft: bool = True, exif_transpose: bool = True
) -> Encoded | np.ndarray:
    """The worker's share of ``load_eval_crop``: the file's bytes and stored size (the CPU path's crop for
    what the device does not decode)."""
    data = _read(path)
    stored = _device_decodable(data)
    if stored is None:
        return load_eval_crop(path, size, resize, draft, exif_transpose)
    return Encoded(torch.from_numpy(data), None, False, stored)


class Slot(NamedTuple):
    """One sample's place in an ``EncodedBatch``: a JPEG (``kind`` "jpeg"), its bytes ``data[start:end]``,
    the crop drawn for it (``box`` and ``flip``; box None: evaluation's resize of the ``stored`` (width,
    height)) and its ``name`` (path); or (kind "pixels") row ``row`` of the pixels decoded in the worker."""

    kind: str
    start: int = 0
    end: int = 0
    box: Box | None = None
    flip: bool = False
    stored: tuple[int, int] = (0, 0)
    name: str = ""
    row: int = -1


class EncodedBatch:
    """A batch as the workers hand it over: the samples' bytes in one uint8 tensor (one shared-memory
    transfer, not one per file), and the pixels of the samples decoded on the CPU in another. Not a tensor
    nor a dataclass, so Lightning's copy to the device leaves it on the host, where ``decode_jpegs`` wants
    the bytes. ``batch[keep]`` (a (B,) bool mask) keeps some samples (unreadable files are dropped so)."""

    def __init__(
        self, samples: Sequence[Encoded | np.ndarray], names: Sequence[str], size: int, resize: int | None
    ) -> None:
        self.size, self.resize = size, resize  # resize None: training crops
        encoded = [s for s in samples if isinstance(s, Encoded)]
        decoded = [s for s in samples if not isinstance(s, Encoded)]
        self.data = torch.cat([s.data for s in encoded]) if encoded else torch.empty(0, dtype=torch.uint8)
        self.pixels = torch.from_numpy(np.stack(decoded)) if decoded else None  # (K, size, size, 3)
        self.slots: list[Slot] = []
        start = rows = 0
        for s, name in zip(samples, names, strict=True):
            if isinstance(s, Encoded):
                end = start + len(s.data)
                self.slots.append(Slot("jpeg", start, end, s.box, s.flip, s.size, name))
                start = end
            else:
                self.slots.append(Slot("pixels", row=rows))
                rows += 1

    def __len__(self) -> int:
        return len(self.slots)

    def __getitem__(self, keep: Tensor) -> "EncodedBatch":
        kept = object.__new__(EncodedBatch)
        kept.size, kept.resize, kept.data, kept.pixels = self.size, self.resize, self.data, self.pixels
        kept.slots = [slot for slot, k in zip(self.slots, keep.tolist(), strict=True) if k]
        return kept

    def decode(self, device: torch.device) -> tuple[Tensor, dict[int, tuple[str, str]]]:
        """(B, 3, size, size) uint8 on ``device``, channels-last memory as the CPU path's batches, and the
        files the decoder refused, {slot: (path, why)} as ``ImageFileDataset`` reports them (a header can
        parse and the data still be truncated): their slots are black, for the caller to drop."""
        jpegs = [(i, slot) for i, slot in enumerate(self.slots) if slot.kind == "jpeg"]
        images, bad = self._decode_jpegs([self.data[slot.start : slot.end] for _, slot in jpegs], device)
        bad = {jpegs[k][0]: (jpegs[k][1].name, why) for k, why in bad.items()}
        decoded = [
            (i, self._region(image, slot))
            for (i, slot), image in zip(jpegs, images, strict=True)
            if image is not None
        ]
        # On a GPU each image is resized into one float batch, rounded and cast once for the batch: 3
        # launches an image (its float copy, the resize, the write) where rounding each alone took 7.
        in_float = resizes_in_float(device)
        dtype = torch.float32 if in_float else torch.uint8
        shape = (len(self), 3, self.size, self.size)
        out = torch.empty(shape, dtype=dtype, device=device, memory_format=torch.channels_last).zero_()
        for i, (region, arguments, (top, left)) in decoded:
            region = region.unsqueeze(0)
            if in_float:
                band = resize_float(region, **arguments)
            else:  # channels-last: the CPU kernel's fast path
                band = resize_uint8(region.contiguous(memory_format=torch.channels_last), **arguments)
            out[i] = band[0, :, top : top + self.size, left : left + self.size]
        if in_float:
            out = to_uint8_(out)
        # The host's own tensors go by to_device: a blocking copy would hold this thread until the device
        # had run every resize queued before it, when it could be decoding the next batch meanwhile.
        flips = [i for i, slot in jpegs if slot.flip and i not in bad]
        if flips:
            index = to_device(torch.tensor(flips), device)
            out[index] = out[index].flip(-1)
        rows = [(i, slot.row) for i, slot in enumerate(self.slots) if slot.kind == "pixels"]
        if rows:
            pixels = to_device(self.pixels[[row for _, row in rows]], device).permute(0, 3, 1, 2)
            out[to_device(torch.tensor([i for i, _ in rows]), device)] = pixels
        return out, bad

    def _region(self, image: Tensor, slot: Slot) -> tuple[Tensor, dict, tuple[int, int]]:
        """The CPU path's geometry for one decoded image (jpeg.py): the view it resizes, the resize's
        arguments and the corner of what it keeps: a training crop's box, or evaluation's centre crop."""
        if self.resize is None:
            return crop_region(image, slot.box), {"size": (self.size, self.size)}, (0, 0)
        return center_crop_band(image, 1.0, slot.stored, self.size, self.resize)

    @staticmethod
    def _decode_jpegs(data: list[Tensor], device: torch.device) -> tuple[list[Tensor | None], dict[int, str]]:
        """All in one call; if the decoder refuses one, each alone, to find which (None, and why)."""
        if not data:
            return [], {}
        try:
            return decode_jpegs(data, device), {}
        except RuntimeError:
            pass
        images, bad = [], {}
        for k, d in enumerate(data):
            try:
                images.extend(decode_jpegs([d], device))
            except RuntimeError as err:  # the decoder's message names its error
                images.append(None)
                bad[k] = f"OSError: {reason(err)}"
        return images, bad


class DecodedAhead:
    """A batch's decode started on ``DecodeAheadLoader``'s thread. ``decode(device)`` answers as
    ``EncodedBatch.decode`` does, ready for use on the calling thread's current stream. ``batch[keep]`` keeps
    some samples, as ``EncodedBatch``'s does (the files the workers could not read are dropped so, after the
    decode started: their slots hold placeholders, cheap to decode)."""

    __slots__ = ("_future", "_keep")

    def __init__(self, future: "Future[tuple[Tensor, dict, torch.cuda.Event | None]]", keep=None) -> None:
        self._future, self._keep = future, keep

    def __getitem__(self, keep: Tensor) -> "DecodedAhead":
        keep = keep if self._keep is None else self._keep.clone().masked_scatter_(self._keep, keep)
        return DecodedAhead(self._future, keep)

    def cancel(self) -> bool:
        """Not decoded if the decode has not started (a batch no one will use)."""
        return self._future.cancel()

    def decode(self, device: torch.device) -> tuple[Tensor, dict[int, tuple[str, str]]]:
        """The batch and the files the decoder refused; ``device`` is where the loader decoded it."""
        out, bad, done = self._future.result()  # the decode's exception, if it raised, is raised here
        if done is not None:  # CUDA: the training stream waits for the decode stream, on the device
            stream = torch.cuda.current_stream(out.device)
            stream.wait_event(done)
            out.record_stream(stream)  # its memory is not reused before the training stream is done
        if self._keep is not None:
            kept = self._keep.nonzero().flatten().tolist()
            bad = {new: bad[old] for new, old in enumerate(kept) if old in bad}
            out = out[self._keep.to(out.device)]
        return out, bad


def _decode_on(batch: EncodedBatch, device: torch.device, stream: "torch.cuda.Stream | None"):
    if stream is None:
        return (*batch.decode(device), None)
    with torch.cuda.device(device), torch.cuda.stream(stream):  # the current device is per thread
        out, bad = batch.decode(device)
        done = torch.cuda.Event()
        done.record(stream)
    return out, bad, done


def decode_ahead(batches: Iterator[Batch], device: torch.device) -> Iterator[Batch]:
    """``batches`` with each ``EncodedBatch`` replaced by its ``DecodedAhead``, whose decode starts as the
    batch before it is handed out: one batch is decoded while the one before trains. What is not a
    ``Batch`` (a worker's ``WorkerError``) passes as it is."""
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lit_ddp-decode")

    def start(batch: Batch) -> Batch:
        if not isinstance(batch, Batch):
            return batch
        return replace(batch, images=DecodedAhead(executor.submit(_decode_on, batch.images, device, stream)))

    def cancel(batch: Batch) -> None:
        if isinstance(batch, Batch):
            batch.images.cancel()

    try:
        # An epoch cut short cancels the batch started and not handed out: no one would use it.
        yield from started_ahead(batches, start, ahead=2, cancel=cancel)
    finally:
        executor.shutdown(wait=True)  # the batches handed out are decoded, then the thread ends


class DecodeAheadLoader(DataLoader):
    """A DataLoader of ``EncodedBatch`` batches (decoders.py ``DeviceDecode``) whose decode runs one batch
    ahead (``decode_ahead``) on the device ``device()`` names; where it names none (a loader used outside a
    Trainer), the batches come as they are, for ``EncodedBatch.decode`` in the training loop."""

    def __init__(self, *args, device: Callable[[], torch.device | None], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.device = device

    def __iter__(self) -> Iterator:
        batches = super().__iter__()
        device = self.device()
        return batches if device is None else decode_ahead(batches, device)
