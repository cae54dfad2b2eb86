"""Augmentation and normalisation of whole uint8 batches, on the device the batch landed on.

Per-sample PIL transforms in DataLoader workers are what limits the tutorials' throughput on small images;
here a (B, 3, H, W) uint8 batch costs a few tensor ops. Each sample's random numbers come from
``SampleRandom``: a counter-based hash of (key, sample index, draw number), computed for the whole batch at
once (by the data module on the host, before the batch's copy to the device). With the key a function of
(seed, epoch), a sample is cropped and flipped alike whichever rank, batch or device count handles it, so
1 × 64 and 2 × 32 see the same augmented images and a resumed run augments as the uninterrupted one (the
global RNG would do neither: ``seed_everything`` seeds it identically on every rank, and its stream depends
on how many samples came before). MixUp and CutMix mix the normalised float batch and turn its labels into
(B, num_classes) probabilities.
"""

import functools
import math
import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor


def to_device(tensor: Tensor, device: torch.device | str) -> Tensor:
    """``tensor``, on the host, on ``device``; on CUDA without holding the host back: copied non-blocking
    from pinned memory, as Lightning copies a loader's pinned batch. CUDA copies pageable memory through a
    staging buffer and may first wait for every kernel queued on the stream (its documented API sync
    behaviour), which would stall the thread that asked until the device caught up."""
    device = torch.device(device)
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


@functools.lru_cache(maxsize=16)
def _scaled_mean_std(
    mean: tuple[float, ...], std: tuple[float, ...], device: torch.device
) -> tuple[Tensor, Tensor]:
    """(1, C, 1, 1) mean and std in uint8 units, made once per device rather than on every batch."""
    m = torch.tensor(mean, device=device, dtype=torch.float32).view(1, -1, 1, 1) * 255.0
    s = torch.tensor(std, device=device, dtype=torch.float32).view(1, -1, 1, 1) * 255.0
    return m, s


def normalize(x: Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> Tensor:
    """(B, C, H, W) uint8 in [0, 255] → float32 ``(x/255 - mean) / std``."""
    m, s = _scaled_mean_std(tuple(mean), tuple(std), x.device)
    return x.float().sub_(m).div_(s)  # in place on the fresh float copy: one allocation


_M32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9  # golden-ratio stride between draw numbers, as splitmix's counter steps


def _mix32(h):
    """A 32-bit integer hash of int64 values in [0, 2^32), elementwise and in place (Wellons' lowbias32
    xor-shift-multiply rounds, https://nullprogram.com/blog/2018/07/31/). The multipliers are odd and below
    2^31, so no product leaves int64: the same bits on every device and backend, no overflow relied on.
    ``h``: an int64 torch tensor or numpy array (the operators are the same)."""
    h ^= h >> 16
    h *= 0x7FEB352D
    h &= _M32
    h ^= h >> 15
    h *= 0x27D4EB2F  # xxHash's PRIME32_4
    h &= _M32
    h ^= h >> 16
    return h


def _base_hash(index, key: int):
    """(B,): each sample's hash of (key, index), from which its draws are hashed; torch or numpy alike."""
    # The low 32 bits of the index, hashed with one half of the key; the high bits and the other half
    # folded in before the draws' round: two rounds between any input bit and any output bit.
    return _mix32((index & _M32) ^ (key & _M32)) ^ (index >> 32) ^ ((key >> 32) & _M32)


def _draws(base, draws):
    """(B, len(draws)): the draws numbered ``draws`` of the samples whose base hashes are ``base``."""
    return _mix32((base[:, None] + (draws + 1) * _GOLDEN) & _M32)


class SampleRandom:
    """Random numbers for each sample of a batch, a pure function of (key, sample index, draw number).

    ``index`` is the (B,) int64 tensor of the samples' indices in their dataset, on the batch's device;
    ``key`` any int (the data module passes a hash of (seed, epoch)). Draw ``k`` of sample ``i`` is the
    same whatever batch, rank or device count carries ``i``: a counter-based generator (as Philox is,
    Salmon et al., SC'11), here a few elementwise integer ops for the whole batch.
    Augmentations number their draws: crop row 0, crop column 1, flip 2; a new per-sample draw takes the
    next free number. The first ``BLOCK`` draws are hashed together and kept with the base hash as one
    (B, 1 + BLOCK) tensor, which moves to a device in one copy.

    On the host the hash runs in numpy: a few dozen ops on (B,) integers, each of which costs torch's
    dispatcher several times numpy's, every step; the bits are the same (tests/test_augment.py).
    """

    BLOCK = 4

    def __init__(self, index: Tensor, key: int) -> None:
        index = index if index.dtype == torch.long else index.long()
        if index.device.type == "cpu":
            base = _base_hash(index.numpy(), key)
            block = _draws(base, np.arange(self.BLOCK))
            packed = torch.from_numpy(np.concatenate([base[:, None], block], axis=1))
        else:
            base = _base_hash(index, key)
            block = _draws(base, torch.arange(self.BLOCK, device=index.device))
            packed = torch.cat([base[:, None], block], dim=1)
        self._packed = packed  # (B, 1 + BLOCK): the base hash, then the first BLOCK draws

    @classmethod
    def _of(cls, packed: Tensor) -> "SampleRandom":
        made = object.__new__(cls)
        made._packed = packed
        return made

    def to(self, device: torch.device | str) -> "SampleRandom":
        """The same draws on ``device``. Lightning moves every object of a batch that has ``to``, so the data
        module hashes on the host, before the copy, and the device gets one small tensor (on CUDA copied
        without holding the next step's launches back) instead of a few dozen integer kernels per step."""
        return SampleRandom._of(to_device(self._packed, device))

    def take(self, index: Tensor) -> "SampleRandom":
        """The draws of samples ``index`` (B,) of this ``SampleRandom``, which was made for the indices
        0..N-1 with the same key: its rows, one ``index_select``, the same bits as hashing ``index``."""
        return SampleRandom._of(self._packed.index_select(0, index))

    def __getitem__(self, keep: Tensor) -> "SampleRandom":
        """The draws of the samples ``keep`` (a (B,) bool mask on their device) selects."""
        return SampleRandom._of(self._packed[keep])

    def bits(self, draw: int, count: int | None = None) -> Tensor:
        """(B,) int64 in [0, 2^32): draw number ``draw`` of each sample; with ``count``, (B, count): draws
        ``draw`` to ``draw + count - 1``, in one tensor."""
        if count is None and draw < self.BLOCK:
            return self._packed[:, 1 + draw]
        last = draw + (count or 1)
        if last <= self.BLOCK:
            bits = self._packed[:, 1 + draw : 1 + last]
        else:
            base = self._packed[:, 0]
            bits = _draws(base, torch.arange(draw, last, device=base.device))
        return bits if count is not None else bits[:, 0]

    def integers(self, draw: int, high: int, count: int | None = None) -> Tensor:
        """(B,) int64 in [0, high), ``high`` ≤ 2^31: Lemire's multiply-shift of the 32 bits; with ``count``,
        (B, count), as ``bits``."""
        return (self.bits(draw, count) * high) >> 32

    def uniform(self, draw: int) -> Tensor:
        """(B,) float32 in [0, 1), from the top 24 bits (exact in float32)."""
        return (self.bits(draw) >> 8).float() * 2.0**-24

    def below(self, draw: int, p: float) -> Tensor:
        """(B,) bool: ``uniform(draw) < p``, the same values, compared on the bits in one op instead of four
        (on a GPU, four kernels a step)."""
        return self.bits(draw) < _uniform_threshold(p)


def _uniform_threshold(p: float) -> int:
    """The bits below which ``uniform`` is below ``p``: uniform is (bits >> 8)·2^-24, exact in float32, and
    torch compares it with ``p`` rounded to float32, so (bits >> 8) < ⌈p·2^24⌉ decides, which is
    bits < ⌈p·2^24⌉·2^8."""
    return math.ceil(float(np.float32(p)) * 2**24) << 8


def random_crop_flip(
    x: Tensor,
    padding: int,
    flip_p: float = 0.5,
    generator: torch.Generator | None = None,
    rand: SampleRandom | None = None,
) -> Tensor:
    """torchvision's RandomCrop(size, padding) then RandomHorizontalFlip(flip_p), per image, batched.

    Zero-pads (black, as torchvision pads PIL images) and copies each output row, ``w`` contiguous pixels,
    from its place in the padded batch with one ``index_select`` over a sliding-window view of the
    buffer: a row-sized memcpy each, where indexing the ``(B, C, h, w)`` windows element by element
    costs several times more on a CPU. Flips come from a mirrored copy of the padded batch: the window at
    column offset ``dx`` of the mirror is the mirror of the window at ``2·padding - dx``, so crops stay
    uniform.
    Faster on CPU than one strided-window gather, which matters when the model is as small as LeNet
    (docs/benchmarks.md: benchmarks/bench_lenet_throughput.py).

    The draws come from ``rand`` (per sample: crop row 0, column 1, flip 2) when given, else from
    ``generator`` (or the global RNG) for the whole batch.
    """
    if padding == 0:  # no crop to draw: a flip alone needs no padded copies
        return random_hflip(x, flip_p, generator=generator, rand=rand)
    b, c, h, w = x.shape
    n = 2 * padding + 1
    if rand is not None:
        dy, dx = rand.integers(0, n, count=2).unbind(1)  # draws 0 and 1 in one op
        flip = rand.below(2, flip_p)
    else:
        dy, dx = torch.randint(0, n, (2, b), device=x.device, generator=generator)
        flip = torch.rand(b, device=x.device, generator=generator) < flip_p
    source = F.pad(x, (padding, padding, padding, padding))  # (B, C, H2, W2), contiguous
    h2, w2 = h + 2 * padding, w + 2 * padding
    image_starts, row_starts = _crop_rows(b, c, h, h2, w2, x.device)
    corner = image_starts + dy * w2 + dx  # (B,): where image i's crop starts in the flat padded batch
    if flip_p > 0:
        source = torch.cat([source, source.flip(-1)])  # image i mirrored is image B + i
        corner = corner.add_(flip, alpha=b * c * h2 * w2)
    flat = source.reshape(-1)
    # rows[k] is the w pixels starting at flat[k]: a view, every start position of the buffer.
    rows = flat.as_strided((flat.numel() - w + 1, w), (1, 1))
    # Output row (i, ch, y) starts at image i's crop corner + channel ch's plane + y padded rows down.
    return rows.index_select(0, (corner.view(b, 1, 1) + row_starts).view(-1)).view(b, c, h, w)


@functools.lru_cache(maxsize=16)
def _crop_rows(b: int, c: int, h: int, h2: int, w2: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """The parts of ``random_crop_flip``'s row starts that only the shapes decide, made once per shape and
    device rather than as four kernels a batch: each image's start in the flat (B, C, H2, W2) padded batch,
    (B,), and each output row's offset from its image's crop corner, (1, C, H): channel planes + rows."""
    image_starts = torch.arange(b, device=device) * (c * h2 * w2)
    plane = torch.arange(c, device=device).view(1, c, 1) * (h2 * w2)
    return image_starts, plane + torch.arange(h, device=device).view(1, 1, h) * w2


def random_hflip(
    x: Tensor, p: float = 0.5, generator: torch.Generator | None = None, rand: SampleRandom | None = None
) -> Tensor:
    """Each image mirrored with probability ``p``: draw 2 of ``rand`` (as in ``random_crop_flip``), else
    one draw per image from ``generator``."""
    if rand is not None:
        flip = rand.below(2, p)
    else:
        flip = torch.rand(x.shape[0], device=x.device, generator=generator) < p
    return torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)


# ---- MixUp / CutMix ----------------------------------------------------------------------------------
# Own functions, not torchvision's v2.MixUp / v2.CutMix: those draw λ (torch.distributions.Beta.sample) and
# the box (torch.randint) from torch's global RNG and take no generator, so every rank would mix alike
# (seed_everything seeds them all the same) and a resumed batch would mix differently. Here the draws come
# from one RNG per batch, seeded by (seed, rank, epoch, batch) (base.py: ``mixing_rng``). Mixing pairs
# each image with its neighbour in the same device's batch, so it is the one augmentation that differs
# between 1 × 2b and 2 × b: which images meet depends on how the global batch is split (README says so).
# It is Python's ``random.Random``: its ``betavariate`` is the Beta sampler that torch offers with a
# generator only under a private name, and a few host scalars never make a GPU wait (a draw from a CUDA
# generator read back with .item() would).

MixParams = tuple[float, tuple[int, int, int, int] | None]  # (λ, CutMix box (x1, y1, x2, y2) or None)


def draw_mix(
    height: int, width: int, mixup_alpha: float, cutmix_alpha: float, rng: random.Random
) -> MixParams:
    """One batch's mixing, as torchvision draws it: MixUp's λ ~ Beta(α, α); CutMix's box centred uniformly,
    sides √(1-λ) of the image's, clipped at the edges, and λ then the share of the image outside the box.
    With both on, one of the two per batch with p = 1/2 (torchvision's classification reference applies
    ``RandomChoice([MixUp, CutMix])`` to each batch)."""
    cutmix = cutmix_alpha > 0 and (mixup_alpha <= 0 or rng.random() < 0.5)
    alpha = cutmix_alpha if cutmix else mixup_alpha
    lam = rng.betavariate(alpha, alpha)
    if not cutmix:
        return lam, None
    cx, cy = rng.randrange(width), rng.randrange(height)
    half = 0.5 * math.sqrt(1.0 - lam)
    half_w, half_h = int(half * width), int(half * height)
    x1, x2 = max(cx - half_w, 0), min(cx + half_w, width)
    y1, y2 = max(cy - half_h, 0), min(cy + half_h, height)
    return 1.0 - (x2 - x1) * (y2 - y1) / (height * width), (x1, y1, x2, y2)


def mix_batch(
    x: Tensor, y: Tensor, num_classes: int, lam: float, box: tuple[int, int, int, int] | None
) -> tuple[Tensor, Tensor]:
    """Mixes each image of a (B, C, H, W) float batch with the one before it (torchvision's ``roll(1, 0)``:
    the batch is already shuffled) and the (B,) labels into (B, num_classes) float32 probabilities,
    ``λ·own + (1-λ)·neighbour's``. Overwrites ``x`` (the caller's fresh normalised copy): no extra batch."""
    if box is None:  # MixUp
        x = x.lerp_(x.roll(1, 0), 1.0 - lam)  # x + (1-λ)(x' - x) = λ·x + (1-λ)·x'
    else:  # CutMix: the box comes from the neighbour (the right side is a copy before the write)
        x1, y1, x2, y2 = box
        x[..., y1:y2, x1:x2] = x[..., y1:y2, x1:x2].roll(1, 0)
    target = F.one_hot(y, num_classes).float()
    return x, target.lerp_(target.roll(1, 0), 1.0 - lam)
