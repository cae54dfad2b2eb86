"""Exact distributed evaluation: every validation/test sample is seen exactly once over all ranks.

torch's DistributedSampler pads the shards with repeated samples when the dataset size is not a multiple
of the world size, so metrics computed over all ranks count a few samples twice (Lightning only warns).
Here rank r takes samples r, r+W, r+2W, ...: shard sizes differ by at most one and nothing repeats.

Uneven shards are safe in evaluation because nothing there is a per-step collective: the metrics are
torchmetrics states reduced once at epoch end, and DDP's forward under no_grad syncs buffers only on the
first batch after training (torch's ``require_forward_param_sync``), which every rank runs since each
holds at least one sample. Training keeps Lightning's padded, shuffled DistributedSampler: there every
step all-reduces gradients, so every rank must run the same number of steps.
"""

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
                f"an evaluation set of {len(dataset)} samples cannot be split over {num_replicas} processes:"
                f" use at least {num_replicas} samples or fewer devices"
            )
        self.total_size = len(dataset)
        self.num_samples = len(range(rank, self.total_size, num_replicas))

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.total_size, self.num_replicas))
