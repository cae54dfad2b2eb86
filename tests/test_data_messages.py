"""Data inputs that gave a traceback or a misleading line (issue 32): each is now one line naming the
problem and the fix."""

import csv
import io
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import Dataset, TensorDataset

from lit_ddp.cli import build_cli, main
from lit_ddp.data import CIFAR10DataModule, ImageDataModule, ImageNetDataModule, ShapesDataModule
from lit_ddp.data.cifar10 import FOLDER
from lit_ddp.errors import UserError
from lit_ddp.models.weights import read_state_dict

QUICK = ["--trainer.max_epochs=1", "--trainer.enable_progress_bar=false", "--trainer.logger=false"]


def one_error_line(capsys, args: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.splitlines() if line.startswith("lit_ddp: error:")]
    assert exit_info.value.code != 0 and len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return lines[0]


def image_tree(root: Path, classes: dict[str, int]) -> Path:
    """``root/{train,val}/<class>/`` with ``n`` small PNGs per class (n = 0: an empty folder)."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for name, n in classes.items():
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 255, (12, 12, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


@pytest.mark.parametrize("content", ["nothing", "a text file"])
def test_a_class_folder_without_images_is_refused_in_one_line(tmp_path: Path, content: str) -> None:
    root = image_tree(tmp_path / "tree", {"cat": 3, "dog": 3, "empty": 0})
    if content == "a text file":
        (root / "train" / "empty" / "notes.txt").write_text("not an image")
    dm = ImageNetDataModule(data_dir=str(root), image_size=8, val_resize=8, index_cache=str(tmp_path / "c"))
    with pytest.raises(UserError) as err:
        dm.setup("fit")
    assert "has class folders with no image file ('empty'): add images" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_cifar_folder_missing_batches_names_them(tmp_path: Path) -> None:
    folder = tmp_path / FOLDER
    folder.mkdir()
    for name in ("data_batch_1", "data_batch_2", "data_batch_4", "data_batch_5"):
        (folder / name).write_bytes(b"")
    with pytest.raises(UserError) as err:
        CIFAR10DataModule(data_dir=str(tmp_path))
    assert f"CIFAR-10 in {folder} is incomplete: data_batch_3, test_batch missing" in str(err.value)
    with pytest.raises(UserError, match="CIFAR-10 not found in"):
        CIFAR10DataModule(data_dir=str(tmp_path / "elsewhere"))


def test_an_empty_split_is_refused_and_not_with_an_impossible_batch_size(capsys) -> None:
    with pytest.raises(UserError, match=r"--data.train_size=0 must be 1 or more"):
        ShapesDataModule(train_size=0)
    line = one_error_line(capsys, ["fit", "--data.train_size=0", *QUICK])
    assert "train_size=0 must be 1 or more" in line and "batch_size=0" not in line


@pytest.mark.parametrize("sync", [[], ["--trainer.sync_batchnorm=true"]])  # one device: nothing to sync with
def test_batch_size_one_with_batch_norm_is_one_line_before_training(capsys, tmp_path: Path, sync) -> None:
    args = ["fit", "--data.train_size=16", "--data.val_size=8", "--data.batch_size=1", *sync]
    args += ["--model.batch_norm=true", f"--trainer.default_root_dir={tmp_path}", *QUICK]
    line = one_error_line(capsys, args)
    assert "batch_size=1 with a BatchNorm model" in line and "--data.batch_size=2 or more" in line
    assert not list(tmp_path.iterdir())  # a failed start leaves no folder behind


def test_a_weights_file_that_names_code_is_reported_as_refused_not_corrupt(tmp_path: Path) -> None:
    class Payload:
        def __reduce__(self):
            return (os.system, ("echo never",))

    torch.save({"state_dict": {"w": torch.zeros(1)}, "payload": Payload()}, tmp_path / "evil.pt")
    with pytest.raises(UserError) as err:
        read_state_dict(tmp_path / "evil.pt")
    assert "names code that a weights-only load refuses to import" in str(err.value)
    assert "system; nothing was run" in str(err.value) and "corrupt" not in str(err.value)


def test_predict_on_renamed_class_folders_is_refused_before_any_row(tmp_path: Path, capsys) -> None:
    """A checkpoint of cat/dog/fox, then `dog` renamed `wolf` (which also reorders the sorted classes):
    `predict` wrote the same probabilities under the new names. Now the checkpoint's class names are read
    against the data's, through the CLI, and nothing is written."""
    from lit_ddp.cli import build_cli

    root = image_tree(tmp_path / "tree", {"cat": 4, "dog": 4, "fox": 4})
    args = ["--model=LeNetCIFAR", "--data=ImageNetDataModule", f"--data.data_dir={root}"]
    args += ["--data.image_size=32", "--data.val_resize=32", "--data.batch_size=4", "--data.num_workers=0"]
    args += [f"--data.index_cache={tmp_path / 'index'}", "--trainer.max_epochs=1"]
    args += ["--trainer.enable_progress_bar=false", "--trainer.limit_val_batches=1"]
    build_cli(["fit", *args, f"--trainer.default_root_dir={tmp_path / 'runs'}"])
    (ckpt,) = (tmp_path / "runs").rglob("last.ckpt")
    for split in ("train", "val"):
        (root / split / "dog").rename(root / split / "wolf")
    predict = ["predict", *args, f"--ckpt_path={ckpt}", f"--trainer.default_root_dir={tmp_path / 'pred'}"]
    line = one_error_line(capsys, predict)
    assert line == (
        "lit_ddp: error: the checkpoint's model learnt the classes ['cat', 'dog', 'fox'], but the data has"
        " ['cat', 'fox', 'wolf']: use the data (and class folders) it was trained on, or fine-tune from it"
        " with --model.weights=<checkpoint> instead of --ckpt_path"
    )
    assert not list(tmp_path.rglob("predictions.csv"))


def test_a_checkpoint_evaluates_a_folder_without_train_on_its_own_classes(tmp_path: Path, capsys) -> None:
    """validate, test and predict of a checkpoint on a folder holding the held-out splits alone (no train/)
    were refused: the classes came from train/ only. They come from the checkpoint now, each class folder
    taken to the checkpoint's label of its name: the same metrics and predictions as with train/ there, for
    a test/ that lacks a class too. Without the checkpoint's classes, or for fit, one line."""
    root = image_tree(tmp_path / "tree", {"cat": 4, "dog": 4, "fox": 4})
    args = ["--model=LeNetCIFAR", "--data=ImageNetDataModule", f"--data.data_dir={root}"]
    args += ["--data.image_size=32", "--data.val_resize=32", "--data.batch_size=4", "--data.num_workers=0"]
    args += [f"--data.index_cache={tmp_path / 'index'}", "--trainer.enable_progress_bar=false"]
    build_cli(["fit", *args, "--trainer.max_epochs=1", f"--trainer.default_root_dir={tmp_path / 'runs'}"])
    (ckpt,) = (tmp_path / "runs").rglob("last.ckpt")
    (root / "val").rename(root / "test")  # test/ without cat, the checkpoint's label 0
    shutil.rmtree(root / "test" / "cat")
    shutil.copytree(root / "test", root / "val")

    def evaluate(out: Path) -> tuple[float, float, str]:
        runs = [f"--ckpt_path={ckpt}", f"--trainer.default_root_dir={out}"]
        val = build_cli(["validate", *args, *runs]).trainer.callback_metrics["val/acc"].item()
        test = build_cli(["test", *args, *runs]).trainer.callback_metrics["test/acc"].item()
        build_cli(["predict", *args, *runs])
        (predictions,) = out.rglob("predictions.csv")
        return val, test, predictions.read_text()

    with_train = evaluate(tmp_path / "with_train")
    (root / "train").rename(tmp_path / "train")
    assert evaluate(tmp_path / "without_train") == with_train
    rows = list(csv.DictReader(io.StringIO(with_train[2])))
    assert len(rows) == 8 and all(Path(row["path"]).parent.name == row["label"] for row in rows)
    (root / "test" / "wolf").mkdir()  # a class the checkpoint never learnt
    shutil.copy(next((root / "test" / "dog").iterdir()), root / "test" / "wolf")
    line = one_error_line(capsys, ["test", *args, f"--ckpt_path={ckpt}"])
    assert line.startswith(f"lit_ddp: error: {root / 'test'} has class folders that the model did not learn")
    assert "('wolf'" in line
    shutil.rmtree(root / "val")  # the split validate reads, named as a folder without train/ has it
    line = one_error_line(capsys, ["validate", *args, f"--ckpt_path={ckpt}"])
    assert (
        line
        == f"lit_ddp: error: {root} has no val/: put the images to validate on in {root / 'val'}/<class>/"
    )
    with pytest.raises(
        UserError, match=r"^--data.class_names=\['cat', 'cat'\] must name two or more classes, each"
    ):
        ImageNetDataModule(data_dir=str(root), class_names=["cat", "cat"])
    for command in (["test", "--ckpt_path=untrained"], ["fit"]):  # no classes: the line names what gives them
        line = one_error_line(capsys, [command[0], *args, *command[1:]])
        assert line == (
            f"lit_ddp: error: {root} has no train/, whose class folders are the classes: to fit, put the"
            f" training images in {root / 'train'}/<class>/; to validate, test or predict, pass"
            " --ckpt_path=PATH to a fit's checkpoint file (it records the classes)"
        )


class _OwnData(ImageDataModule):
    """A data module of the user's own: 32 random images per split, labels 0..9 plus ``label_offset``."""

    def __init__(self, channels: int = 3, label_offset: int = 0, **kwargs) -> None:
        super().__init__(num_workers=0, **kwargs)
        self.channels, self.label_offset = channels, label_offset

    def load_split(self, split: str):
        g = torch.Generator().manual_seed(len(split))
        images = torch.randint(0, 256, (32, self.channels, 32, 32), generator=g, dtype=torch.uint8)
        return images, torch.arange(32) % 10 + self.label_offset


def test_labels_outside_the_classes_are_one_line_naming_the_split_and_the_fix(capsys, tmp_path: Path) -> None:
    """Labels 1..10 for num_classes=10: cross-entropy raised "Target 10 is out of bounds" with a traceback on
    a CPU (a device-side assert on a GPU). An in-memory split's labels are checked whole when the data is
    set up, so the first split read is the one named."""
    args = ["fit", f"--data={__name__}._OwnData", "--data.label_offset=1", "--data.batch_size=8"]
    line = one_error_line(capsys, [*args, f"--trainer.default_root_dir={tmp_path}", *QUICK])
    assert "_OwnData's train split has label 10, outside 0..9 (num_classes=10)" in line
    assert "map them to 0..num_classes-1 in load_split" in line


class _OneBadLabel(ImageDataModule):
    """64 images a split, every label right but the last training one's (12), or the last validation
    image's in a Dataset of the user's (``as_dataset``), which yields one (image, label) at a time."""

    def __init__(self, as_dataset: bool = False, **kwargs) -> None:
        super().__init__(num_workers=0, **kwargs)
        self.as_dataset = as_dataset

    def load_split(self, split: str):
        images = torch.zeros(64, 3, 32, 32, dtype=torch.uint8)
        labels = torch.arange(64) % 10
        bad = "val" if self.as_dataset else "train"
        if split == bad:
            labels[-1] = 12
        return TensorDataset(images, labels) if self.as_dataset else (images, labels)


def test_a_bad_label_in_an_in_memory_split_stops_the_run_before_any_step(capsys, tmp_path: Path) -> None:
    """The bad label is in one of the training split's eight batches, and the run trains one (not that one,
    in the seeded order): the whole split is checked as the data is set up, before the first step."""
    args = ["fit", f"--data={__name__}._OneBadLabel", "--data.batch_size=8"]
    args += ["--trainer.limit_train_batches=1"]
    line = one_error_line(capsys, [*args, f"--trainer.default_root_dir={tmp_path}", *QUICK])
    assert "_OneBadLabel's train split has label 12, outside 0..9" in line
    assert not list(tmp_path.rglob("*.ckpt"))


def test_a_test_split_of_unlabelled_images_sets_up_for_predict_and_is_refused_for_test() -> None:
    """Predict reads no label: a test split whose images carry -1 (unlabelled) predicts; ``test`` scores
    labels, so the same split is refused there, as the data is set up."""
    dm = _OneBadLabel()
    dm.load_split = lambda split: (torch.zeros(4, 3, 32, 32, dtype=torch.uint8), torch.full((4,), -1))
    dm.setup("predict")
    with pytest.raises(UserError, match="_OneBadLabel's test split has label -1, outside 0..9"):
        dm.setup("test")


def test_a_bad_label_in_a_dataset_of_the_users_is_named_when_its_batch_comes(capsys, tmp_path: Path) -> None:
    """A Dataset's labels are known only batch by batch: its batch with the bad label is refused."""
    args = ["fit", f"--data={__name__}._OneBadLabel", "--data.as_dataset=true", "--data.batch_size=8"]
    line = one_error_line(capsys, [*args, f"--trainer.default_root_dir={tmp_path}", *QUICK])
    assert "_OneBadLabel's val split has label 12, outside 0..9" in line


def test_labels_already_on_a_device_are_not_read_back_to_check_them() -> None:
    """Reading a device's labels on the host waits for the device at every step; a dataset that yields its
    batches on the device is left to cross-entropy (a meta tensor stands in: reading it raises)."""
    _OwnData()._check_labels(torch.tensor([99], device="meta"), "train")


def test_grayscale_images_with_the_default_three_channel_mean_are_one_line(capsys, tmp_path: Path) -> None:
    """1-channel images with the base's 3-value mean and std: normalisation failed with a broadcast
    traceback ("output with shape [8, 1, 32, 32] doesn't match the broadcast shape [8, 3, 32, 32]")."""
    args = ["fit", f"--data={__name__}._OwnData", "--data.channels=1", "--data.batch_size=8"]
    line = one_error_line(capsys, [*args, f"--trainer.default_root_dir={tmp_path}", *QUICK])
    assert "_OwnData's images have 1 channel(s), but its mean has 3 values and its std 3" in line
    assert "mean = (0.5,)" in line


class _Samples(Dataset):
    """32 random images whose samples are ``kind``: dicts, or (image, label, extra) triples."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.images = torch.randint(
            0, 256, (32, 3, 32, 32), generator=torch.Generator().manual_seed(0)
        ).byte()

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        if self.kind == "dict":
            return {"image": self.images[i], "label": i % 10}
        return self.images[i], i % 10, i // 4


class _SampleData(_OwnData):
    def __init__(self, kind: str = "dict", **kwargs) -> None:
        super().__init__(**kwargs)
        self.kind = kind

    def load_split(self, split: str):
        return _Samples(self.kind)


@pytest.mark.parametrize(
    ("kind", "said"), [("dict", "dict samples (keys image, label)"), ("triple", "samples of 3 items")]
)
@pytest.mark.parametrize("sanity", [True, False])
def test_a_dataset_of_dicts_or_triples_is_one_line_for_training_and_validation(
    capsys, tmp_path: Path, kind: str, said: str, sanity: bool
) -> None:
    """Dict samples failed with "'str' object has no attribute 'device'" (the training loader unpacked the
    dict into its keys); (image, label, extra) samples failed validation with a traceback and, in training,
    had the extra taken for the sample indices that key the augmentation, in silence."""
    args = ["fit", f"--data={__name__}._SampleData", f"--data.kind={kind}", "--data.batch_size=8"]
    args += [f"--trainer.num_sanity_val_steps={2 if sanity else 0}"]
    line = one_error_line(capsys, [*args, f"--trainer.default_root_dir={tmp_path}", *QUICK])
    split = "val" if sanity else "train"
    assert f"_SampleData's {split} split yields {said}" in line, line
    assert "not (image, label) pairs" in line


class _PILSamples(Dataset):
    """32 (PIL image, label) samples, as a torchvision-style Dataset without its ToTensor returns them."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int):
        return Image.fromarray(np.full((32, 32, 3), i, dtype=np.uint8)), i % 10


class _PILData(ImageDataModule):
    def load_split(self, split: str):
        return _PILSamples()


@pytest.mark.parametrize(("sanity", "workers"), [(True, 0), (False, 0), (False, 1)])
def test_a_dataset_of_pil_images_is_one_line_naming_the_conversion(
    capsys, tmp_path: Path, sanity: bool, workers: int
) -> None:
    """default_collate's TypeError traceback ("batch must contain tensors, numpy arrays, ...; found <class
    'PIL.Image.Image'>"), in training and validation, from the main process or a loader worker."""
    args = ["fit", f"--data={__name__}._PILData", "--data.batch_size=8", f"--data.num_workers={workers}"]
    args += [f"--trainer.num_sanity_val_steps={2 if sanity else 0}"]
    line = one_error_line(capsys, [*args, f"--trainer.default_root_dir={tmp_path}", *QUICK])
    assert "samples hold a PIL.Image.Image, which the loader cannot batch" in line, line
    assert "pil_to_tensor" in line, line


class _ChannelsLast(_OwnData):
    def load_split(self, split: str):
        images, labels = super().load_split(split)
        return images.permute(0, 2, 3, 1).contiguous(), labels  # (N, H, W, C), as numpy arrays come


def test_channels_last_images_are_named_as_such_not_as_32_channels(capsys, tmp_path: Path) -> None:
    """(N, H, W, C) images from numpy were called images of 32 channels, with a 32-value mean to set."""
    args = ["fit", f"--data={__name__}._ChannelsLast", "--data.batch_size=8"]
    line = one_error_line(capsys, [*args, f"--trainer.default_root_dir={tmp_path}", *QUICK])
    assert "_ChannelsLast's images arrive as (8, 32, 32, 3), channels last (B, H, W, C)" in line
    assert "permute(0, 3, 1, 2)" in line


class _TensorSplit(_OwnData):
    def __init__(self, mistake: str = "float", **kwargs) -> None:
        super().__init__(**kwargs)
        self.mistake = mistake

    def load_split(self, split: str):
        images, labels = super().load_split(split)
        if self.mistake == "float":
            return images.float() / 255, labels
        if self.mistake == "no channel":
            return images[:, 0], labels
        return images, labels[:-1]


@pytest.mark.parametrize(
    ("mistake", "says"),
    [
        ("float", "dtype torch.float32: give uint8 images in 0..255 (from floats in [0, 1]"),
        ("no channel", "shape (32, 32, 32) and dtype torch.uint8: give (N, C, H, W) images (grayscale"),
        ("labels", "give one label per image (31 labels for 32 images)"),
    ],
)
def test_a_tensor_split_of_another_form_is_one_line_naming_the_conversion(
    capsys, tmp_path: Path, mistake: str, says: str
) -> None:
    """Float images in [0, 1], grayscale (N, H, W) images or one label short were a ValueError traceback
    from TensorImageDataset ("expected (N, C, H, W) uint8 images and N labels")."""
    args = ["fit", f"--data={__name__}._TensorSplit", f"--data.mistake={mistake}", "--data.batch_size=8"]
    line = one_error_line(capsys, [*args, f"--trainer.default_root_dir={tmp_path}", *QUICK])
    assert "_TensorSplit.load_split('train') returned images of shape" in line and says in line, line


@pytest.mark.parametrize(
    ("mistake", "says"),
    [
        ("numpy images", "returned its images as a numpy.ndarray, not a torch tensor: return torch.from_"),
        ("list labels", "returned its labels as a list, not a torch tensor: return torch.tensor(labels)"),
    ],
)
def test_a_pair_of_arrays_or_lists_is_one_line_naming_the_conversion(mistake: str, says: str) -> None:
    """numpy uint8 images were refused as images "of dtype uint8: give uint8 images" (a numpy dtype is not
    torch's); labels as a list were an AttributeError traceback ('list' object has no attribute 'long')."""
    dm = _OwnData()
    images, labels = dm.load_split("train")
    pair = (images.numpy(), labels) if mistake == "numpy images" else (images, labels.tolist())
    dm.load_split = lambda split: pair
    with pytest.raises(UserError) as err:
        dm.setup("fit")
    assert f"_OwnData.load_split('train') {says}" in str(err.value), err.value


@pytest.mark.parametrize(
    ("mistake", "says"),
    [
        ("fractions", "train split has label 0.5, not a class index: labels are whole numbers 0..9"),
        ("column", "train split has labels of shape (32, 1): give one class index per image, shape (N,)"),
        ("one-hot", "train split has labels of shape (32, 10): give one class index per image"),
    ],
)
def test_labels_that_are_not_one_class_index_per_image_are_one_line(mistake: str, says: str) -> None:
    """Float labels 0.5, 1.5, ... were cast to int64 in silence (0, 1, ...: another task trained); (N, 1)
    and one-hot labels were cross-entropy's traceback at the first step."""
    dm = _OwnData()
    images, labels = dm.load_split("train")
    if mistake == "fractions":
        labels = labels + 0.5
    elif mistake == "column":
        labels = labels[:, None]
    else:
        labels = torch.nn.functional.one_hot(labels, 10)
    dm.load_split = lambda split: (images, labels)
    with pytest.raises(UserError) as err:
        dm.setup("fit")
    assert f"_OwnData's {says}" in str(err.value), err.value


class _DatasetLabels(_OwnData):
    """The splits as a Dataset whose labels are ``kind``: int32 tensors, whole floats, or (1,) tensors."""

    def __init__(self, kind: str = "int32", **kwargs) -> None:
        super().__init__(**kwargs)
        self.kind = kind

    def load_split(self, split: str):
        images, labels = super().load_split(split)
        if self.kind == "int32":
            return TensorDataset(images, labels.int())
        if self.kind == "float":
            return TensorDataset(images, labels.double())
        return TensorDataset(images, labels[:, None])


@pytest.mark.parametrize("kind", ["int32", "float"])
def test_a_dataset_of_int32_or_whole_float_labels_trains_as_a_pair_of_them_does(tmp_path: Path, kind) -> None:
    """A pair's labels are cast to int64; a Dataset's int32 or float labels reached cross-entropy as they
    were ("expected target dtype to be Long or Byte", a traceback)."""
    args = ["fit", f"--data={__name__}._DatasetLabels", f"--data.kind={kind}", "--data.batch_size=8"]
    args += ["--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1"]
    cli = build_cli([*args, f"--trainer.default_root_dir={tmp_path}", *QUICK])
    metrics = cli.trainer.callback_metrics
    assert cli.trainer.global_step == 1 and torch.isfinite(metrics["val/loss"]) and "val/acc" in metrics


def test_a_dataset_of_one_element_labels_is_one_line_naming_getitem(capsys, tmp_path: Path) -> None:
    """Labels of shape (1,) per sample batch to (B, 1): cross-entropy's "0D or 1D target tensor expected"."""
    args = ["fit", f"--data={__name__}._DatasetLabels", "--data.kind=column", "--data.batch_size=8"]
    line = one_error_line(capsys, [*args, f"--trainer.default_root_dir={tmp_path}", *QUICK])
    assert "_DatasetLabels's val split has labels of shape (1,) per sample: __getitem__ must" in line, line


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter([])


@pytest.mark.parametrize(
    ("stage", "returned", "limit_val", "says"),
    [
        ("fit", "no val", 1.0, "load_split('val') returned None, and fit reads the val split: return it"),
        ("test", "no test", 1.0, "load_split('test') returned None, and test reads the test split"),
        ("fit", "iterable", 1.0, "load_split('train') returned a dataset without a length (_Stream, an iter"),
        ("fit", "no val", 0, ""),  # a fit that does not validate reads no val split: it sets up
    ],
)
def test_a_split_returned_as_none_or_as_an_iterable_dataset_is_one_line(
    stage: str, returned: str, limit_val: float, says: str
) -> None:
    """A val split returned as None was the loader's RuntimeError traceback after the model summary ("setup()
    did not create this split"); an IterableDataset was a TypeError traceback ("has no len()")."""
    from lightning import Trainer

    dm = _OwnData(batch_size=8)
    pairs = {split: dm.load_split(split) for split in ("train", "val", "test")}
    missing = {"no val": "val", "no test": "test"}.get(returned)
    dm.load_split = lambda split: (
        None if split == missing else _Stream() if returned == "iterable" else pairs[split]
    )
    dm.trainer = Trainer(accelerator="cpu", logger=False, limit_val_batches=limit_val)
    if not says:
        dm.setup(stage)
        assert dm.val_set is None and len(dm.train_set) == 32
        return
    with pytest.raises(UserError) as err:
        dm.setup(stage)
    assert f"_OwnData.{says}" in str(err.value), err.value


class _FewNames(_OwnData):
    class_names = ("cat", "dog")


def test_fewer_class_names_than_classes_is_one_line_not_a_half_named_predictions_file(
    capsys, tmp_path: Path
) -> None:
    """class_names for 2 of 10 classes: predictions.csv named labels 0 and 1 and numbered the rest, in
    silence."""
    args = ["predict", f"--data={__name__}._FewNames", "--data.batch_size=8", "--ckpt_path=untrained"]
    line = one_error_line(capsys, [*args, f"--trainer.default_root_dir={tmp_path}", *QUICK])
    assert "_FewNames has 2 class_names for num_classes=10: give one name per class" in line


class NoTestImages(ShapesDataModule):
    """A data module of a user's own whose test split came out empty."""

    def load_split(self, split: str):
        data = super().load_split(split)
        return torch.utils.data.Subset(data, []) if split == "test" else data


@pytest.mark.parametrize("stage", ["fit", "test"])
def test_a_trainer_of_your_own_gets_the_splits_checks_too(tmp_path: Path, stage: str) -> None:
    """The data module checks its splits in its own setup: a plain Lightning Trainer, with none of lit_ddp's
    callbacks, is told a batch larger than the training split, or an empty test split, in one line."""
    from lightning import Trainer

    from lit_ddp.models import LeNetCIFAR

    quiet = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False}
    trainer = Trainer(default_root_dir=tmp_path, max_epochs=1, accelerator="cpu", **quiet)
    model = LeNetCIFAR(num_classes=ShapesDataModule().num_classes)
    with pytest.raises(UserError) as err:
        if stage == "fit":
            trainer.fit(model, datamodule=ShapesDataModule(train_size=24, val_size=8, batch_size=32))
        else:
            trainer.test(model, datamodule=NoTestImages(test_size=8, batch_size=8))
    expected = (
        "--data.batch_size=32 is more than the 24 training images"
        if stage == "fit"
        else "the test split holds no sample: test would report no metric"
    )
    assert str(err.value).startswith(expected)


@pytest.mark.parametrize("first", ["val", "train", "predict"])
def test_a_data_modules_loaders_given_to_a_trainer_without_it_name_datamodule(first: str) -> None:
    """``trainer.fit(model, dm.train_dataloader(), dm.val_dataloader())`` hands the model the loaders' uint8
    images, never normalised (the data module's on_after_batch_transfer runs only for ``datamodule=dm``):
    a first validation batch was 'LeNet cannot take the data's 3×32×32 images (Input type (unsigned
    char) ...): give the data the image size the network is built for', a first training batch 'too many
    values to unpack (expected 2)'."""
    import lightning as L

    from lit_ddp.models import ImageClassifier, LeNet

    dm = ShapesDataModule(train_size=32, val_size=16, test_size=16, batch_size=8)
    dm.setup("fit" if first != "predict" else "predict")
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=2 if first == "val" else 0,
    )
    model = ImageClassifier(net=LeNet)
    with pytest.raises(UserError) as err:
        if first == "predict":
            trainer.predict(model, dm.predict_dataloader())
        else:
            trainer.fit(model, dm.train_dataloader(), dm.val_dataloader())
    assert str(err.value).startswith("ImageClassifier got uint8 images, not normalised ones"), err.value
    assert "pass datamodule=dm to the Trainer's fit, validate, test or predict" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("loader", ["train", "val", "test", "predict"])
def test_a_data_modules_loader_asked_for_before_setup_says_to_call_setup(loader: str) -> None:
    """``dm.train_dataloader()`` before any ``setup`` (a loop of your own, a look at a batch in a notebook)
    raised RuntimeError "ShapesDataModule.setup() did not create this split": setup had never run."""
    dm = ShapesDataModule(train_size=32, val_size=16, test_size=16, batch_size=8)
    with pytest.raises(UserError) as err:
        getattr(dm, f"{loader}_dataloader")()
    assert str(err.value).startswith("ShapesDataModule's splits are not loaded: call dm.setup("), err.value
    assert "\n" not in str(err.value)
    dm.setup("predict" if loader == "predict" else "test" if loader == "test" else "fit")
    assert len(getattr(dm, f"{loader}_dataloader")().dataset) > 0
