"""One rank of the trust kit: runs its list of jobs (fits and validations) in this process.

    python -m lit_ddp.testing.worker jobs.pkl     # started by checks.py through launch.py, one per rank

Each job unpickles its own copy of the model and data module, seeds like the CLI (``seed_everything``),
takes the head of the data (``Subsample``) and records what it did (``Recorder``). Running several jobs per
process pays the import of torch and Lightning once; the gloo group, once created, is reused.
"""

import functools
import os
import pickle
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from lightning import Callback, LightningDataModule, LightningModule, Trainer, seed_everything
from lightning_utilities.core.apply_func import apply_to_collection
from torch.utils.data import Dataset

try:
    import fcntl
except ImportError:  # Windows: no flock, and prepare_data runs as often as Lightning calls it
    fcntl = None

from lit_ddp.data.datasets import WorkerError, collate_samples
from lit_ddp.data.samplers import SeededSampleSampler
from lit_ddp.data.split_checks import check_training_batch_fits
from lit_ddp.errors import UserError
from lit_ddp.runtime.faults import destroy_process_group_at_exit
from lit_ddp.runtime.sync_batchnorm import with_sync_batchnorm
from lit_ddp.testing.record import Recorder, content


@dataclass
class Job:
    """One run of one rank. ``payload``: a file holding the pickled (model, data module), read by every job
    afresh (one file per case, not a copy per job: a ResNet-50 pickles to 100 MB)."""

    name: str
    stage: str  # "fit" or "validate"
    payload: str
    out_dir: str
    world_size: int
    batch_size: int  # per device
    train_samples: int
    val_samples: int
    seed: int
    max_steps: int = -1
    stop_at_step: int = 0
    ckpt_path: str | None = None
    perturb_global_rng: bool = False
    digests: bool = False  # hash each sample the splits hold (record.content)
    trainer_kwargs: dict = field(default_factory=dict)
    # The real run's per-device batch and device count, which fit checks against the whole training split:
    # the job's own batch and world size are the checks'.
    run_batch_size: int | None = None
    run_devices: int = 1
    run_scheduled: bool = False  # its accumulation is a GradientAccumulationScheduler's largest


class Subsample(Dataset):
    """``n`` samples spread evenly over ``dataset`` (sample k is the dataset's ``k · len // n``). Keys pass
    through as the dataset takes them: ints, or a training sampler's (index, seed) pairs."""

    def __init__(self, dataset: Dataset, n: int) -> None:
        self.dataset, self.n, self.size = dataset, n, len(dataset)

    def __len__(self) -> int:
        return self.n

    def _key(self, key):
        if isinstance(key, tuple):
            return (key[0] * self.size // self.n, *key[1:])
        return key * self.size // self.n

    def __getitem__(self, key):
        return self.dataset[self._key(key)]

    def __getitems__(self, keys: list) -> tuple:
        keys = [self._key(k) for k in keys]
        if hasattr(self.dataset, "__getitems__"):
            return self.dataset.__getitems__(keys)
        batch = collate_samples([self.dataset[k] for k in keys])
        return batch if isinstance(batch, WorkerError) else tuple(batch)


def seeds_each_sample(dm, dataset: Dataset) -> bool:
    """Whether ``dm``'s training sampler keys each sample by (index, seed), its in-worker random draws then
    a function of that key (an ``ImageDataModule`` whose augmentation runs in the DataLoader workers)."""
    make = getattr(dm, "train_sampler", None)
    return make is not None and isinstance(make(dataset, 1, 0), SeededSampleSampler)


class TakeHead(Callback):
    """After the data module's ``setup``: its splits cut to the kit's sizes; the full sizes recorded, and with
    ``job.digests`` each sample's hash."""

    def __init__(self, job: Job, recorder: Recorder) -> None:
        self.job, self.recorder = job, recorder

    def _too_small(self, name: str, size: int, wanted: int) -> str:
        """The line for a split of ``size`` samples where the checks need ``wanted``: the per-device batch
        that fits, or the size that the smallest batch needs. The training split takes ``wanted / b``
        samples per unit of the batch b, the val split 2b + 1 (uneven shards); a smaller batch alone said
        nothing of how small, and none fits a val split under 3."""
        b = self.job.batch_size // (3 - self.job.world_size)  # the checks' batch: 2 × b and 1 × 2b run
        per_batch = wanted // b if name.endswith("train_set") else 2
        fits = (size - (0 if name.endswith("train_set") else 1)) // per_batch
        said = (
            f"{name} holds {size} samples; the checks need {wanted} at batch size {b} (2 × {b}, 1 × {2 * b})"
        )
        if fits < 1:
            least = per_batch + (0 if name.endswith("train_set") else 1)
            return f"{said}: give the data module {least} samples or more (the checks at batch 1 need them)"
        return (
            f"{said}: give the data module more samples, or run the checks at a batch of {fits}"
            f" (doctor --batch-size={fits}; check_ddp_invariants(..., batch_size={fits}))"
        )

    def check_sizes(self, dm) -> None:
        """UserError when the real run's batch is more than fit takes from the whole training split (fit's
        line: the checks run a batch of their own, which a config that fit refuses would pass), or when a
        split the data module has loaded holds fewer samples than the checks read."""
        if self.job.stage == "fit" and self.job.run_batch_size is not None:
            check_training_batch_fits(
                self.job.run_batch_size,
                getattr(dm, "train_set", None),
                self.job.run_devices,
                self.job.trainer_kwargs.get("accumulate_grad_batches", 1),
                self.job.run_scheduled,
            )
        for split, wanted in (("train_set", self.job.train_samples), ("val_set", self.job.val_samples)):
            dataset = getattr(dm, split, None)
            if dataset is not None and len(dataset) < wanted:
                raise UserError(self._too_small(f"{type(dm).__name__}.{split}", len(dataset), wanted))

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        dm = trainer.datamodule
        self.check_sizes(dm)
        sizes = self.recorder.record.setdefault("full_sizes", {})
        for split, wanted in (("train_set", self.job.train_samples), ("val_set", self.job.val_samples)):
            dataset = getattr(dm, split, None)
            if dataset is None:
                continue
            sizes[split] = len(dataset)
            setattr(dm, split, Subsample(dataset, wanted))
            if self.job.digests:
                # After seed_everything, before training: every run reads its samples in the same state.
                contents = self.recorder.record.setdefault("content", {})
                seed = 0 if split == "train_set" and seeds_each_sample(dm, dataset) else None
                contents[split] = content(getattr(dm, split), seed)


class PerturbGlobalRNG(Callback):
    """Re-seeds torch's, Python's and NumPy's global RNGs as each epoch starts, to another seed than the run
    was given: a data path that draws from them then augments differently from an unperturbed run."""

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        torch.manual_seed(987654321)
        random.seed(987654321)
        np.random.seed(98765)


def prepare_once(hooks: LightningModule | LightningDataModule, done: Path) -> None:
    """``hooks.prepare_data`` runs once for all the launches of the checks, which run side by side: Lightning
    calls it on each launch's local rank 0 before every fit and validation, so a download there wrote the same
    files from two processes at once. The first caller runs it, holding a lock the others wait on; they find
    ``done`` and skip it. Its output and errors stay the rank's, as in a real run."""
    prepare = hooks.prepare_data

    @functools.wraps(prepare)  # Lightning skips a hook left as DataHooks defines it: wraps keeps it so
    def once() -> None:
        with open(done.with_name(done.name + ".lock"), "a") as lock:
            if fcntl is not None:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
            if done.exists():
                return
            prepare()
            done.touch()

    hooks.prepare_data = once


def run(job: Job) -> None:
    model, dm = pickle.loads(Path(job.payload).read_bytes())
    prepare_once(model, Path(f"{job.payload}.model_prepared"))
    prepare_once(dm, Path(f"{job.payload}.data_prepared"))
    dm.batch_size = job.batch_size
    seed_everything(job.seed, verbose=False)
    recorder = Recorder(str(Path(job.out_dir) / job.name), stop_at_step=job.stop_at_step)
    take_head = TakeHead(job, recorder)
    callbacks = [take_head, recorder]
    if job.perturb_global_rng:
        callbacks.append(PerturbGlobalRNG())
    kwargs = dict(job.trainer_kwargs)
    if kwargs.get("precision") == "64-true":
        # The float64 re-run (checks.run_cases): Lightning converts a batch before its transfer, when the
        # data modules still hold uint8; they normalise it to float32 after, into (images, labels[, ids]).
        # Any batch structure a user's data module returns (a tuple, a dict, a dataclass).
        after = dm.on_after_batch_transfer
        dm.on_after_batch_transfer = lambda batch, i: apply_to_collection(
            after(batch, i), torch.Tensor, lambda t: t.double() if t.is_floating_point() else t
        )
    if kwargs.get("sync_batchnorm"):
        kwargs["plugins"] = with_sync_batchnorm()  # lit_ddp's: works on CPU/gloo (runtime/sync_batchnorm.py)
    ddp = "ddp_find_unused_parameters_true" if kwargs.pop("find_unused_parameters", False) else "ddp"
    trainer = Trainer(
        accelerator="cpu",
        devices=job.world_size,
        strategy=ddp if job.world_size > 1 else "auto",
        max_steps=job.max_steps,
        limit_val_batches=0 if job.stage == "fit" else None,  # the validate jobs measure the metrics
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(Path(job.out_dir) / job.name),
        callbacks=callbacks,
        **kwargs,
    )
    try:
        if job.stage == "fit":
            # The checkpoint is this kit's own, written a moment ago: the user's hyperparameter types need no
            # allow-list to load it.
            trainer.fit(model, datamodule=dm, ckpt_path=job.ckpt_path, weights_only=False)
        else:
            trainer.validate(model, datamodule=dm, verbose=False)
    except UserError:
        # The data module's own setup checks run before TakeHead's and judge the job's batch as a run's
        # (--data.batch_size=N), which the checks set themselves: a split too small for the checks is
        # their line, naming the checks' batch that fits.
        take_head.check_sizes(dm)
        raise


def user_error_file(jobs_file: str | Path, rank: int) -> Path:
    """Where a rank leaves the one line of a UserError (a split too small, ...) for the parent to raise."""
    return Path(jobs_file).with_name(f"{Path(jobs_file).stem}.user_error{rank}")


def main(jobs_file: str) -> None:
    """Run the jobs of ``jobs_file`` in order. The gloo group is destroyed at exit, as the CLI does: left to
    the interpreter's finalisation it can abort a rank that finished its work (runtime/faults.py)."""
    destroy_process_group_at_exit()
    try:
        for job in pickle.loads(Path(jobs_file).read_bytes()):
            run(job)
    except UserError as err:
        user_error_file(jobs_file, int(os.environ.get("LOCAL_RANK", 0))).write_text(str(err))
        raise


if __name__ == "__main__":
    main(sys.argv[1])
