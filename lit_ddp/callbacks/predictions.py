"""``predictions.csv``: one row per image that ``python -m lit_ddp predict`` saw, in the run directory.

Exactly once per image and in the same order on any number of processes: the predict loader shards without
padding (data/samplers.py) and its batches carry each sample's index (data/base.py); every rank keeps the
top-k of its own samples, one gather (run by every rank, in the same hook) brings them together, and rank 0
sorts the rows by index and writes the file atomically.

A plain Callback rather than Lightning's ``BasePredictionWriter``: that class's epoch-end writer receives
every batch's whole output, which Lightning then holds (N × num_classes probabilities, also under spawn),
and ``batch_indices`` from the sampler, which no longer match the rows once an unreadable file is left out
of its batch. Here each batch keeps its top-k only, and the indices come with the outputs.
"""

import csv
import itertools
from pathlib import Path

import torch
import torch.distributed as dist
from lightning import Callback, LightningModule, Trainer
from torch import Tensor

from lit_ddp.callbacks.sinks import SHARED_SAVE_DIR, run_dir
from lit_ddp.data.image_folder import ImageFileDataset
from lit_ddp.errors import UserError
from lit_ddp.utils import local_path
from lit_ddp.writes import RUN_FOLDER, atomic_file

KEYS = ("index", "probs", "classes", "target")


class PredictionWriter(Callback):
    """Writes ``filename`` in the run directory (the logger's ``log_dir``, beside its config.yaml)::

        index,path,prediction,probability,top5,label
        0,new/cat.jpg,disc,0.9123,disc 0.9123; ring 0.0512; ...,

    ``path`` only where the images are files; ``top5`` (``top{top_k}``) holds the min(top_k, num classes)
    most probable classes, most probable first; ``label`` is empty for unlabelled images
    (``--data.predict_dir``).

    Reads ``index``, ``probs`` and ``target`` from each ``predict_step`` output, and from the data module
    ``class_names``, ``predict_set`` (for the file paths) and ``predict_source`` (for the report line).

    A relative ``filename`` stays inside the run directory (``../x.csv`` is refused); an absolute one is
    written where it says. Either way a file that this callback did not write is never replaced.

    Fork of ``lightning.pytorch.callbacks.BasePredictionWriter``: its epoch-end writer is handed every batch's
    whole output, which Lightning holds, and the sampler's indices, which no longer match once an unreadable
    file is left out; goes when it passes the indices each batch carries.
    """

    def __init__(self, filename: str = "predictions.csv", top_k: int = 5) -> None:
        self.filename = filename
        self.top_k = top_k
        self._batches: list[dict[str, Tensor]] = []
        self._written: set[Path] = set()

    def target(self, log_dir: str | None) -> Path:
        """Where the file goes, or UserError: out of the run directory, or over a file not ours."""
        path = Path(local_path(self.filename, "--predictions.filename"))
        if not path.is_absolute():
            run_dir = Path(log_dir or ".").resolve()
            path = (run_dir / path).resolve()
            if not path.is_relative_to(run_dir):
                raise UserError(
                    f"--predictions.filename={self.filename} leads out of the run directory {run_dir}: give a"
                    " name inside it, or an absolute path to write elsewhere on purpose"
                )
        if path.exists() and path.resolve() not in self._written:
            raise UserError(
                f"--predictions.filename={self.filename}: {path} exists and this run did not write it: choose"
                " another name, or move that file away first"
            )
        return path

    @staticmethod
    def _run_dir(trainer: Trainer) -> str:
        # Trainer.log_dir (a broadcast, so every rank asks), or where it is not the run's folder (none for
        # MLflow on a database, the save_dir of every run for W&B and an MLflow file store) the run's folder,
        # beside its config.yaml, as rank 0 knows it.
        log_dir = trainer.log_dir
        if log_dir is None or isinstance(trainer.logger, SHARED_SAVE_DIR):
            return trainer.strategy.broadcast(run_dir(trainer))
        return log_dir

    def _elsewhere(self) -> str:
        # The option that puts the file on another disk: an absolute filename is not under the run folder.
        absolute = Path(local_path(self.filename, "--predictions.filename")).is_absolute()
        return "--predictions.filename" if absolute else RUN_FOLDER

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # Refused before any image is scored, on every rank alike (an absolute file's folder that cannot be
        # written: the preflight's predictions_file row).
        if stage == "predict":
            self.target(self._run_dir(trainer))

    def on_predict_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._batches = []

    def on_predict_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int, dataloader_idx=0
    ) -> None:
        # Kept on the device until the epoch ends (no sync per batch), k values per sample, not num_classes.
        probs = outputs["probs"].detach()
        top_p, top_i = probs.topk(min(self.top_k, probs.shape[-1]), dim=-1)
        index, target = outputs["index"], outputs["target"]
        self._batches.append({"index": index, "probs": top_p, "classes": top_i, "target": target})

    def on_predict_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        batches, self._batches = self._batches, []
        local = {key: torch.cat([b[key] for b in batches]).cpu() for key in KEYS} if batches else None
        log_dir = self._run_dir(trainer)  # a broadcast from rank 0: every rank asks
        gathered = [(local, self._not_read(trainer))]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            mine, gathered = gathered[0], [None] * dist.get_world_size()
            dist.all_gather_object(gathered, mine)
        parts = [p for p, _ in gathered if p is not None]
        not_read = {i for _, rank_not_read in gathered for i in rank_not_read}
        if not trainer.is_global_zero or not parts:
            return
        rows = {key: torch.cat([p[key] for p in parts]) for key in KEYS}
        order = rows["index"].argsort(stable=True)
        rows = {key: value[order] for key, value in rows.items()}
        dm = trainer.datamodule
        path = self.target(log_dir)
        count = self._write(path, rows, dm)
        self._written.add(path.resolve())
        report = f"predictions: {count} row{'' if count == 1 else 's'}"
        if source := getattr(dm, "predict_source", None):
            report += f" ({source})"
        report += f" → {path}"
        dataset = getattr(dm, "predict_set", None)
        if dataset is not None and count < len(dataset):
            # A sample missing from the rows was either never read (past --trainer.limit_predict_batches)
            # or read and left out as unreadable: only the second is the file's fault.
            missing = set(range(len(dataset))) - set(rows["index"].tolist())
            unreadable = sorted(missing - not_read)
            if not_read:
                report += (
                    f"; {len(not_read)} image(s) not predicted: --trainer.limit_predict_batches="
                    f"{trainer.limit_predict_batches} stopped each device before them"
                )
            if unreadable:
                report += (
                    f"; {len(unreadable)} unreadable image(s) left out: {self._names(unreadable, dataset)}"
                )
        pl_module.print(report)  # rank 0 only

    @staticmethod
    def _not_read(trainer: Trainer) -> list[int]:
        """The indices of this rank's samples that ``--trainer.limit_predict_batches`` kept it from reading:
        the batches of its loader after the first ``num_predict_batches`` (none without a limit)."""
        loaders = trainer.predict_dataloaders
        loader = loaders[0] if isinstance(loaders, list | tuple) else loaders
        limits = trainer.num_predict_batches
        batch_sampler = getattr(loader, "batch_sampler", None)
        if not limits or batch_sampler is None or limits[0] >= len(batch_sampler):
            return []
        rest = itertools.islice(batch_sampler, int(limits[0]), None)
        return [int(i[0]) if isinstance(i, tuple) else int(i) for batch in rest for i in batch]

    def _write(self, path: Path, rows: dict[str, Tensor], datamodule) -> int:
        """Writes the CSV atomically (writes.py): a reader never sees half a file. Returns the
        number of rows: one per sample index (a padding sampler's repeats are left out)."""
        paths = self._paths(getattr(datamodule, "predict_set", None))
        names = list(getattr(datamodule, "class_names", ()))
        name = lambda c: names[c] if c < len(names) else str(c)  # noqa: E731 - a data module without names
        # Named by the k asked for, not by how many classes the model has: a script reading "top5" must not
        # break on a 3-class model (the column then holds 3 entries).
        header = [
            "index",
            *(["path"] if paths else []),
            "prediction",
            "probability",
            f"top{self.top_k}",
            "label",
        ]
        count, last = 0, None
        with atomic_file(path, "predictions", "w", elsewhere=self._elsewhere(), newline="") as f:
            writer = csv.writer(f)
            writer.writerow(header)
            for index, probs, classes, target in zip(*(rows[key].tolist() for key in KEYS), strict=True):
                if index == last:
                    continue
                last, count = index, count + 1
                top = "; ".join(f"{name(c)} {p:.4f}" for c, p in zip(classes, probs, strict=True))
                label = name(target) if target >= 0 else ""
                file = [paths[index]] if paths else []
                writer.writerow([index, *file, name(classes[0]), f"{probs[0]:.4f}", top, label])
        return count

    @staticmethod
    def _paths(dataset) -> list[str] | None:
        """Each sample's file, by index: an image folder's, or a dataset's own ``file_paths()`` (shards of an
        image folder keep them); None where the samples come from no files."""
        if isinstance(dataset, ImageFileDataset):
            return [p for p, _ in dataset.samples]
        file_paths = getattr(dataset, "file_paths", None)
        return file_paths() if callable(file_paths) else None

    def _names(self, indices: list[int], dataset, shown: int = 5) -> str:
        paths = self._paths(dataset)
        named = [paths[i] if paths else f"index {i}" for i in indices[:shown]]
        more = len(indices) - shown
        return ", ".join(named) + (f" and {more} more" if more > 0 else "")
