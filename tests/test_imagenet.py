"""ResNet on an ImageNet-layout folder: decoding real files, skipping bad ones, fit/validate/test, CPU DDP."""

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, read_scalars, run_cli, run_dirs
from imagenet_tree import CLASSES, add_macos_junk, draw, make_tree
from lightning import Callback
from PIL import Image
from torchvision import transforms

from lit_ddp.cli import build_cli
from lit_ddp.data import ImageNetDataModule
from lit_ddp.data.jpeg import _draft, center_crop_box, load_eval_crop, load_train_crop
from lit_ddp.errors import UserError
from lit_ddp.models import ArchClassifier

CONFIG = str(REPO / "configs" / "resnet_imagenet.yaml")
TRAIN_FILES, VAL_FILES = 3 * 8 + 3, 3 * 4 + 2  # per-class files + the special ones of each split


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    root = tmp_path_factory.mktemp("imagenet")
    return root, make_tree(root)


def small_run(root: Path, out: Path) -> list[str]:
    """The issue's done-when command line (plus a log folder)."""
    return [
        f"--config={CONFIG}",
        f"--data.data_dir={root}",
        "--model.arch=resnet18",
        "--data.image_size=64",
        "--data.val_resize=72",
        "--data.batch_size=8",
        "--trainer.accelerator=cpu",
        "--trainer.precision=32-true",
        "--trainer.enable_progress_bar=false",
        "--trainer.log_every_n_steps=1",
        f"--trainer.default_root_dir={out}",
    ]


# ---- decoding -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["grayscale", "cmyk", "png"])
def test_awkward_files_decode_to_rgb_crops(tree, kind: str) -> None:
    path = str(tree[1][kind])
    for crop in (load_train_crop(path, 48, (0.08, 1.0), (3 / 4, 4 / 3)), load_eval_crop(path, 48, 56)):
        assert crop.shape == (48, 48, 3) and crop.dtype == np.uint8
    if kind == "grayscale":  # grey stays grey: all three channels equal
        assert (crop[..., 0] == crop[..., 1]).all() and (crop[..., 1] == crop[..., 2]).all()


def test_truncated_and_corrupt_files_raise(tree) -> None:
    with pytest.raises(OSError, match="truncated"):
        load_eval_crop(str(tree[1]["truncated"]), 48, 56)
    with pytest.raises(OSError):
        load_eval_crop(str(tree[1]["corrupt"]), 48, 56)


def test_crops_match_torchvision_and_draft_decodes_fewer_pixels(tmp_path: Path) -> None:
    # A smooth 800×600 photo-like image: our crops should look like torchvision's PIL pipeline's.
    yy, xx = np.mgrid[0:600, 0:800] / 100.0
    rgb = np.stack([np.sin(xx), np.cos(yy), np.sin(xx + yy)], -1) * 100 + 128
    path = tmp_path / "big.jpg"
    Image.fromarray(rgb.astype(np.uint8)).save(path, quality=95)
    with Image.open(path) as img:
        reference = np.asarray(transforms.CenterCrop(64)(transforms.Resize(72)(img.convert("RGB")))).astype(
            float
        )
    full = load_eval_crop(str(path), 64, 72, draft=False)
    drafted = load_eval_crop(str(path), 64, 72, draft=True)
    assert np.abs(full - reference).mean() < 1.5 and np.abs(drafted - reference).mean() < 2.5
    with Image.open(path) as img:  # the eval box is 533 px for 64: libjpeg reduces 8× while decoding
        assert _draft(img, center_crop_box(800, 600, 64, 72), 64) is not None and img.size == (100, 75)
    with Image.open(path) as img:  # a 100-px crop cannot go below 64 px by halving: full decode
        assert _draft(img, (0, 0, 100, 100), 64) is None and img.size == (800, 600)


def test_batches_are_channels_last_and_unreadable_slots_are_dropped(tree) -> None:
    dm = ImageNetDataModule(data_dir=str(tree[0]), image_size=32, val_resize=36, batch_size=4, num_workers=0)
    dm.setup("fit")
    paths = [p for p, _ in dm.train_set.samples]
    bad_index = paths.index(str(tree[1]["truncated"]))
    batch = dm.train_set.__getitems__([0, bad_index, 1])
    x, y, bad = batch.images, batch.labels, batch.unreadable
    assert x.shape == (3, 3, 32, 32) and x.dtype == torch.uint8
    assert x.is_contiguous(memory_format=torch.channels_last)
    assert list(bad) == [1] and bad[1][0] == str(tree[1]["truncated"]) and "truncated" in bad[1][1]
    kept = batch.drop(bad)
    assert kept.images.shape[0] == 2 and torch.equal(kept.labels, y[[0, 2]]) and not kept.unreadable


# ---- the system ---------------------------------------------------------------------------------------


def test_resnet_system_switches() -> None:
    plain = ArchClassifier(num_classes=3, arch="resnet18")
    model = ArchClassifier(
        num_classes=3, arch="resnet18", zero_init_residual=True, channels_last=True, compile=True
    )
    assert model.net.layer1[0].bn2.weight.abs().sum() == 0  # each residual block starts as the identity
    assert plain.net.layer1[0].bn2.weight.abs().sum() > 0
    assert model.net.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    model.configure_model()  # where Lightning compiles it, on each rank
    assert model.net._compiled_call_impl is not None
    assert model.state_dict().keys() == plain.state_dict().keys()  # checkpoints load either way
    with pytest.raises(UserError, match="unknown arch 'resnet19'.*resnet18"):
        ArchClassifier(arch="resnet19")


# ---- the data module's errors ---------------------------------------------------------------------


def test_missing_or_empty_data_dir_is_one_clear_error(tmp_path: Path, capsys) -> None:
    (tmp_path / "empty" / "train").mkdir(parents=True)
    for folder in (tmp_path / "missing", tmp_path / "empty"):
        with pytest.raises(
            UserError, match=r"expected .*/train/<class>/\*\.JPEG and .*/val/<class>/\*\.JPEG"
        ):
            ImageNetDataModule(data_dir=str(folder))
    from lit_ddp.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["fit", f"--config={CONFIG}", f"--data.data_dir={tmp_path / 'missing'}"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert "lit_ddp: error: no image folders in" in err and "Traceback" not in err


def test_a_relative_data_dir_that_is_not_there_names_the_folder_it_was_read_from(
    tmp_path: Path, monkeypatch
) -> None:
    """`data_dir: imgs` in a job started in another folder said `no image folders in imgs`, and no more."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as err:
        ImageNetDataModule(data_dir="imgs")
    assert str(err.value).startswith(
        f"no image folders in imgs (read from the current folder, as {tmp_path}/imgs):"
    )
    (tmp_path / "imgs" / "train").mkdir(parents=True)  # there, but empty: the path as given is enough
    with pytest.raises(UserError, match=r"^no image folders in imgs: expected"):
        ImageNetDataModule(data_dir="imgs")


def test_an_image_size_below_one_is_refused_before_anything_is_read(tree) -> None:
    """--data.image_size=0 reached the network as 0-pixel crops and failed there, after training started."""
    with pytest.raises(UserError, match=r"^--data.image_size=0 must be 1 or more \(the side of the square"):
        ImageNetDataModule(data_dir=str(tree), image_size=0)


def test_a_one_class_folder_is_refused_at_once_in_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    make_tree(tmp_path / "all")
    for split in ("train", "val"):
        for wnid in CLASSES[1:]:
            shutil.rmtree(tmp_path / "all" / split / wnid)
    from lit_ddp.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["fit", f"--config={CONFIG}", f"--data.data_dir={tmp_path / 'all'}"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1
    assert err.startswith("lit_ddp: error: ") and f"has one class folder ({CLASSES[0]})" in err
    assert not (tmp_path / "logs").exists()


def test_a_tree_without_val_names_the_missing_split_and_predicts_on_a_folder(tmp_path: Path, capsys) -> None:
    make_tree(tmp_path / "data")
    shutil.rmtree(tmp_path / "data" / "val")
    from lit_ddp.cli import main

    # It said "no image folders in DIR" and to pass another --data.data_dir: the folder was the right one.
    args = [*small_run(tmp_path / "data", tmp_path / "logs"), "--data.num_workers=0"]
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *args, "--trainer.max_epochs=1"])
    err = capsys.readouterr().err.strip()
    data = tmp_path / "data"
    assert exit_info.value.code == 2 and err == (
        f"lit_ddp: error: {data} has train/ but no val/: set some images of each class aside in"
        f" {data / 'val'}/<class>/, the class folders of train/, to validate on"
    )
    # Predicting on a folder reads no split: it needs train/'s classes only.
    folder = data / "train" / CLASSES[0]
    build_cli(["predict", *args, "--ckpt_path=untrained", f"--data.predict_dir={folder}"])
    (csv,) = (tmp_path / "logs").rglob("predictions.csv")
    assert len(csv.read_text().splitlines()) == 1 + 8 + 1  # a header, 8 files, gray (truncated: unread)


def test_test_reads_test_without_val_and_names_test_when_it_is_missing(tmp_path: Path, capsys) -> None:
    """A tree of train/ and test/: `test` was refused for want of val/ (checked at construction, for every
    subcommand), though it reads test/. It scores test/ now; fit still needs val/, and a tree of train/
    alone is refused by `test` naming test/, the folder it reads."""
    data = tmp_path / "data"
    make_tree(data)
    (data / "val").rename(data / "test")
    from lit_ddp.cli import main

    args = [*small_run(data, tmp_path / "logs"), "--data.num_workers=0"]
    cli = build_cli(["test", *args, "--ckpt_path=untrained"])
    assert cli.datamodule.test_split == "test"
    assert cli.trainer.callback_metrics["test/skipped_images"] == 1  # test/CLASSES[1]/corrupt.JPEG: read
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *args, "--trainer.max_epochs=1"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err.startswith(f"lit_ddp: error: {data} has train/ but no val/: ")
    shutil.rmtree(data / "test")
    with pytest.raises(SystemExit) as exit_info:
        main(["test", *args, "--ckpt_path=untrained"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"lit_ddp: error: {data} has train/ but no test/") and str(data / "test") in err


def test_strict_stops_at_the_first_unreadable_file_naming_it(tree, tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"unreadable image file .*(truncated|corrupt)\.JPEG") as err:
        build_cli(["fit", *small_run(tree[0], tmp_path), "--data.strict=true", "--data.num_workers=0"])
    assert "delete" not in str(err.value)  # the file may be fine (a permission or disk error reads the same)


@pytest.mark.parametrize("empty", ["train", "val"])
def test_a_split_of_unreadable_files_is_refused_not_run_on_placeholders(tmp_path: Path, empty: str) -> None:
    """Every file of a split empty: the run trained and scored black placeholders, exit 0 ("acc 0.4167");
    a few unreadable files are still left out with a report (test_fit_validate_test_in_process)."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for label, wnid in enumerate(CLASSES):
            (tmp_path / "data" / split / wnid).mkdir(parents=True)
            for i in range(2):
                path = tmp_path / "data" / split / wnid / f"{i}.JPEG"
                path.write_bytes(b"") if split == empty else draw(label, (80, 80), rng).save(path)
    args = [
        *small_run(tmp_path / "data", tmp_path / "logs"),
        "--data.num_workers=0",
        "--trainer.max_epochs=1",
        "--data.batch_size=3",
    ]
    command = (
        ["fit", "--trainer.limit_val_batches=0"]
        if empty == "train"
        else ["validate", "--ckpt_path=untrained"]
    )
    with pytest.raises(
        UserError, match=rf"every one of the 6 {empty} image files read this epoch is unreadable"
    ):
        build_cli([*command, *args])


def two_per_class(root: Path, train: tuple[str, ...], val: tuple[str, ...]) -> None:
    """train/ and val/ with two 80×80 JPEGs in each of the given class folders."""
    rng = np.random.default_rng(0)
    for split, classes in (("train", train), ("val", val)):
        for wnid in classes:
            (root / split / wnid).mkdir(parents=True)
            for i in range(2):
                draw(CLASSES.index(wnid), (80, 80), rng).save(root / split / wnid / f"{i}.JPEG")


def test_a_class_without_validation_images_has_no_class_accuracy_curve(tmp_path: Path) -> None:
    """A val/ without one of train/'s class folders: TensorBoard drew val_class_acc/<that class> at 0.0
    every epoch, a class the model seemed never to recognise, though no image of it was scored."""
    two_per_class(tmp_path / "data", CLASSES, CLASSES[:2])
    args = [
        "fit",
        *small_run(tmp_path / "data", tmp_path / "logs"),
        "--data.batch_size=3",
        "--data.image_size=32",
        "--data.val_resize=36",
        "--data.num_workers=0",
        "--trainer.max_epochs=1",
    ]
    result = run_cli(args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    scalars = read_scalars(run_dirs(tmp_path / "logs")[0])
    assert {k for k in scalars if k.startswith("val_class_acc/")} == {
        f"val_class_acc/{c}" for c in CLASSES[:2]
    }


def test_a_vit_given_crops_of_another_size_is_one_line_and_leaves_no_run_folder(tmp_path: Path) -> None:
    """--model.arch=vit_b_16 with 32-pixel crops: torchvision's "AssertionError: Wrong image height!
    Expected 224 but got 32!" traceback, exit 1, and a version_0 with config.yaml and hparams.yaml left."""
    two_per_class(tmp_path / "data", CLASSES[:2], CLASSES[:2])
    args = [
        "fit",
        *small_run(tmp_path / "data", tmp_path / "logs"),
        "--model.arch=vit_b_16",
        "--model.zero_init_residual=false",
        "--data.batch_size=2",
        "--data.image_size=32",
        "--data.val_resize=36",
        "--data.num_workers=0",
        "--trainer.max_epochs=1",
    ]
    result = run_cli(args, cwd=tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert lines[-1] == (
        "lit_ddp: error: VisionTransformer cannot take the data's 3×32×32 images (Wrong image height!"
        " Expected 224 but got 32!): give the data the image size the network is built for"
        " (--data.image_size), or choose a network for this size"
    )
    assert not list((tmp_path / "logs").rglob("*.yaml"))  # the failed start left no run folder behind


def test_macos_junk_and_hidden_entries_are_neither_classes_nor_images(tmp_path: Path) -> None:
    make_tree(tmp_path)
    junk = {str(p) for p in add_macos_junk(tmp_path)}
    dm = ImageNetDataModule(data_dir=str(tmp_path), image_size=32, val_resize=36, num_workers=0)
    assert dm.class_names == CLASSES  # not 4 classes with __MACOSX: the head would be silently wrong
    dm.setup("fit")
    listed = [path for split in (dm.train_set, dm.val_set) for path, _ in split.samples]
    assert not junk & set(listed) and not any(Path(path).name.startswith(".") for path in listed)
    assert (len(dm.train_set), len(dm.val_set)) == (TRAIN_FILES, VAL_FILES)


def test_files_left_out_for_their_extension_are_counted_and_named(tmp_path: Path, caplog) -> None:
    """A phone's .heic photos and a browser's .jfif downloads in a class folder were left out of training
    without a word (the listing counted only the files it kept): the listing names them, with the
    extensions it reads. Hidden files stay unmentioned, as they are never images."""
    make_tree(tmp_path)
    cls = CLASSES[1]
    for name in ("IMG_0001.HEIC", "IMG_0002.heic", "download.jfif", "Thumbs.db", ".DS_Store"):
        (tmp_path / "train" / cls / name).write_bytes(b"x")
    cache = str(tmp_path / "cache")
    dm = ImageNetDataModule(
        data_dir=str(tmp_path), image_size=32, val_resize=36, num_workers=0, index_cache=cache
    )
    with caplog.at_level("INFO"):
        dm.prepare_data()
    (line,) = [m for m in caplog.messages if m.startswith(str(tmp_path / "train"))]
    assert line.endswith(
        f" s); 4 other file(s) left out: .heic 2 ({cls}/IMG_0001.HEIC), .db 1 ({cls}/Thumbs.db), .jfif 1"
        f" ({cls}/download.jfif). Only .jpg, .jpeg, .png, .ppm, .bmp, .pgm, .tif,"
        " .tiff, .webp, .gif files are read as images: convert any image among them to .jpg or .png"
    )
    (line,) = [m for m in caplog.messages if m.startswith(str(tmp_path / "val"))]
    assert "left out" not in line
    dm.setup("fit")
    assert (len(dm.train_set), len(dm.val_set)) == (TRAIN_FILES, VAL_FILES)


def test_a_val_class_that_train_lacks_is_refused_naming_the_fix(tmp_path: Path) -> None:
    """Its line said "fix the layout": it names where the class folders must be, or go."""
    make_tree(tmp_path)
    (tmp_path / "val" / "yak").mkdir()
    draw(0, (40, 40), np.random.default_rng(0)).save(tmp_path / "val" / "yak" / "y.jpg")
    dm = ImageNetDataModule(data_dir=str(tmp_path), image_size=32, val_resize=36, num_workers=0)
    with pytest.raises(UserError) as info:
        dm.setup("fit")
    assert str(info.value) == (
        f"{tmp_path / 'val'} has class folders that train/ lacks ('yak'): the classes are the folders of"
        f" {tmp_path / 'train'}; add each there with its training images, or move it out of"
        f" {tmp_path / 'val'}"
    )


def test_images_outside_the_class_folders_are_named_not_skipped_without_a_word(tmp_path: Path) -> None:
    make_tree(tmp_path)
    # A half-sorted train/: the files beside the class folders have no class. They are left out (as
    # torchvision's ImageFolder does), with a warning naming them; before, the count of files was all.
    for i in range(2):
        draw(0, (80, 80), np.random.default_rng(i)).save(tmp_path / "train" / f"unsorted{i}.jpg")
    dm = ImageNetDataModule(data_dir=str(tmp_path), image_size=32, val_resize=36, num_workers=0)
    with pytest.warns(UserWarning) as record:
        dm.setup("fit")
    (line,) = [str(w.message) for w in record if "class folders" in str(w.message)]
    assert line == (
        f"{tmp_path / 'train'}: 2 image files lie beside the class folders, in no class, and the train split"
        f" leaves them out (such as {tmp_path / 'train' / 'unsorted0.jpg'}): move each into the folder of its"
        " class"
    )
    assert (len(dm.train_set), len(dm.val_set)) == (TRAIN_FILES, VAL_FILES)
    # An unsorted val/ (ImageNet's own, before valprep.sh): it said "no image files in val".
    for path in (tmp_path / "val").rglob("*.JPEG"):
        path.rename(tmp_path / "val" / path.name)
    for folder in [p for p in (tmp_path / "val").iterdir() if p.is_dir()]:
        folder.rmdir()
    first = min(p.name for p in (tmp_path / "val").iterdir())
    dm = ImageNetDataModule(data_dir=str(tmp_path), image_size=32, val_resize=36, num_workers=0)
    with pytest.raises(UserError) as err:
        dm.setup("validate")
    assert str(err.value) == (
        f"{tmp_path / 'val'} holds {VAL_FILES} image files but no class folder (such as"
        f" {tmp_path / 'val' / first}): sort them into folders named as the classes in train/"
        f" ({tmp_path / 'val'}/<class>/{first})"
    )


def test_the_imagenet_recipe_starts_no_more_workers_than_the_cores_can_feed(tmp_path, monkeypatch) -> None:
    """README's CPU run (2 processes on 2 cores) took 148 s with the recipe's 10 workers per device, 19 s
    with 0: the recipe leaves num_workers to the automatic count."""
    make_tree(tmp_path / "tree")
    args = [*small_run(tmp_path / "tree", tmp_path), "--trainer.devices=2", "--trainer.strategy=ddp_spawn"]
    cli = build_cli(args, run=False)
    dm = cli.datamodule
    assert dm.num_workers is None
    dm.trainer = cli.trainer  # as fit() attaches it: the count is per device of this node
    monkeypatch.setattr("lit_ddp.data.base.available_cpus", lambda: 2)
    assert dm.workers_per_device() == 0


# ---- training -------------------------------------------------------------------------------------


class CountSamples(Callback):
    """Images that reached validation_step/test_step, after unreadable files were dropped."""

    def __init__(self) -> None:
        self.seen = {"val": 0, "test": 0}

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking:
            self.seen["val"] += len(batch[1])

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.seen["test"] += len(batch[1])


@pytest.mark.timeout(300)
def test_fit_validate_test_in_process(tree, tmp_path: Path) -> None:
    root, special = tree
    args = [
        *small_run(root, tmp_path),
        "--trainer.max_epochs=3",
        "--data.num_workers=2",
        "--model.channels_last=true",
    ]
    # Two workers: each meets different files, and the report must still name each bad file once.
    with pytest.warns(UserWarning, match=r"skipped 1 unreadable train image") as record:
        cli = build_cli(args, run=False)
        counter = CountSamples()
        cli.trainer.callbacks.append(counter)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    skipped = [str(w.message) for w in record if "unreadable" in str(w.message)]
    assert sum("train image" in m for m in skipped) == 1 and sum("val image" in m for m in skipped) == 1
    assert str(special["truncated"]) in " ".join(skipped) and str(special["corrupt"]) in " ".join(skipped)

    model, dm, trainer = cli.model, cli.datamodule, cli.trainer
    assert isinstance(model, ArchClassifier) and model.hparams.num_classes == len(CLASSES) == dm.num_classes
    named = {split: list(dm.unreadable.reported(split)) for split in ("train", "val", "test")}
    assert named == {"train": [str(special["truncated"])], "val": [str(special["corrupt"])], "test": []}
    metrics = trainer.callback_metrics
    assert metrics["train/skipped_images"] == 1 and metrics["val/skipped_images"] == 1
    assert 0.0 <= metrics["val/acc"] <= 1.0 and torch.isfinite(metrics["val/loss"])
    assert "val/acc_top5" not in metrics  # top-5 of 3 classes would always be right: left out
    assert counter.seen["val"] == 3 * (VAL_FILES - 1)  # every readable val image once per epoch, no padding

    val = trainer.validate(model, datamodule=dm, verbose=False)[0]
    test = trainer.test(model, datamodule=dm, verbose=False)[0]
    assert val["val/acc"] == pytest.approx(metrics["val/acc"].item())  # same weights, same images
    assert test["test/acc"] == pytest.approx(val["val/acc"])  # no test/ folder: the test stage reads val/
    assert test["test/skipped_images"] == 1
    assert counter.seen["test"] == VAL_FILES - 1
    scalars = read_scalars(run_dirs(tmp_path)[0])
    assert {"val/acc", "train/loss_epoch", "train/skipped_images"} <= set(scalars)


def test_an_evaluation_at_other_crop_sizes_than_the_checkpoint_s_is_noted(
    tree, tmp_path: Path, caplog
) -> None:
    """predict with the recipe's crop sizes of a model fine-tuned on smaller crops labelled every image with
    one confident class and said nothing of it: validate, test and predict name the sizes the checkpoint was
    trained on, and run at those they were given (deliberately, as in FixRes)."""
    root, _ = tree
    args = [*small_run(root, tmp_path), "--data.num_workers=0"]
    one = ["--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1"]
    one += ["--trainer.limit_test_batches=1"]
    build_cli(["fit", *args, *one, "--trainer.max_epochs=1"])
    evaluate = ["test", *args, *one, f"--ckpt_path={next(tmp_path.rglob('last.ckpt'))}"]
    with caplog.at_level("INFO"):
        build_cli(evaluate)  # the sizes it was trained on: nothing to say
        cli = build_cli([*evaluate, "--data.image_size=96", "--data.val_resize=110"])
    assert [m for m in caplog.messages if "crop" in m] == [
        "lit_ddp: note: the checkpoint's model was trained with --data.image_size=64 --data.val_resize=72,"
        " this test crops with --data.image_size=96 --data.val_resize=110: pass the checkpoint's sizes to"
        " test on crops like those it learnt from"
    ]
    assert cli.datamodule.image_size == 96


@pytest.mark.ddp
@pytest.mark.timeout(600)
def test_two_process_ddp_with_sync_batchnorm_reports_metrics_and_bad_files_once(tree, tmp_path: Path) -> None:
    root, special = tree
    args = [
        "fit",
        *small_run(root, tmp_path),
        "--trainer.max_epochs=1",
        "--trainer.devices=2",
        "--trainer.strategy=ddp_spawn",
        "--data.num_workers=1",
    ]
    result = run_cli(args, cwd=tmp_path, timeout=580)
    assert result.returncode == 0, result.stderr[-3000:]
    # Each rank reads its own shard, so each rank met at most one of the bad files; rank 0 reports both.
    assert result.stderr.count("skipped 1 unreadable train image") == 1, result.stderr[-3000:]
    assert result.stderr.count("skipped 1 unreadable val image") == 1
    assert str(special["truncated"]) in result.stderr and str(special["corrupt"]) in result.stderr
    assert "sync_batchnorm: true" in next(tmp_path.rglob("config.yaml")).read_text()  # from the recipe
    scalars = read_scalars(run_dirs(tmp_path)[0])
    assert scalars["train/skipped_images"] == [1.0] and scalars["val/skipped_images"][-1] == 1.0
    assert 0.0 <= scalars["val/acc"][-1] <= 1.0


def test_a_checkpoint_of_another_model_class_than_the_explicit_one_is_one_line(
    tmp_path: Path, capsys
) -> None:
    from lit_ddp.cli import main

    shapes = ["--data.train_size=64", "--data.val_size=32", "--data.batch_size=32"]
    build_cli(
        [
            "fit",
            *shapes,
            "--trainer.max_steps=1",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={tmp_path}",
        ]
    )
    ckpt = next(tmp_path.rglob("last.ckpt"))
    with pytest.raises(SystemExit) as stop:  # a ResNet cannot load LeNet's weights
        main(
            [
                "validate",
                *shapes,
                f"--trainer.default_root_dir={tmp_path / 'eval'}",
                f"--ckpt_path={ckpt}",
                "--model=ArchClassifier",
            ]
        )
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and err == [
        f"lit_ddp: error: --model=ArchClassifier, but {ckpt} holds a LeNetCIFAR: leave --model out (the"
        " checkpoint decides the model) or pass an ArchClassifier checkpoint"
    ]
    assert not (tmp_path / "eval").exists()


def test_a_mid_epoch_resume_over_other_training_files_is_refused_in_one_line(tmp_path: Path) -> None:
    """The checkpoint counts the samples of its (seed, epoch) order taken; that order is a permutation of
    the training files. Files added, removed or moved to another class since would make the same count skip
    other samples (some trained twice, others never): refused. The same files resume; an epoch-end
    checkpoint starts the next epoch over any files."""
    root = tmp_path / "tree"
    make_tree(root, train_per_class=4, val_per_class=1)
    cache = str(tmp_path / "index")

    def stopped_state() -> dict:
        dm = ImageNetDataModule(
            data_dir=str(root), image_size=16, val_resize=16, batch_size=4, index_cache=cache
        )
        dm.setup("fit")
        dm._epoch, dm._samples, dm._batches = 1, 8, 2  # 2 batches of epoch 1 trained
        return dm.state_dict()

    def resumed(state: dict) -> ImageNetDataModule:
        dm = ImageNetDataModule(
            data_dir=str(root), image_size=16, val_resize=16, batch_size=4, index_cache=cache
        )
        dm.setup("fit")
        dm.load_state_dict(state)
        return dm

    state = stopped_state()
    assert resumed(state).resume_point == (1, 8)
    added = root / "train" / CLASSES[1] / "new.JPEG"
    shutil.copy(root / "train" / CLASSES[0] / f"{CLASSES[0]}_0.JPEG", added)
    with pytest.raises(UserError, match="cannot resume mid-epoch exactly") as err:
        resumed(state)
    assert "\n" not in str(err.value) and "or from an epoch-end checkpoint" in str(err.value)
    assert resumed({**state, "epoch_complete": True}).resume_point == (2, 0)

    state = stopped_state()
    added.rename(root / "train" / CLASSES[2] / "new.JPEG")  # as many files, one of them in another class
    with pytest.raises(UserError, match="cannot resume mid-epoch exactly"):
        resumed(state)
