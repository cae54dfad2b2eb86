"""Top-k accuracy over the whole dataset: two counts per rank, summed over the ranks at compute.

The classifier's accuracy is micro-averaged (hits over samples), so two sums are its whole state.
torchmetrics' ``MulticlassAccuracy`` computes the same value through stat scores (true and false positives
and negatives), several times the device operations of an update here, each a kernel launch on a GPU,
where LeNet's step is short enough for launches to set its pace (the counts: docs/benchmarks.md). The
states reduce by sum, like every torchmetrics state, so Lightning's epoch-end ``compute()`` reports the
whole dataset's accuracy on every rank.
"""

import torch
from torch import Tensor
from torchmetrics import Metric


class TopKAccuracy(Metric):
    """The share of samples whose label is among the ``top_k`` highest logits (``top_k=1``: the argmax).

    Picks the same classes as ``MulticlassAccuracy(num_classes, top_k, average="micro")``: ``argmax`` for
    one, ``topk`` for more (ties go the way torch's kernels break them, as there), so the two agree sample
    by sample. An epoch without a sample computes 0, as torchmetrics does.

    Fork of ``torchmetrics.classification.MulticlassAccuracy``: its micro top-k update goes through stat
    scores, several device operations a step where two sums do; goes when its micro update costs no more
    operations than two sums (``bench_step_overhead.py --device-ops``).
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False  # an update adds to the counts; the value needs no state but the sums

    def __init__(self, top_k: int = 1, **kwargs) -> None:
        super().__init__(**kwargs)
        if top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {top_k}")
        self.top_k = top_k
        self.add_state("correct", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, logits: Tensor, target: Tensor) -> None:
        """``logits`` (B, C), ``target`` (B,) class indices."""
        k = min(self.top_k, logits.shape[1])  # top-5 of 3 classes is all of them: never a crash
        if k == 1:
            hits = logits.argmax(dim=1) == target
        else:
            hits = (logits.topk(k, dim=1).indices == target.unsqueeze(1)).any(dim=1)
        # In place: ``self.correct += ...`` would also go through nn.Module.__setattr__, on every update.
        self.correct.add_(hits.sum())
        # A Python number: added as a scalar, with no host-to-device copy (no sync on a GPU).
        self.total.add_(target.shape[0])

    def compute(self) -> Tensor:
        return self.correct.float() / self.total.clamp(min=1)

    @staticmethod
    def states_from_stat_scores(states: dict[str, Tensor]) -> dict[str, Tensor]:
        """``MulticlassAccuracy``'s micro states (tp, fp, tn, fn) as this metric's: a checkpoint written
        mid-epoch by a lit_ddp whose accuracy was torchmetrics' resumes with its counts. Micro-averaged,
        tp is the hits and tp + fn the samples."""
        return {"correct": states["tp"].sum(), "total": (states["tp"] + states["fn"]).sum()}
