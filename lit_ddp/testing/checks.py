"""``check_ddp_invariants``: runs a model and a data module on 1 and 2 CPU processes and says which of
lit_ddp's DDP promises hold for them (the package docstring lists the checks).

Two launches of small runs on the head of the data: 2 processes × b (a fit, the same fit again, the fit
stopped after its first step and resumed, a validation), then 1 process × 2b (a fit, the same fit again,
the fit with the global RNGs re-seeded as its epoch starts, a validation). Each rank records what it did
(record.py); the checks compare the records, and a failing row's fix names the cause the records point to
(``Evidence``). Where gradients or weights differ and the records name no cause, two more launches re-run
the two fits in float64 (``run_cases``).
"""

import copy
import dataclasses
import math
import pickle
import re
import tempfile
import threading
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import cloudpickle
import torch
from lightning import LightningDataModule, LightningModule
from torch import nn

from lit_ddp.data import ImageDataModule
from lit_ddp.errors import UserError
from lit_ddp.models.classifier import check_batch_of_one, fails_on_one
from lit_ddp.testing.config import instantiate
from lit_ddp.testing.launch import LaunchError, LaunchStopped, free_ports, launch
from lit_ddp.testing.record import DROPOUT, load
from lit_ddp.testing.worker import Job, user_error_file

# ‖Δg‖/‖g‖ of 2 × b vs 1 × 2b first-step gradients: float rounding stays well below (deeper networks and
# SyncBatchNorm round more: README, docs/benchmarks.md); a broken invariant (per-device BatchNorm, other
# crops, a loss averaged per device) lands orders of magnitude above.
GRAD_RTOL = 1e-4
METRIC_RTOL = 1e-5  # evaluation metrics: accuracies come out identical; losses within float rounding
SMALL_BN_BATCH = 32  # below this per-device batch, BatchNorm's per-device statistics get noisy
WORLD_SIZES = (2, 4, 8)  # device counts the padding warning considers, with the configured one


class DDPInvariantWarning(UserWarning):
    """Something that keeps N processes from training exactly what one process would (the report's rows)."""


@dataclass
class Row:
    key: str  # short name: report["augmentation"]
    check: str  # what the table calls it
    holds: bool
    measured: str
    fix: str = ""
    warning: bool = False  # a warning row: reported, never fails the report
    # Failed with no cause in the records: float32 rounding may be it (run_cases re-runs it in float64).
    rounding: bool = False


@dataclass
class Report:
    """The checks' verdicts. ``ok``: every check holds (warnings aside); ``table()`` for a failure message,
    which names the ``seed`` the runs took (a config's ``seed_everything: true`` draws one each time)."""

    rows: list[Row] = field(default_factory=list)
    seed: int | None = None

    @property
    def ok(self) -> bool:
        return all(r.holds for r in self.rows if not r.warning)

    @property
    def warnings(self) -> list[Row]:
        return [r for r in self.rows if r.warning and not r.holds]

    def __getitem__(self, key: str) -> Row:
        for row in self.rows:
            if row.key == key:
                return row
        raise KeyError(f"no check or warning {key!r} in this report: {[r.key for r in self.rows]}")

    def table(self) -> str:
        """check | holds? | measured | what to change, one line per check and warning."""
        head = ("check", "holds?", "measured", "what to change")
        lines = [
            (r.check, ("yes" if r.holds else "WARN" if r.warning else "NO"), r.measured, r.fix or "-")
            for r in self.rows
        ]
        widths = [max(len(x[i]) for x in [head, *lines]) for i in range(3)]
        fmt = lambda x: " | ".join(c.ljust(w) for c, w in zip(x[:3], widths, strict=True)) + " | " + x[3]  # noqa: E731
        seed = [] if self.seed is None else [f"seed of these runs: {self.seed}"]
        return "\n".join(
            [fmt(head), "-+-".join("-" * w for w in widths) + "-+-" + "-" * 14, *map(fmt, lines), *seed]
        )


# ---- the runs ------------------------------------------------------------------------------------------


def _model(model) -> LightningModule:
    if isinstance(model, LightningModule):
        return model
    if isinstance(model, type) and issubclass(model, LightningModule):
        return model()
    if isinstance(model, dict) and "class_path" in model:
        return instantiate(model, LightningModule)
    network = model if isinstance(model, type) else type(model)
    if issubclass(network, nn.Module):  # the network alone, as a project's net.py holds it
        raise UserError(
            f"model={network.__name__} is a network (an nn.Module), not a LightningModule: pass the model fit"
            f" trains, lit_ddp.models.ImageClassifier(net={network.__name__}, num_classes=N), or"
            " lit_ddp.testing.build(config)'s"
        )
    raise UserError(
        f"model={model!r} is not a LightningModule: pass an instance, a class, or a"
        ' {"class_path": ..., "init_args": {...}} dict'
    )


def _datamodule(datamodule) -> ImageDataModule:
    if isinstance(datamodule, type) and issubclass(datamodule, ImageDataModule):
        datamodule = datamodule()
    elif isinstance(datamodule, dict) and "class_path" in datamodule:
        datamodule = instantiate(datamodule, LightningDataModule)
    if not isinstance(datamodule, ImageDataModule):
        raise UserError(
            f"datamodule={datamodule!r} is not a lit_ddp ImageDataModule: the checks read its samplers and"
            " augmentation; subclass lit_ddp.data.ImageDataModule"
        )
    return datamodule


def without_dropout(model: nn.Module) -> list[str]:
    """Sets every dropout layer's p to 0 (in place) and returns them as ``name: Dropout(p=...)``.

    Dropout draws its masks from torch's global RNG per device batch: 2 × b and 1 × 2b draw other masks,
    and a resumed run other masks than the uninterrupted one, so the exact comparisons would fail on the
    masks alone. The checks run the rest of the model exactly; a warning row names the layers."""
    found = []
    for name, module in model.named_modules():
        if isinstance(module, DROPOUT) and module.p > 0:
            found.append(f"{name}: {type(module).__name__}(p={module.p:g})")
            module.p = 0.0
    return found


def _not_picklable(err: Exception) -> UserError:
    return UserError(
        f"the model or data module cannot be pickled for the 2-process runs ({type(err).__name__}: {err}):"
        " keep what cannot be pickled (open files, locks, threads, generators) out of their attributes until"
        " setup()"
    )


def _copies(model: LightningModule, dm: ImageDataModule) -> tuple[LightningModule, ImageDataModule]:
    """Deep copies for the kit to change (dropout off, the batch size): the caller's objects stay as given."""
    try:
        return copy.deepcopy(model), copy.deepcopy(dm)
    except Exception as err:  # what deepcopy cannot copy, no pickler takes to the ranks either
        raise _not_picklable(err) from err


def _payload(model: LightningModule, dm: ImageDataModule) -> bytes:
    # By value where pickle goes by name: classes defined in a script (its __main__), a notebook or a test
    # function cannot be imported by the ranks' processes; pickle.loads there rebuilds them.
    try:
        return cloudpickle.dumps((model, dm))
    except Exception as err:
        raise _not_picklable(err) from err


# ---- comparisons ----------------------------------------------------------------------------------------


def relative_error(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """‖a − b‖ / ‖b‖ over all tensors together (L2): how far gradient ``a`` is from ``b``, relative to its
    size. An element-wise ratio would be ruled by the tensors whose gradient is near zero."""
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in b)
    den = sum(float(b[k].double().pow(2).sum()) for k in b)
    return math.sqrt(num / den) if den else math.sqrt(num)


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    keys = [k for k in b if b[k].is_floating_point()]
    return max([0.0] + [float((a[k].double() - b[k].double()).abs().max()) for k in keys])


def augmented_by_sample(ranks: list[dict]) -> dict[int, torch.Tensor]:
    """Sample index → that sample as the step saw it in the first training batch, over all ranks."""
    return {i: x for r in ranks for i, x in zip(r["aug_index"][0], r["aug"][0], strict=True)}


def differing(a: dict[int, torch.Tensor], b: dict[int, torch.Tensor]) -> int:
    """How many samples of ``b`` ``a`` lacks or holds otherwise (byte for byte)."""
    return sum(i not in a or not torch.equal(a[i], x) for i, x in b.items())


@dataclass
class Evidence:
    """What the records say about causes, for the rows' fixes: each row names the cause the evidence points
    to, and sends the reader to the row that shows it."""

    data_differs: bool = False  # the training samples themselves differ between the runs compared
    # The ranks' training batches hold other samples than 1 process's (shards that overlap, an order that
    # depends on the rank or the device count): not an augmentation or a model difference.
    batches_differ: bool = False
    # Augmented samples that change when the global RNGs are re-seeded (0 where not measured): a checkpoint
    # does not hold those RNGs' state, so a resumed run draws from them anew.
    global_rng: int = 0
    aug_differs: int = 0  # samples augmented differently on 2 processes than on 1
    forward_rng: list[int] = field(default_factory=list)  # steps whose forward drew from torch's global RNG
    loose: list[str] = field(default_factory=list)  # "net.calls (0 → 2)": changed by training, unsaved

    @property
    def forward_rng_fix(self) -> str:
        return (
            f"the model draws from torch's global RNG in forward or the loss ({len(self.forward_rng)} steps):"
            " each device batch and a resumed run draw other numbers; draw them from a generator seeded by"
            " (seed, sample index), or expect 2 × b and 1 × 2b to agree in distribution only"
        )


def digests(record: dict, split: str) -> list[str] | None:
    """The sample hashes a run's rank recorded for ``split`` (record.content), or None."""
    found = record.get("content", {}).get(split)
    return found["digests"] if found else None


def _count_other(a: list[str] | None, b: list[str] | None) -> int:
    if a is None or b is None:
        return 0
    return sum(x != y for x, y in zip(a, b, strict=True))


SPLIT_NAMES = {"train_set": "training", "val_set": "validation"}


def _data(runs: dict[str, list[dict]], dataset: str) -> tuple[Row, bool]:
    """The un-augmented samples each index returns, by hash: stable within a process, and the same on
    each rank, in two runs of the same seed and on 1 process. Returns the row and whether the training
    samples differ anywhere."""
    problems: list[tuple[str, str]] = []
    counted = []
    train_differs = False
    for split, name in SPLIT_NAMES.items():
        recs = runs["full"] if split == "train_set" else runs.get("val2")
        ones = runs.get("full1") if split == "train_set" else runs.get("val1")
        if not recs or digests(recs[0], split) is None:
            continue
        n = len(digests(recs[0], split))
        counted.append(f"{n} {name}")
        everything = [r for name_ in runs for r in runs[name_] if split in r.get("content", {})]
        unstable = max(len(r["content"][split]["unstable"]) for r in everything)
        again = runs.get("again") if split == "train_set" else None
        again1 = runs.get("again1") if split == "train_set" else None
        by_runs = max(
            _count_other(digests(recs[0], split), digests(again[0], split)) if again else 0,
            _count_other(digests(ones[0], split), digests(again1[0], split)) if ones and again1 else 0,
        )
        by_ranks = _count_other(digests(recs[0], split), digests(recs[1], split))
        by_world = _count_other(digests(recs[0], split), digests(ones[0], split)) if ones else 0
        if unstable:
            problems.append(
                (
                    f"{unstable} of {n} {name} samples differ when read twice in one process",
                    f"the {name} Dataset returns another sample each time it is read (a random draw in"
                    " __getitem__): keep it a function of the index; augment in augment_batch with its rand",
                )
            )
        elif by_runs:
            problems.append(
                (
                    f"two runs with the same seed hold other {name} samples ({by_runs} of {n})",
                    f"the {name} split differs between runs: load_split must depend on the seed only (an"
                    " unseeded generator, Generator.seed() or the clock draws anew each run): seed it from"
                    " self.seed",
                )
            )
        elif by_ranks:
            problems.append(
                (
                    f"rank 1's {name} split differs from rank 0's ({by_ranks} of {n} samples)",
                    f"rank 1's {name} split differs from rank 0's: load_split and its Dataset must depend on"
                    " the seed only, not on the rank",
                )
            )
        elif by_world:
            problems.append(
                (
                    f"the {name} split on 1 process differs from 2 processes' ({by_world} of {n} samples)",
                    f"the {name} split depends on the device count: load_split must depend on the seed only",
                )
            )
        if split == "train_set":
            train_differs = bool(unstable or by_runs or by_ranks or by_world)
    holds = not problems
    if not counted:
        measured = "not measured: no split recorded its samples"
    elif holds:
        measured = f"{' + '.join(counted)} samples hashed: the same on each rank, run and device count"
    else:
        measured = "; ".join(m for m, _ in problems)
    fix = problems[0][1] if problems else ""
    return Row("data", "samples same on each rank, run and device count", holds, measured, fix), train_differs


# ‖Δw‖ / ‖w − w₀‖ of the weights after each step, 2 × b vs 1 × 2b: float rounding stays orders of magnitude
# below; above GRAD_RTOL since Adam's first steps divide a gradient by its own size, and a near-zero gradient
# whose sign rounding flips moves its weight by 2·lr.
STEP_RTOL = 1e-3


def _optim_settings(two: dict, one: dict) -> str:
    """The first optimizer setting (lr, betas, ...) that differs between the runs at the same step:
    ``lr 0.006 on 2 processes, 0.003 on 1 (step 1)``, or ""."""
    steps = zip(two.get("optim", []), one.get("optim", []), strict=False)  # a run may stop sooner
    for step, (groups2, groups1) in enumerate(steps, 1):
        for g2, g1 in zip(groups2, groups1, strict=False):
            for key in sorted(g1.keys() & g2.keys(), key=lambda k: (k != "lr", k)):  # lr first
                if g1[key] != g2[key]:
                    shown = [f"{v:.6g}" if isinstance(v, float) else str(v) for v in (g2[key], g1[key])]
                    return f"{key} {shown[0]} on 2 processes, {shown[1]} on 1 (step {step})"
    return ""


def _steps(two: list[dict], one: dict, bn_unsynced: bool, grads: Row, why: Evidence) -> Row:
    """Outcomes, not only the first gradient: the weights and buffers after each step, 2 × b vs 1 × 2b, and
    the ranks' against each other at the end."""
    init = one["init"]
    worst, worst_step, worst_key = 0.0, 0, ""
    exact = ""  # the first integer entry (a counter buffer) that differs: no rounding can explain it
    for step, (a, b) in enumerate(zip(two[0]["step_state"], one["step_state"], strict=False), 1):
        if not exact:
            exact = _integer_difference(a, b, step)
        keys = [k for k in b if b[k].is_floating_point()]
        num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in keys)
        den = sum(float((b[k].double() - init[k].double()).pow(2).sum()) for k in keys if k in init)
        error = math.sqrt(num / den) if den else math.sqrt(num)
        if error > worst:
            key = max(keys, key=lambda k: float((a[k].double() - b[k].double()).abs().max()))
            worst, worst_step, worst_key = error, step, key
    skipped = set(two[0].get("bn_buffers", [])) if bn_unsynced else set()  # the BatchNorm row's
    final0, final1 = two[0]["final"], two[1]["final"]
    ranks_differ = [k for k in final0 if k not in skipped and not torch.equal(final0[k], final1[k])]
    buffers = {k for k, _ in _named_buffers(final0, two[0])}
    settings = _optim_settings(two[0], one)
    holds = worst <= STEP_RTOL and not ranks_differ and not settings and not exact
    measured = (
        f"{len(one['step_state'])} steps: weights differ by at most {worst:.1e} (‖Δw‖/‖w − w₀‖; limit"
        f" {STEP_RTOL:.0e})"
    )
    if worst > STEP_RTOL:
        measured += f", most in {worst_key} after step {worst_step}"
    if settings:
        measured += f"; optimizer {settings}"
    if exact:
        measured += f"; {exact}"
    measured += (
        f"; ranks at the end: {', '.join(ranks_differ[:3])} differ"
        if ranks_differ
        else "; ranks at the end: identical"
    )
    fix, rounding = "", False
    if not holds:
        differing_buffers = [k for k in ranks_differ if k in buffers]
        if settings:
            fix = (
                f"the optimizer's {settings.split()[0]} depends on the device count at the same global"
                " batch: derive it from the global batch (per-device batch × devices), not world_size alone"
            )
        elif differing_buffers:
            fix = (
                f"buffer {differing_buffers[0]} differs between the ranks: it is updated from each device's"
                " own batch (DDP broadcasts rank 0's before each forward, checkpoints save rank 0's); update"
                " it from all ranks' batches (all_reduce) or keep it out of forward"
            )
        elif ranks_differ:
            fix = (
                f"{ranks_differ[0]} differs between the ranks: something updates weights outside the"
                " optimizer's step or skips DDP's gradient sync"
            )
        elif not grads.holds:
            fix, rounding = "the first step's gradients already differ: see 'grads'", grads.rounding
        elif exact:
            fix = (
                f"buffer {exact.split()[0]} depends on the per-device batch or the device count (a count of"
                " the device's samples, a statistic of its batch): count the global batch (per-device batch"
                " × devices) or derive it from trainer.global_step"
            )
        elif why.forward_rng:
            fix = why.forward_rng_fix
        else:
            rounding = True
            fix = (
                f"with the same first gradients, {worst_key} parts after step {worst_step}: the optimizer,"
                " its schedule or a buffer depends on the per-device batch or the device count"
            )
    check = "weights after each step 2×b = 1×2b, ranks alike"
    return Row("steps", check, holds, measured, fix, rounding=rounding)


def _integer_difference(
    two: dict[str, torch.Tensor],
    one: dict[str, torch.Tensor],
    step: int,
    runs: tuple[str, str] = ("on 2 processes", "on 1"),
) -> str:
    """``net.seen 16 on 2 processes, 32 on 1 (step 2)``: the first integer entry of the states after
    ``step`` that differs between 2 × b and 1 × 2b (or the two ``runs`` named), or "". The weights'
    tolerance is for float rounding, which integers do not have: they compare exactly."""
    for key, value in one.items():
        if value.is_floating_point() or key not in two or torch.equal(two[key], value):
            continue
        shown = [str(v.item()) if v.numel() == 1 else f"a {tuple(v.shape)} tensor" for v in (two[key], value)]
        return f"{key} {shown[0]} {runs[0]}, {shown[1]} {runs[1]} (step {step})"
    return ""


def _named_buffers(state: dict[str, torch.Tensor], record: dict) -> list[tuple[str, torch.Tensor]]:
    """The entries of a state dict that are buffers: every key but the parameters' (record.param_names)."""
    params = set(record.get("param_names", ()))
    return [(k, v) for k, v in state.items() if k not in params]


def grad_scale(two: dict[str, torch.Tensor], one: dict[str, torch.Tensor]) -> float | None:
    """k where gradients ``two`` are k × ``one`` to GRAD_RTOL with k ≠ 1 (a loss summed, not averaged,
    gives 1/world): else None."""
    den = sum(float(one[k].double().pow(2).sum()) for k in one)
    if not den:
        return None
    k = sum(float((two[n].double() * one[n].double()).sum()) for n in one) / den
    if abs(k - 1) < 1e-3 or k <= 0:
        return None
    return k if relative_error({n: two[n] / k for n in one}, one) <= GRAD_RTOL else None


def _grads(two: list[dict], one: dict, sync: bool, bn: list[str], why: "Evidence") -> Row:
    b = len(two[0]["aug_index"][0])
    error = relative_error(two[0]["grads"], one["grads"])
    ranks_agree = relative_error(two[0]["grads"], two[1]["grads"]) == 0
    holds = error <= GRAD_RTOL and ranks_agree
    measured = f"relative difference {error:.1e} (‖Δg‖/‖g‖, 2 × {b} vs 1 × {2 * b}; limit {GRAD_RTOL:.0e})"
    fix, rounding = "", False
    scale = grad_scale(two[0]["grads"], one["grads"]) if not holds else None
    if scale is not None:
        measured += f"; 2-process gradients are {scale:.4g} × the 1-process ones"
    if not holds:
        if bn and not sync:
            fix = "BatchNorm normalises per device: set trainer.sync_batchnorm=true (works on CPU too)"
        elif scale is not None and abs(scale * len(two) - 1) < 1e-3:
            fix = (
                f"the loss is summed over the batch, not averaged (gradients scaled by exactly 1/{len(two)}):"
                " average it (F.cross_entropy's default reduction='mean')"
            )
        elif why.data_differs:
            fix = "the two runs trained on other samples: see 'data'"
        elif why.batches_differ:
            fix = "the ranks' batches hold other samples than 1 process's: see 'shards'"
        elif why.aug_differs:
            fix = "the two runs trained on differently augmented images: see 'augmentation'"
        elif why.forward_rng:
            fix = why.forward_rng_fix
        else:
            rounding = ranks_agree  # the ranks, fed the same all-reduced gradients, round alike
            fix = (
                "something in forward or the loss depends on the per-device batch (a statistic over the"
                " batch: a home-made batch norm, a per-device mean): compute it over all ranks or per sample"
            )
    return Row("grads", "first-step gradients 2×b = 1×2b", holds, measured, fix, rounding=rounding)


def _relative_difference(got: float, reference: float) -> float:
    """|got - reference| relative to the reference (absolute below 1); NaN in one run only is infinitely far
    (a NaN difference would compare False with every bound), NaN in both the same value."""
    if math.isnan(got) and math.isnan(reference):
        return 0.0
    diff = abs(got - reference) / max(1.0, abs(reference))
    return math.inf if math.isnan(diff) else diff


def dropout_in_validation(train_mode: list[str], dropout: list[str]) -> list[str]:
    """The dropout layers (``without_dropout``'s, run at p=0 here) that a validation ran in training mode
    (``train_mode``: record's ``eval_train_mode``): in the user's runs they draw masks there."""
    zeroed = {d.split(":")[0] for d in dropout}
    return [m for m in train_mode if m.split(" (")[0] in zeroed]


def _metrics(two: list[dict], one: dict, shards_explain: bool = False, dropout: list[str] = ()) -> Row:
    """``dropout``: the layers the checks ran at p=0 (``without_dropout``), which a validation in training
    mode would otherwise draw masks in."""
    reference = one["val_logged"][-1]  # every metric the validation logged, not only lit_ddp's val/*
    if not reference:  # a "yes" here would vouch for metrics nobody logged
        return Row(
            "metrics",
            "validation metrics 1 = 2 processes",
            False,  # with warning=True: WARN in the table, never a failure (a model may log none)
            "no validation metric logged: nothing to compare",
            "log the validation metrics with self.log in validation_step to have them checked",
            warning=True,
        )
    worst, name, differ = 0.0, "", set()
    for rank in two:
        got = rank["val_logged"][-1]
        for key in reference.keys() | got.keys():
            if key not in got or key not in reference:
                worst, name = math.inf, f"{key} logged on one run only"
                continue
            diff = _relative_difference(got[key], reference[key])
            if diff > METRIC_RTOL:
                differ.add(key)
            if diff > worst:
                worst, name = (
                    diff,
                    f"{key}: {got[key]:.6g} on rank {rank['rank']} of 2, {reference[key]:.6g} on 1",
                )
    train_mode = one.get("eval_train_mode", [])  # the same model in every run
    masked = dropout_in_validation(train_mode, dropout)
    draws = sum(r.get("eval_rng", 0) for r in [*two, one])
    holds = worst <= METRIC_RTOL and not masked
    measured = f"{len(reference)} val metrics, largest relative difference {worst:.1e}"
    if worst > METRIC_RTOL:
        measured += f" ({name})"
    if train_mode:
        measured += f"; in training mode during validation: {', '.join(train_mode[:3])}"
        measured += " (dropout at p=0 in these checks)" if masked else ""
    if draws:
        measured += f"; validation steps drew from torch's global RNG ({draws} batches)"
    fix = ""
    if not holds and shards_explain:
        fix = "the ranks evaluate other samples than one process: see 'shards'"
    elif not holds and train_mode:
        fix = (
            f"validation runs {train_mode[0].split(' (')[0]} in training mode (a .train() in a validation"
            " hook): dropout then draws masks, and BatchNorm normalises by each device's batch, so the"
            " metrics change with the device count; evaluate in eval mode, which Lightning sets"
        )
    elif not holds and draws:
        fix = (
            "the model draws from torch's global RNG in validation (dropout left on in evaluation:"
            " F.dropout(x, p) without training=self.training): each process draws other numbers, so the"
            " metrics change with the device count; draw nothing at random in evaluation"
        )
    elif not holds and differ and all(_same_on_ranks(two, key) for key in differ):
        # Each rank logged the same value: reduced over the ranks, from other outputs than 1 process's.
        fix = (
            "the ranks agree, so the metrics are reduced, but not with 1 process: the model's output for a"
            " sample depends on the rest of its device batch (a statistic over the batch in forward or the"
            " loss): compute it per sample or over all ranks"
        )
    elif not holds:
        fix = "reduce every metric over the ranks: torchmetrics logged as objects, or sync_dist=True"
    return Row("metrics", "validation metrics 1 = 2 processes", holds, measured, fix)


def _same_on_ranks(two: list[dict], key: str) -> bool:
    """Whether every rank of a validation logged ``key`` with the same value (to METRIC_RTOL)."""
    values = [r["val_logged"][-1].get(key) for r in two]
    if any(v is None for v in values):
        return False
    return all(abs(v - values[0]) <= METRIC_RTOL * max(1.0, abs(values[0])) for v in values)


def _shard_content(ranks: list[dict], one: dict | None, split: str, shards: list[list[int]]) -> int | None:
    """How many samples the ranks read (each its shard, by its own hashes) that the 1-process run's whole
    split does not hold as many times; None where no hashes were recorded."""
    whole = digests(one, split) if one is not None else None
    own = [digests(r, split) for r in ranks]
    if whole is None or any(d is None for d in own):
        return None
    got = Counter(d[i] for d, shard in zip(own, shards, strict=True) for i in shard)
    return sum((got - Counter(whole)).values())


def other_batch(two: list[dict], one: dict) -> tuple[int, int]:
    """(k, n): the first training batch k (from 1) whose samples on 2 processes, the ranks' batch k together,
    are not the 1-process batch k's, and how many of its samples differ; (0, 0) where every batch matches.
    2 × b trains what 1 × 2b does only where rank r reads positions r, r + 2, ... of the one (seed, epoch)
    order: shards that overlap, or an order seeded by the rank or the device count, give other batches."""
    ranks, whole = [r["samples"][0][1] for r in two], one["samples"][0][1]
    b = len(two[0]["aug_index"][0]) if two[0]["aug_index"] else 0
    for k in range(len(whole) // (2 * b) if b else 0):
        got = Counter(i for shard in ranks for i in shard[k * b : (k + 1) * b])
        if n := sum((Counter(whole[2 * k * b : 2 * (k + 1) * b]) - got).values()):
            return k + 1, n
    return 0, 0


def train_shards(two: list[dict], train_samples: int) -> tuple[int, int]:
    """(shared, missing): training samples both ranks read in their epoch, and samples neither read."""
    shards = [set(r["samples"][0][1]) for r in two]
    return len(shards[0] & shards[1]), train_samples - len(shards[0] | shards[1])


ORDER_FIX = (
    "shard one (seed, epoch) order over the ranks, rank r of W reading its positions r, r + W, ... (lit_ddp's"
    " train_sampler does; no seed or order that depends on the rank or the device count)"
)


def _shards(
    two: list[dict],
    val_two: list[dict],
    train_samples: int,
    val_samples: int,
    one: dict | None = None,
    val_one: dict | None = None,
) -> tuple[Row, bool]:
    """The row, and whether its evaluation part fails (the metric row then points here)."""
    shards = [r["samples"][0][1] for r in two]
    shared, missing = train_shards(two, train_samples)
    batch, batch_other = other_batch(two, one) if one is not None else (0, 0)
    evals = [r["eval_indices"]["val"][0] for r in val_two]
    read = sum(map(len, evals))
    repeats, unread = read - len(set().union(*evals)), val_samples - len(set().union(*evals))
    other = _shard_content(two, one, "train_set", shards)
    val_other = _shard_content(val_two, val_one, "val_set", evals)
    holds = not (shared or missing or batch or repeats or unread or other or val_other)
    measured = (
        f"train: shards of {'+'.join(str(len(s)) for s in shards)}, {shared} shared, {missing} missing"
        + (f", batch {batch}: {batch_other} samples not in 1 process's batch {batch}" if batch else "")
        + f"; val: {val_samples} samples read {read} times over {'+'.join(str(len(e)) for e in evals)}"
        f" ({repeats} repeats, {unread} unread)"
    )
    if other or val_other:
        measured += f"; by content: {other or 0} training, {val_other or 0} validation samples"
        measured += " not among 1 process's"
    elif other is not None or val_other is not None:
        measured += "; content as on 1 process"
    fix = ""
    if repeats or unread:
        fix = "evaluate with lit_ddp's UnpaddedDistributedSampler (ImageDataModule._eval_sampler): no padding"
    elif shared or missing or batch:
        fix = ORDER_FIX
    elif not holds:
        fix = "the ranks read other samples than one process at the same indices: see 'data'"
    row = Row("shards", "train shards disjoint+covering, eval unpadded", holds, measured, fix)
    return row, bool(repeats or unread or val_other)


def _augmentation(
    dm: ImageDataModule,
    two: list[dict],
    one: dict,
    rng: tuple | None,
    mixing: bool,
    data_differs: bool,
    batches_differ: bool = False,
) -> tuple[Row, int]:
    seen2, seen1 = augmented_by_sample(two), augmented_by_sample([one])
    absent = sum(i not in seen2 for i in seen1)  # other samples in the first batches: not augmentation's
    differ = differing(seen2, seen1) - absent
    holds = differ == 0 and absent == 0
    measured = f"{differ} of {len(seen1) - absent} samples augmented differently on 2 processes than on 1"
    if absent:
        measured += f"; {absent} of 1 process's first batch not in the ranks' first batches"
    if not dm.augment:
        measured += " (augmentation off)"
    if mixing:
        measured += "; MixUp/CutMix left out: they pair samples inside one device's batch (README)"
    fix = ""
    changed, _, unreproducible = rng or (0, 0, 0)
    if not holds:
        if data_differs:
            fix = "the samples differ before augmentation: see 'data'"
        elif absent and not differ:
            fix = "the ranks' batches hold other samples than 1 process's: see 'shards'"
        elif unreproducible:
            fix = (
                "it differs between two runs with the same seed (an unseeded generator, the clock): take"
                " every random number from augment_batch's rand"
            )
        elif changed:
            fix = "it draws from the global RNG: take every random number from augment_batch's rand"
        else:
            fix = (
                "it depends on the rank or batch: take every random number from augment_batch's rand"
                " (SampleRandom: seed, epoch, sample index)"
            )
    return Row("augmentation", "augmentation same on any device count", holds, measured, fix), differ


def _resumed_diff(full: list[dict], resumed: list[dict]) -> float:
    """How far the resumed fit's final weights are from the uninterrupted fit's (inf: it stopped short)."""
    if resumed[0]["global_step"] != full[0]["global_step"]:
        return float("inf")
    return max(max_diff(r["final"], f["final"]) for r, f in zip(resumed, full, strict=True))


def _resumed_integers(full: list[dict], resumed: list[dict]) -> str:
    """``epoch_steps 1 resumed, 2 uninterrupted (step 2)``: the first integer entry (a counter buffer) of
    the resumed fit's final state that differs from the uninterrupted fit's, or "". ``max_diff`` reads the
    floating-point entries only, and a counter need not move any weight within the checks' few steps."""
    runs = ("resumed", "uninterrupted")
    for r, f in zip(resumed, full, strict=True):
        if found := _integer_difference(r["final"], f["final"], f["global_step"], runs):
            return found
    return ""


def loose_changes(record: dict) -> list[str]:
    """``net.calls (0 → 2)``: the attributes outside ``state_dict`` a fit changed (record.loose_state)."""
    before, after = record.get("loose_init", {}), record.get("loose_final", {})
    unsaved = set(record.get("unsaved_buffers", ()))
    changed = []
    for key, value in after.items():
        old = before.get(key)
        if isinstance(value, torch.Tensor):
            if not (isinstance(old, torch.Tensor) and old.shape == value.shape and torch.equal(old, value)):
                what = (
                    "a buffer registered with persistent=False"
                    if key in unsaved
                    else "a tensor outside state_dict"
                )
                changed.append(f"{key} ({what})")
        elif key not in before or old != value:
            changed.append(f"{key} ({old} → {value})" if key in before else f"{key} (set to {value})")
    return changed


def _resume(
    mid_epoch: tuple[list[dict], ...], epoch_end: tuple[list[dict], ...], why: Evidence | None = None
) -> Row:
    """Each pair (uninterrupted, stopped, resumed): stopped inside an epoch, and at an epoch's end."""
    (full, stopped, resumed), (full_e, stopped_e, resumed_e) = mid_epoch, epoch_end
    diff, diff_e = _resumed_diff(full, resumed), _resumed_diff(full_e, resumed_e)
    exact = _resumed_integers(full, resumed) or _resumed_integers(full_e, resumed_e)
    why = why or Evidence()
    # A draw from the global RNGs per batch can match by chance in the checks' few steps, not in a run.
    differs = diff != 0 or diff_e != 0 or bool(exact) or bool(why.global_rng)
    holds = not differs
    measured = (
        f"stopped after step {stopped[0]['global_step']} of {full[0]['global_step']} (mid-epoch) and at the"
        f" end of epoch {stopped_e[0]['global_step']} of {full_e[0]['global_step']}, resumed: weights differ"
        f" by at most {diff:.1e} and {diff_e:.1e}"
    )
    if exact:
        measured += f"; {exact}"
    if why.global_rng:
        measured += f"; {why.global_rng} augmented samples follow the global RNGs (the 'global RNG' row)"
    fix = ""
    if differs and why.loose:
        fix = (
            f"{', '.join(why.loose[:3])}: changed by training outside state_dict, so a checkpoint loses it;"
            " register it as a persistent buffer (self.register_buffer) or derive it from trainer.global_step"
        )
    elif differs and why.forward_rng:
        fix = why.forward_rng_fix
    elif differs and why.data_differs:
        fix = "the runs read other samples: see 'data'"
    elif differs and why.batches_differ:
        fix = "the ranks' batches hold other samples than 1 process's: see 'shards'"
    elif why.global_rng:
        fix = (
            "a checkpoint does not hold the global RNGs' state (random, numpy, torch), so a resumed run"
            " augments with other numbers: take every random number from augment_batch's rand"
        )
    elif diff != 0:
        fix = "save the data module's position (state_dict) and draw augmentation per sample"
    elif diff_e != 0:  # DataLoader workers read the sampler when Lightning builds the resumed iterator
        fix = (
            "resume a finished epoch at the next epoch's start: the training sampler's epoch and start must"
            " be right before the loader's first iterator (DataLoader workers read it then, before set_epoch)"
        )
    elif exact:
        fix = (
            f"{exact.split()[0]} ends otherwise in the resumed run: code that runs again when a run resumes"
            " (setup, on_fit_start, on_train_start, on_train_epoch_start mid-epoch) resets or recounts what"
            " the checkpoint restored; derive it from trainer.global_step, or leave it to the checkpoint"
        )
    return Row("resume", "stop mid-epoch or at epoch end + resume = uninterrupted", holds, measured, fix)


def _reproducible(first: list[dict], second: list[dict]) -> Row:
    diff = max(max_diff(a["final"], b["final"]) for a, b in zip(first, second, strict=True))
    aug = differing(augmented_by_sample(first), augmented_by_sample(second))
    holds = diff == 0 and aug == 0
    measured = f"same seed twice: weights differ by {diff:.1e}, {aug} samples augmented differently"
    fix = "" if holds else "seed every random draw from the run's seed (no time- or process-based seeds)"
    return Row("reproducible", "same seed twice = identical", holds, measured, fix)


def _warnings(
    batch_size: int,
    ref: dict,
    sync: bool,
    grad_error: float,
    rng: tuple,
    world_sizes,
    configured_batch: int | None = None,
    dropout: list[str] = (),
    eval_train_mode: list[str] = (),
) -> list[Row]:
    """The warning rows. ``batch_size``: the per-device batch the check runs used, which the BatchNorm row
    judges (its gradient figure is theirs); ``configured_batch``: the run's own, named beside it;
    ``eval_train_mode``: the layers a validation ran in training mode (the metric row fails for dropout
    among them, and the dropout row then says the same)."""
    rows = []
    bn = ref.get("bn_classes", [])  # as trained: lit_ddp's or torch's SyncBatchNorm when synced
    small = bn and not sync and batch_size < SMALL_BN_BATCH
    own = f" (the run's own: {configured_batch})" if configured_batch not in (None, batch_size) else ""
    rows.append(
        Row(
            "batchnorm",
            "BatchNorm at small per-device batch",
            not small,
            f"BatchNorm ({', '.join(bn)}), per-device batch {batch_size} in these checks{own}, SyncBatchNorm "
            f"{'on' if sync else 'off'}; first-step gradients 2×b vs 1×2b differ by {grad_error:.1e}"
            if bn
            else "no BatchNorm",
            "set trainer.sync_batchnorm=true, or a per-device batch of 32 or more" if small else "",
            warning=True,
        )
    )
    in_training = (
        "with dropout on, 2 × b and 1 × 2b (and a resumed run) draw other masks from torch's global RNG, so"
        " they agree in distribution, not bit for bit"
    )
    masked = dropout_in_validation(list(eval_train_mode), dropout)
    if masked:
        # Masks in validation change the metrics with the device count: the metric row fails on it.
        layers = ", ".join(m.split(" (")[0] for m in masked)
        fix = (
            f"validation runs {layers} in training mode, so it draws masks there too and the validation"
            " metrics change with the device count: evaluate in eval mode, which Lightning sets; in"
            f" training, nothing to fix: {in_training}"
        )
    else:
        fix = f"nothing to fix: {in_training}; the rest of the model holds" if dropout else ""
    measured = f"{', '.join(dropout)}: the checks ran with p=0" if dropout else "no dropout layer"
    if masked:
        measured += f"; in training mode during validation: {', '.join(masked)}"
    rows.append(
        Row("dropout", "dropout (random masks per device batch)", not dropout, measured, fix, warning=True)
    )
    n = ref["full_sizes"]["train_set"]
    pads = {w: -n % w for w in world_sizes if -n % w}
    rows.append(
        Row(
            "padding",
            "training-set size leaves padded duplicates",
            not pads,
            f"{n} training samples: "
            + (", ".join(f"{p} repeated on {w} devices" for w, p in pads.items()) if pads else "no repeats")
            + f" (of {', '.join(map(str, world_sizes))})",
            f"a training-set size divisible by the device count ({math.lcm(*world_sizes)} for all),"
            " or accept the repeats in each epoch's last global batch"
            if pads
            else "",
            warning=True,
        )
    )
    if rng is None:  # the augmentation check did not run
        return rows
    changed, total, unreproducible = (*rng, 0)[:3]
    if unreproducible:  # re-seeding cannot be told from a run that differs anyway
        rows.append(
            Row(
                "global_rng",
                "global RNG in the data path",
                True,
                f"not measured: two 1-process runs with the same seed already differ in {unreproducible} of"
                f" {total} samples (see 'augmentation', 'data')",
                warning=True,
            )
        )
        return rows
    rows.append(
        Row(
            "global_rng",
            "global RNG in the data path",
            changed == 0,
            f"{changed} of {total} augmented samples change when the global RNGs are re-seeded",
            "draw from augment_batch's rand (or a generator seeded by seed, epoch, sample index)"
            if changed
            else "",
            warning=True,
        )
    )
    return rows


# ---- the entry point ------------------------------------------------------------------------------------

CHECKS = ("grads", "steps", "data", "metrics", "shards", "augmentation", "resume", "reproducible")
# The runs each check compares, beyond the 2-process fit ("full") and the 1-process fit ("full1").
NEEDS = {
    "grads": (),
    "steps": (),
    "data": ("again1", "val2", "val1"),
    "metrics": ("val2", "val1"),
    "shards": ("val2", "val1"),
    "augmentation": ("rng1", "again1"),
    "resume": ("stopped", "resumed", "epochs", "stopped_end", "resumed_end"),
    "reproducible": ("again",),
}
HASHED = ("full", "again", "full1", "again1", "val2", "val1")  # the runs whose samples are hashed


@dataclass
class Case:
    """One model and data module with the options the checks run them with (``check_ddp_invariants``)."""

    model: object
    datamodule: object
    batch_size: int | None = None
    steps: int = 2
    seed: int = 0
    sync_batchnorm: bool = False
    accumulate_grad_batches: int | dict[int, int] = 1
    gradient_clip_val: float | None = None
    devices: int | None = None
    checks: tuple[str, ...] = CHECKS
    find_unused_parameters: bool = False


def _jobs(case: Case, key: str, root: Path) -> tuple[dict[int, list[Job]], dict]:
    """The case's jobs for the 2- and the 1-process launch, and what evaluating them needs."""
    model, dm = _copies(_model(case.model), _datamodule(case.datamodule))
    dropout = without_dropout(model)  # the caller's model keeps its own
    unknown = set(case.checks) - set(CHECKS)
    if unknown:
        raise UserError(f"unknown check(s) {sorted(unknown)}: choose from {list(CHECKS)}")
    if case.steps < 2:
        raise UserError(f"steps={case.steps} must be 2 or more: the resume check stops after the first step")
    if case.batch_size is not None and case.batch_size < 1:  # else a rank's sampler fails with a traceback
        raise UserError(f"batch_size={case.batch_size} must be 1 or more: the per-device batch of the checks")
    configured_batch = dm.batch_size
    b = case.batch_size or min(configured_batch, 16)
    # The config's batch as fit judges it, in fit's line (the ranks run the checks' batch): a BatchNorm model
    # with one image per device, unless SyncBatchNorm spans the run's 2 or more devices (fit asks the model
    # once its layers are synchronised; this one is not), or may: devices not counted (a GPU run judged on a
    # CPU) are not refused on a guess. Before the checks' own batch of 1, the kit's.
    if not (case.sync_batchnorm and (case.devices is None or case.devices > 1)):
        check_batch_of_one(dm.batch_size, model)
    # The data module refuses this too, in the ranks, naming --data.batch_size: the checks set their own.
    # With SyncBatchNorm the 2-process ranks normalise 2 images, and the 1-process ones a batch of 2.
    if b == 1 and not case.sync_batchnorm and fails_on_one(model) is not None:
        raise UserError(
            "batch_size=1 with a BatchNorm model: BatchNorm cannot normalise a batch of one image per device;"
            " run the checks at a batch of 2 or more (doctor --batch-size=2; check_ddp_invariants(...,"
            " batch_size=2))"
        )
    mixing = dm.mixup_alpha > 0 or dm.cutmix_alpha > 0
    dm.mixup_alpha = dm.cutmix_alpha = 0.0  # they pair samples within a device's batch: left out (README)
    payload = root / f"{key}_payload.pkl"
    payload.write_bytes(_payload(model, dm))
    # An optimizer step takes accumulate_grad_batches batches: `steps` steps, and one-step epochs, need that
    # many times the samples (else the "mid-epoch" stop after step 1 fell at the epoch's end).
    # A scheduling ({epoch: batches}) is checked at its largest: each epoch is a run of its own accumulation.
    scheduled = isinstance(case.accumulate_grad_batches, dict)
    most = (
        max(case.accumulate_grad_batches.values(), default=1) if scheduled else case.accumulate_grad_batches
    )
    batches_per_step = max(1, most)
    train_samples, val_samples = 2 * b * case.steps * batches_per_step, 2 * b + 1  # odd: uneven val shards
    trainer_kwargs = {
        "accumulate_grad_batches": most,
        "gradient_clip_val": case.gradient_clip_val,
    }
    if case.sync_batchnorm:
        trainer_kwargs["sync_batchnorm"] = True
    if case.find_unused_parameters:
        trainer_kwargs["find_unused_parameters"] = True  # the worker's DDP strategy

    def job(
        name: str,
        world_size: int,
        stage: str = "fit",
        train: int = train_samples,
        steps: int = case.steps,
        **kw,
    ) -> Job:
        return Job(
            f"{key}_{name}",
            stage,
            str(payload),
            str(root),
            world_size,
            b * (3 - world_size),  # 2 × b or 1 × 2b
            train,
            val_samples,
            case.seed,
            max_steps=steps if stage == "fit" else -1,
            trainer_kwargs=trainer_kwargs,
            run_batch_size=configured_batch,
            # devices unknown (auto, -1): a batch that fit refuses on 1 device it refuses on any count
            run_devices=case.devices or 1,
            run_scheduled=scheduled,
            **kw,
        )

    needed = {name for check in case.checks for name in NEEDS[check]}
    stop = root / f"{key}_stopped" / "stop.ckpt"
    stop_end = root / f"{key}_stopped_end" / "stop.ckpt"
    one_step = 2 * b * batches_per_step  # epochs of one step each: the stop after step 1 ends epoch 1
    every = {
        "full": job("full", 2),
        "again": job("again", 2),
        "stopped": job("stopped", 2, stop_at_step=1),
        "resumed": job("resumed", 2, ckpt_path=str(stop)),
        "epochs": job("epochs", 2, train=one_step),
        "stopped_end": job("stopped_end", 2, train=one_step, stop_at_step=1),
        "resumed_end": job("resumed_end", 2, train=one_step, ckpt_path=str(stop_end)),
        "val2": job("val2", 2, "validate"),
        "full1": job("full1", 1),
        # These two are compared by their samples and first batch only: one step is all they need.
        "again1": job("again1", 1, steps=1),
        "rng1": job("rng1", 1, steps=1, perturb_global_rng=True),
        "val1": job("val1", 1, "validate"),
    }
    for name in HASHED:
        every[name].digests = True
    jobs: dict[int, list[Job]] = {2: [], 1: []}
    ran = {"full", "full1", *needed}
    for name, j in every.items():
        if name in ran:
            jobs[j.world_size].append(j)
    facts = {
        "dm": dm,
        "batch": b,
        "configured_batch": configured_batch,
        "dropout": dropout,
        "train": train_samples,
        "val": val_samples,
        "mixing": mixing,
        "ran": ran,
    }
    return jobs, facts


def _in_float64(row64: Row, row32: Row) -> Row:
    """The float64 re-run's row in place of a failed float32 one; where float64 holds, the float32 figure
    is the rounding of 2 × b and 1 × 2b (their kernels round a sum otherwise) tipping a decision that
    routes the gradient (a ReLU near 0, a max-pool near-tie) one way on 2 processes, the other on 1."""
    if row32.holds:
        return row32
    measured = f"in float64: {row64.measured}"
    if row64.holds:
        measured += (
            f"; float32 ({row32.measured.split(' (')[0]}) is rounding that tips a ReLU or max-pool near"
            " its threshold otherwise at the two batch sizes"
        )
    return dataclasses.replace(row64, measured=measured)


def _evaluate(case: Case, key: str, root: Path, facts: dict, float64: bool = False) -> Report:
    """The case's report; ``float64``: its grads and steps rows from the fits re-run in float64 where the
    float32 ones failed (``run_cases``)."""

    def rec(name: str, world_size: int, stage: str = "fit") -> list[dict]:
        return load(root / f"{key}_{name}", stage, world_size)

    full, (full1,) = rec("full", 2), rec("full1", 1)
    worlds = {"val2": 2, "val1": 1, "again": 2, "again1": 1}
    runs = {"full": full, "full1": [full1]}
    for name, world in worlds.items():
        if name in facts["ran"]:
            runs[name] = rec(name, world, "validate" if name.startswith("val") else "fit")
    grad_error = relative_error(full[0]["grads"], full1["grads"])
    seen1 = augmented_by_sample([full1])
    rng = None
    if "augmentation" in case.checks:
        again1 = augmented_by_sample(runs["again1"])
        rng = (differing(augmented_by_sample(rec("rng1", 1)), seen1), len(seen1), differing(again1, seen1))
    data_row, data_differs = _data(runs, "train_set")
    batches_differ = any(train_shards(full, facts["train"])) or any(other_batch(full, full1))
    aug_row, aug_differs = _augmentation(
        facts["dm"], full, full1, rng, facts["mixing"], data_differs, batches_differ
    )
    bn = [c for c in full[0].get("bn_classes", []) if "Sync" not in c]
    why = Evidence(
        data_differs=data_differs,
        batches_differ=batches_differ,
        aug_differs=aug_differs,
        forward_rng=full[0].get("forward_rng", []) or full1.get("forward_rng", []),
        global_rng=rng[0] if rng and not rng[2] else 0,
        loose=loose_changes(full[0]),
    )

    def steps(two: list[dict], one: dict, grads: Row) -> Row:
        return _steps(two, one, bool(bn) and not case.sync_batchnorm, grads, why)

    grads32 = grads_row = _grads(full, full1, case.sync_batchnorm, bn, why)
    steps_row = lambda: steps(full, full1, grads32)  # noqa: E731
    if float64:
        full64, (full1_64,) = rec("full_f64", 2), rec("full1_f64", 1)
        grads64 = _grads(full64, full1_64, case.sync_batchnorm, bn, why)
        grads_row = _in_float64(grads64, grads32)
        steps_row = lambda: _in_float64(steps(full64, full1_64, grads64), steps(full, full1, grads32))  # noqa: E731
    shards = None
    if "shards" in case.checks or "metrics" in case.checks:
        shards = _shards(full, runs["val2"], facts["train"], facts["val"], full1, runs["val1"][0])
    rows = {
        "grads": lambda: grads_row,
        "steps": steps_row,
        "data": lambda: data_row,
        "metrics": lambda: _metrics(
            runs["val2"], runs["val1"][0], shards_explain=shards[1], dropout=facts["dropout"]
        ),
        "shards": lambda: shards[0],
        "augmentation": lambda: aug_row,
        "resume": lambda: _resume(
            (full, rec("stopped", 2), rec("resumed", 2)),
            (rec("epochs", 2), rec("stopped_end", 2), rec("resumed_end", 2)),
            why,
        ),
        "reproducible": lambda: _reproducible(full, runs["again"]),
    }
    devices = case.devices
    world_sizes = tuple(sorted({*WORLD_SIZES, *([devices] if devices and devices > 1 else [])}))
    warned = _warnings(
        facts["batch"],
        full[0],
        case.sync_batchnorm,
        grad_error,
        rng,
        world_sizes,
        configured_batch=facts["configured_batch"],
        dropout=facts["dropout"],
        eval_train_mode=runs["val1"][0].get("eval_train_mode", []) if "val1" in runs else [],
    )
    checked = [rows[c]() for c in CHECKS if c in case.checks]
    shown = {row.key for row in checked}
    for row in checked:  # a pointer to a row this report does not show: that row's fix itself
        for key in re.findall(r"see '(\w+)'", row.fix):
            if key not in shown and key in ("grads", "data", "augmentation", "shards"):
                # The training order is known from the fits alone, also where the shards row did not run.
                found = ORDER_FIX if key == "shards" and shards is None else rows[key]().fix
                row.fix = row.fix.replace(f"see '{key}'", found)
    return Report(checked + warned, case.seed)


def _launch(jobs: dict[int, list[Job]], root: Path, timeout: float, tag: str = "") -> None:
    """Runs ``jobs`` (world size → its jobs) in one 2-process and one 1-process launch, side by side: the
    1-process rank uses what the 2-process ones leave of the CPUs."""
    stop = threading.Event()  # a failed launch ends the other: its error is the one to report

    def run_world(world_size: int, port: int) -> None:
        jobs_file = root / f"jobs{tag}_{world_size}.pkl"
        command = ["-m", "lit_ddp.testing.worker", str(jobs_file)]
        try:
            jobs_file.write_bytes(pickle.dumps(jobs[world_size]))
            # In this process's folder, as fit would run: relative paths in the config mean the same.
            launch(world_size, command, Path.cwd(), timeout, f"log{tag}{world_size}_rank", root, port, stop)
        except LaunchStopped:
            raise
        except BaseException as err:
            stop.set()
            for rank in range(world_size if isinstance(err, LaunchError) else 0):
                if (found := user_error_file(jobs_file, rank)).is_file():  # a rank's one line to report
                    raise UserError(found.read_text()) from None
            raise

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="lit_ddp_launch") as pool:
        futures = [pool.submit(run_world, w, port) for w, port in zip((2, 1), free_ports(2), strict=True)]
    # The launch that failed, not the one it ended.
    errors = [error for future in futures if (error := future.exception()) is not None]
    errors.sort(key=lambda error: isinstance(error, LaunchStopped))
    if errors:
        raise errors[0]


def _float64(jobs: dict[int, list[Job]], key: str) -> dict[int, list[Job]]:
    """The case's 2- and 1-process fits (``full``, ``full1``) again in float64, as ``full_f64`` and
    ``full1_f64``."""
    return {
        w: [
            dataclasses.replace(
                j,
                name=f"{j.name}_f64",
                digests=False,
                trainer_kwargs={**j.trainer_kwargs, "precision": "64-true"},
            )
            for j in jobs[w]
            if j.name in (f"{key}_full", f"{key}_full1")
        ]
        for w in jobs
    }


def run_cases(cases: list[Case], timeout: float = 600, workdir: str | Path | None = None) -> list[Report]:
    """The checks of several cases in one 2-process and one 1-process launch (each launch costs a few
    seconds of start-up). For a test suite with many models or data modules. Warnings are not raised here,
    only reported.

    A case whose gradients or weights differ with no cause in the records gets its two fits re-run in float64,
    in one more pair of launches: 2 × b and 1 × 2b sum in other orders, and where a pre-activation lies
    within float32's rounding of a ReLU's 0 (or two max-pool inputs of each other) the two runs route that
    sample's gradient otherwise, an O(1) difference no tolerance tells from a bug; float64's rounding is 10⁹
    times finer. A model that cannot run in float64 keeps its float32 rows."""
    with tempfile.TemporaryDirectory(prefix="lit_ddp_checks_") as tmp:
        root = Path(workdir).resolve() if workdir is not None else Path(tmp)
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UserError(f"cannot create the workdir {root} ({err.strerror}): pass another one") from None
        plans = [_jobs(case, f"case{i}", root) for i, case in enumerate(cases)]
        _launch({w: [j for jobs, _ in plans for j in jobs[w]] for w in (2, 1)}, root, timeout)
        keys = [f"case{i}" for i in range(len(cases))]
        reports = [_evaluate(c, k, root, facts) for c, k, (_, facts) in zip(cases, keys, plans, strict=True)]
        again = [i for i, r in enumerate(reports) if any(row.rounding and not row.holds for row in r.rows)]
        if again:
            reruns = [_float64(plans[i][0], keys[i]) for i in again]
            try:
                _launch({w: [j for jobs in reruns for j in jobs[w]] for w in (2, 1)}, root, timeout, "_f64")
            except (LaunchError, UserError):
                return reports
            for i in again:
                reports[i] = _evaluate(cases[i], keys[i], root, plans[i][1], float64=True)
        return reports


def check_ddp_invariants(
    model,
    datamodule,
    *,
    batch_size: int | None = None,
    steps: int = 2,
    seed: int = 0,
    sync_batchnorm: bool = False,
    accumulate_grad_batches: int | dict[int, int] = 1,
    gradient_clip_val: float | None = None,
    devices: int | None = None,
    checks: tuple[str, ...] = CHECKS,
    find_unused_parameters: bool = False,
    timeout: float = 600,
    workdir: str | Path | None = None,
) -> Report:
    """Runs the checks (package docstring) on CPU with 2 gloo processes and with 1; returns their ``Report``.

    ``model``: a LightningModule, its class, or a ``{"class_path", "init_args"}`` dict; ``datamodule``: a
    lit_ddp ImageDataModule (or its class). ``batch_size``: the per-device batch b of the runs (default: the
    data module's, at most 16, so the runs stay small); ``steps``: optimizer steps of the 2-process fit, one
    epoch of 2·b·steps·accumulate_grad_batches training samples. ``sync_batchnorm``,
    ``accumulate_grad_batches`` (a GradientAccumulationScheduler's ``{epoch: batches}``: checked at its
    largest) and ``gradient_clip_val`` as the real run will use them; ``devices``: the
    device count it will use (the padding warning considers it; None: not known, SyncBatchNorm is taken to
    span 2 or more). ``checks``: a subset of ``CHECKS`` to run
    (fewer runs). ``find_unused_parameters``: the 2-process runs' DDP looks for parameters the loss does not
    reach, as the run's ``ddp_find_unused_parameters_true`` does. ``workdir``: keep the runs' records and
    logs there. Warnings come back as rows of the report and as ``DDPInvariantWarning``.
    """
    case = Case(
        model,
        datamodule,
        batch_size,
        steps,
        seed,
        sync_batchnorm,
        accumulate_grad_batches,
        gradient_clip_val,
        devices,
        tuple(checks),
        find_unused_parameters,
    )
    (report,) = run_cases([case], timeout, workdir)
    for row in report.warnings:
        warnings.warn(DDPInvariantWarning(f"{row.check}: {row.measured}; {row.fix}"), stacklevel=2)
    return report
