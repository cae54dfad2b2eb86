"""Samplers: exact distributed evaluation, and a training order that resumes mid-epoch.

Evaluation: every validation/test sample is seen exactly once over all ranks.

torch's DistributedSampler pads the shards with repeated samples when the dataset size is not a multiple
of the world size, so metrics computed over all ranks count a few samples twice (Lightning only warns).
Here rank r takes samples r, r+W, r+2W, ...: shard sizes differ by at most one and nothing repeats.

Uneven shards are safe in evaluation because nothing there is a per-step collective: the metrics are
torchmetrics states reduced once at epoch end, and DDP's forward under no_grad syncs buffers only on the
first batch after training (torch's ``require_forward_param_sync``), which every rank runs since each
holds at least one sample. Training shards are padded, as torch's DistributedSampler pads them: there
every step all-reduces gradients, so every rank must run the same number of steps.

Training: ``ResumableShuffleSampler`` is torch's DistributedSampler (a permutation seeded by seed + epoch,
rank r taking every W-th index) on every device count, one process included, so one process with batch
N·b draws the same global batches as N processes with batch b, and the order does not depend on any
global RNG. It can start an epoch part-way (``start``), which is how a run stopped mid-epoch continues at
the batch where it stopped. ``SeededSampleSampler`` yields the same order as (index, seed) pairs, for
augmentation drawn in the DataLoader workers.
"""

import hashlib
from collections.abc import Iterator, Sized

from torch.utils.data import DistributedSampler

from lit_ddp.errors import UserError


class UnpaddedDistributedSampler(DistributedSampler):
    """Rank ``rank`` of ``num_replicas`` takes indices ``rank::num_replicas``, in order, without padding.

    A DistributedSampler subclass, so Lightning keeps it instead of injecting its padded one. Adapted from
    Lightning's ``UnrepeatedDistributedSampler`` (used for predict), which credits PyLaia and
    https://github.com/pytorch/pytorch/issues/25162#issuecomment-634146002.
    """

    def __init__(self, dataset: Sized, num_replicas: int, rank: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False, drop_last=False)
        if 0 < len(dataset) < num_replicas:
            # A rank without batches would skip evaluation and leave the others waiting at the metric sync.
            raise UserError(
                f"an evaluation set of {len(dataset)} sample{'s' * (len(dataset) > 1)} cannot be split over"
                f" {num_replicas} processes: use at least {num_replicas} samples or fewer devices"
            )
        self.total_size = len(dataset)
        self.num_samples = len(range(rank, self.total_size, num_replicas))

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.total_size, self.num_replicas))


class ResumableShuffleSampler(DistributedSampler):
    """Rank ``rank``'s shard of a (seed, epoch) permutation, padded to equal shards; resumable mid-epoch.

    ``__len__`` stays the whole shard (Lightning counts an epoch's batches from it); after
    ``resume(epoch, start)`` the next pass over that epoch skips its first ``start`` indices.
    """

    def __init__(self, dataset: Sized, num_replicas: int = 1, rank: int = 0, seed: int = 0) -> None:
        super().__init__(
            dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=False
        )
        self.start = 0

    def resume(self, epoch: int, start: int) -> None:
        self.epoch, self.start = epoch, start

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.start = 0  # a resume point belongs to its own epoch only
        super().set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        return iter(list(super().__iter__())[self.start :])


def stable_seed(*parts: int) -> int:
    """A 63-bit seed from integers (seed, epoch, index, ...), hashed: the same in every process, and nearby
    inputs give unrelated seeds (what each sample's augmentation draws are keyed by)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class SeededSampleSampler(ResumableShuffleSampler):
    """The same training order, as (index, seed) pairs with seed = stable_seed(data seed, epoch, index): for
    datasets that draw each sample's augmentation in the DataLoader workers (image_folder.py seeds torch's
    global RNG with it around that sample).

    The epoch travels with every index because the workers hold their own copies of the dataset (persistent
    workers keep theirs all run long): a ``set_epoch`` on the main process's copy would never reach them.
    A sample's augmentation then depends on (seed, epoch, index) alone, not on the worker, rank, batch or
    device count that handles it, so a resumed or re-sharded run augments each image as the uninterrupted
    run would have.
    """

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = self.epoch  # lazy pairs: one hash per sample as the loader asks, not an epoch's up front
        return ((i, stable_seed(self.seed, epoch, i)) for i in super().__iter__())
