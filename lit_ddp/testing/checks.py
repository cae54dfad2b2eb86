"""``check_ddp_invariants``: runs a model and a data module on 1 and 2 CPU processes and says which of
lit_ddp's DDP promises hold for them (the package docstring lists the checks).

Two launches of small runs on the head of the data: 2 processes × b (a fit, the same fit again, the fit
stopped after its first step and resumed, a validation), then 1 process × 2b (a fit, the fit with the global
RNGs re-seeded as its epoch starts, a validation). Each rank records what it did (record.py); the checks
compare the records.
"""

import copy
import math
import pickle
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import cloudpickle
import torch
from lightning import LightningDataModule, LightningModule
from torch import nn

from lit_ddp.data import ImageDataModule
from lit_ddp.errors import UserError
from lit_ddp.testing.config import instantiate
from lit_ddp.testing.launch import LaunchError, launch
from lit_ddp.testing.record import load
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


@dataclass
class Report:
    """The checks' verdicts. ``ok``: every check holds (warnings aside); ``table()`` for a failure message."""

    rows: list[Row] = field(default_factory=list)

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
        return "\n".join(
            [fmt(head), "-+-".join("-" * w for w in widths) + "-+-" + "-" * 14, *map(fmt, lines)]
        )


# ---- the runs ------------------------------------------------------------------------------------------


def _model(model) -> LightningModule:
    if isinstance(model, LightningModule):
        return model
    if isinstance(model, type) and issubclass(model, LightningModule):
        return model()
    if isinstance(model, dict) and "class_path" in model:
        return instantiate(model, LightningModule)
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


DROPOUT = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


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


def _grads(two: list[dict], one: dict, sync: bool, bn: list[str], aug_differs: int) -> Row:
    b = len(two[0]["aug_index"][0])
    error = relative_error(two[0]["grads"], one["grads"])
    ranks_agree = relative_error(two[0]["grads"], two[1]["grads"]) == 0
    holds = error <= GRAD_RTOL and ranks_agree
    measured = f"relative difference {error:.1e} (‖Δg‖/‖g‖, 2 × {b} vs 1 × {2 * b}; limit {GRAD_RTOL:.0e})"
    fix = ""
    if not holds:
        if bn and not sync:
            fix = "BatchNorm normalises per device: set trainer.sync_batchnorm=true (works on CPU too)"
        elif aug_differs:
            fix = "the two runs trained on differently augmented images: see 'augmentation'"
        else:
            fix = (
                "something in the loss depends on the per-device batch (a per-device mean, batch statistics)"
            )
    return Row("grads", "first-step gradients 2×b = 1×2b", holds, measured, fix)


def _metrics(two: list[dict], one: dict) -> Row:
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
    worst, name = 0.0, ""
    for rank in two:
        got = rank["val_logged"][-1]
        for key in reference.keys() | got.keys():
            if key not in got or key not in reference:
                worst, name = math.inf, f"{key} logged on one run only"
                continue
            diff = abs(got[key] - reference[key]) / max(1.0, abs(reference[key]))
            if diff > worst:
                worst, name = (
                    diff,
                    f"{key}: {got[key]:.6g} on rank {rank['rank']} of 2, {reference[key]:.6g} on 1",
                )
    holds = worst <= METRIC_RTOL
    measured = f"{len(reference)} val metrics, largest relative difference {worst:.1e}"
    if not holds:
        measured += f" ({name})"
    fix = (
        ""
        if holds
        else "reduce every metric over the ranks: torchmetrics logged as objects, or sync_dist=True"
    )
    return Row("metrics", "validation metrics 1 = 2 processes", holds, measured, fix)


def _shards(two: list[dict], val_two: list[dict], train_samples: int, val_samples: int) -> Row:
    shards = [r["samples"][0][1] for r in two]
    shared = len(set(shards[0]) & set(shards[1]))
    missing = train_samples - len(set(shards[0]) | set(shards[1]))
    evals = [r["eval_indices"]["val"][0] for r in val_two]
    read = sum(map(len, evals))
    repeats, unread = read - len(set().union(*evals)), val_samples - len(set().union(*evals))
    holds = shared == 0 and missing == 0 and repeats == 0 and unread == 0
    measured = (
        f"train: shards of {'+'.join(str(len(s)) for s in shards)}, {shared} shared, {missing} missing; "
        f"val: {val_samples} samples read {read} times over {'+'.join(str(len(e)) for e in evals)}"
        f" ({repeats} repeats, {unread} unread)"
    )
    fix = ""
    if repeats or unread:
        fix = "evaluate with lit_ddp's UnpaddedDistributedSampler (ImageDataModule._eval_sampler): no padding"
    elif not holds:
        fix = "shard training with a DistributedSampler over the same (seed, epoch) order on every rank"
    return Row("shards", "train shards disjoint+covering, eval unpadded", holds, measured, fix)


def _augmentation(
    dm: ImageDataModule, two: list[dict], one: dict, rng_changes: int, mixing: bool
) -> tuple[Row, int]:
    seen2, seen1 = augmented_by_sample(two), augmented_by_sample([one])
    differ = differing(seen2, seen1)
    holds = differ == 0
    measured = f"{differ} of {len(seen1)} samples augmented differently on 2 processes than on 1"
    if not dm.augment:
        measured += " (augmentation off)"
    if mixing:
        measured += "; MixUp/CutMix left out: they pair samples inside one device's batch (README)"
    fix = ""
    if not holds:
        fix = (
            "it draws from the global RNG: take every random number from augment_batch's rand"
            if rng_changes
            else "it depends on the rank or batch: take every random number from augment_batch's rand"
            " (SampleRandom: seed, epoch, sample index)"
        )
    return Row("augmentation", "augmentation same on any device count", holds, measured, fix), differ


def _resumed_diff(full: list[dict], resumed: list[dict]) -> float:
    """How far the resumed fit's final weights are from the uninterrupted fit's (inf: it stopped short)."""
    if resumed[0]["global_step"] != full[0]["global_step"]:
        return float("inf")
    return max(max_diff(r["final"], f["final"]) for r, f in zip(resumed, full, strict=True))


def _resume(mid_epoch: tuple[list[dict], ...], epoch_end: tuple[list[dict], ...]) -> Row:
    """Each pair (uninterrupted, stopped, resumed): stopped inside an epoch, and at an epoch's end."""
    (full, stopped, resumed), (full_e, stopped_e, resumed_e) = mid_epoch, epoch_end
    diff, diff_e = _resumed_diff(full, resumed), _resumed_diff(full_e, resumed_e)
    holds = diff == 0 and diff_e == 0
    measured = (
        f"stopped after step {stopped[0]['global_step']} of {full[0]['global_step']} (mid-epoch) and at the"
        f" end of epoch {stopped_e[0]['global_step']} of {full_e[0]['global_step']}, resumed: weights differ"
        f" by at most {diff:.1e} and {diff_e:.1e}"
    )
    fix = ""
    if diff != 0:
        fix = "save the data module's position (state_dict) and draw augmentation per sample"
    elif diff_e != 0:  # DataLoader workers read the sampler when Lightning builds the resumed iterator
        fix = (
            "resume a finished epoch at the next epoch's start: the training sampler's epoch and start must"
            " be right before the loader's first iterator (DataLoader workers read it then, before set_epoch)"
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
) -> list[Row]:
    """The warning rows. ``batch_size``: the per-device batch the check runs used, which the BatchNorm row
    judges (its gradient figure is theirs); ``configured_batch``: the run's own, named beside it."""
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
    rows.append(
        Row(
            "dropout",
            "dropout (random masks per device batch)",
            not dropout,
            f"{', '.join(dropout)}: the checks ran with p=0" if dropout else "no dropout layer",
            "nothing to fix: with dropout on, 2 × b and 1 × 2b (and a resumed run) draw other masks from"
            " torch's global RNG, so they agree in distribution, not bit for bit; the rest of the model holds"
            if dropout
            else "",
            warning=True,
        )
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
    changed, total = rng
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

CHECKS = ("grads", "metrics", "shards", "augmentation", "resume", "reproducible")
# The runs each check compares, beyond the 2-process fit ("full") and the 1-process fit ("full1").
NEEDS = {
    "grads": (),
    "metrics": ("val2", "val1"),
    "shards": ("val2",),
    "augmentation": ("rng1",),
    "resume": ("stopped", "resumed", "epochs", "stopped_end", "resumed_end"),
    "reproducible": ("again",),
}


@dataclass
class Case:
    """One model and data module with the options the checks run them with (``check_ddp_invariants``)."""

    model: object
    datamodule: object
    batch_size: int | None = None
    steps: int = 2
    seed: int = 0
    sync_batchnorm: bool = False
    accumulate_grad_batches: int = 1
    gradient_clip_val: float | None = None
    devices: int | None = None
    checks: tuple[str, ...] = CHECKS


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
    mixing = dm.mixup_alpha > 0 or dm.cutmix_alpha > 0
    dm.mixup_alpha = dm.cutmix_alpha = 0.0  # they pair samples within a device's batch: left out (README)
    payload = root / f"{key}_payload.pkl"
    payload.write_bytes(_payload(model, dm))
    # An optimizer step takes accumulate_grad_batches batches: `steps` steps, and one-step epochs, need that
    # many times the samples (else the "mid-epoch" stop after step 1 fell at the epoch's end).
    batches_per_step = max(1, case.accumulate_grad_batches)
    train_samples, val_samples = 2 * b * case.steps * batches_per_step, 2 * b + 1  # odd: uneven val shards
    trainer_kwargs = {
        "accumulate_grad_batches": case.accumulate_grad_batches,
        "gradient_clip_val": case.gradient_clip_val,
    }
    if case.sync_batchnorm:
        trainer_kwargs["sync_batchnorm"] = True

    def job(name: str, world_size: int, stage: str = "fit", train: int = train_samples, **kw) -> Job:
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
            max_steps=case.steps if stage == "fit" else -1,
            trainer_kwargs=trainer_kwargs,
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
        "rng1": job("rng1", 1, perturb_global_rng=True),
        "val1": job("val1", 1, "validate"),
    }
    jobs: dict[int, list[Job]] = {2: [], 1: []}
    for name, j in every.items():
        if name in ("full", "full1") or name in needed:
            jobs[j.world_size].append(j)
    facts = {
        "dm": dm,
        "batch": b,
        "configured_batch": configured_batch,
        "dropout": dropout,
        "train": train_samples,
        "val": val_samples,
        "mixing": mixing,
    }
    return jobs, facts


def _evaluate(case: Case, key: str, root: Path, facts: dict) -> Report:
    def rec(name: str, world_size: int, stage: str = "fit") -> list[dict]:
        return load(root / f"{key}_{name}", stage, world_size)

    full, (full1,) = rec("full", 2), rec("full1", 1)
    grad_error = relative_error(full[0]["grads"], full1["grads"])
    seen1 = augmented_by_sample([full1])
    rng = None
    if "augmentation" in case.checks:
        rng = (differing(augmented_by_sample(rec("rng1", 1)), seen1), len(seen1))
    aug_row, aug_differs = _augmentation(facts["dm"], full, full1, rng[0] if rng else 0, facts["mixing"])
    bn = [c for c in full[0].get("bn_classes", []) if "Sync" not in c]
    rows = {
        "grads": lambda: _grads(full, full1, case.sync_batchnorm, bn, aug_differs),
        "metrics": lambda: _metrics(rec("val2", 2, "validate"), rec("val1", 1, "validate")[0]),
        "shards": lambda: _shards(full, rec("val2", 2, "validate"), facts["train"], facts["val"]),
        "augmentation": lambda: aug_row,
        "resume": lambda: _resume(
            (full, rec("stopped", 2), rec("resumed", 2)),
            (rec("epochs", 2), rec("stopped_end", 2), rec("resumed_end", 2)),
        ),
        "reproducible": lambda: _reproducible(full, rec("again", 2)),
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
    )
    return Report([rows[c]() for c in CHECKS if c in case.checks] + warned)


def run_cases(cases: list[Case], timeout: float = 600, workdir: str | Path | None = None) -> list[Report]:
    """The checks of several cases in one 2-process and one 1-process launch (each launch costs a few
    seconds of start-up): for a test suite with many models or data modules. Warnings are not raised here,
    only reported."""
    with tempfile.TemporaryDirectory(prefix="lit_ddp_checks_") as tmp:
        root = Path(workdir).resolve() if workdir is not None else Path(tmp)
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UserError(f"cannot create the workdir {root} ({err.strerror}): pass another one") from None
        plans = [_jobs(case, f"case{i}", root) for i, case in enumerate(cases)]
        for world_size in (2, 1):
            jobs = [j for jobs, _ in plans for j in jobs[world_size]]
            jobs_file = root / f"jobs_{world_size}.pkl"
            jobs_file.write_bytes(pickle.dumps(jobs))
            command = ["-m", "lit_ddp.testing.worker", str(jobs_file)]
            try:
                # In this process's folder, as fit would run: relative paths in the config mean the same.
                launch(world_size, command, Path.cwd(), timeout, f"log{world_size}_rank", logs_dir=root)
            except LaunchError:
                for rank in range(world_size):  # a rank's UserError is the one line to report
                    if (found := user_error_file(jobs_file, rank)).is_file():
                        raise UserError(found.read_text()) from None
                raise
        return [
            _evaluate(case, f"case{i}", root, facts)
            for i, (case, (_, facts)) in enumerate(zip(cases, plans, strict=True))
        ]


def check_ddp_invariants(
    model,
    datamodule,
    *,
    batch_size: int | None = None,
    steps: int = 2,
    seed: int = 0,
    sync_batchnorm: bool = False,
    accumulate_grad_batches: int = 1,
    gradient_clip_val: float | None = None,
    devices: int | None = None,
    checks: tuple[str, ...] = CHECKS,
    timeout: float = 600,
    workdir: str | Path | None = None,
) -> Report:
    """Runs the checks (package docstring) on CPU with 2 gloo processes and with 1; returns their ``Report``.

    ``model``: a LightningModule, its class, or a ``{"class_path", "init_args"}`` dict; ``datamodule``: a
    lit_ddp ImageDataModule (or its class). ``batch_size``: the per-device batch b of the runs (default: the
    data module's, at most 16, so the runs stay small); ``steps``: optimizer steps of the 2-process fit, one
    epoch of 2·b·steps·accumulate_grad_batches training samples. ``sync_batchnorm``,
    ``accumulate_grad_batches`` and ``gradient_clip_val`` as the real run will use them; ``devices``: the
    device count it will use (the padding warning considers it). ``checks``: a subset of ``CHECKS`` to run
    (fewer runs). ``workdir``: keep the runs' records and logs there. Warnings come back as rows of the
    report and as ``DDPInvariantWarning``.
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
    )
    (report,) = run_cases([case], timeout, workdir)
    for row in report.warnings:
        warnings.warn(DDPInvariantWarning(f"{row.check}: {row.measured}; {row.fix}"), stacklevel=2)
    return report
