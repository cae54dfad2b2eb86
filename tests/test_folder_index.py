"""The ImageFolder file list: numpy-held, cached per tree state, made once per node (folder_index.py)."""

import functools
import json
import os
import shutil
import time
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from conftest import WITH_PROBES, cli_env, run_python
from imagenet_tree import CLASSES, make_tree
from PIL import Image

from lit_ddp.data import ImageNetDataModule
from lit_ddp.data import folder_index as fi
from lit_ddp.data.image_folder import ImageFileDataset, list_image_files
from lit_ddp.data.jpeg import load_eval_crop
from lit_ddp.errors import UserError

NFC = unicodedata.normalize("NFC", "café")
NFD = unicodedata.normalize("NFD", "café")


def touch_files(folder: Path, names: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"")


def settle() -> None:
    """Past the file system's timestamp tick (ext4: a few ms), so the next change moves the timestamps."""
    time.sleep(0.05)


def test_the_numpy_index_round_trips_paths_including_non_ascii_and_undecodable_names(tmp_path: Path) -> None:
    names = ["plain.JPEG", "espace et é.jpg", "日本語.png", f"{NFD}.jpeg", f"{NFC}.jpeg", "emoji 🐈.webp"]
    if os.name == "posix":  # a name that is not UTF-8 (Latin-1 'é'), which Linux allows
        names.append(os.fsdecode(b"latin1-\xe9.jpg"))
    touch_files(tmp_path / "split" / NFD, names)
    touch_files(tmp_path / "split" / "b", ["x.JPG", "notes.txt", ".hidden.jpg"])
    listing, _ = fi.load_or_scan(tmp_path / "split", cache_dir=tmp_path / "cache")
    cached, _ = fi.load_or_scan(tmp_path / "split", cache_dir=tmp_path / "cache", trusted_since=0.0)
    assert (listing.source, cached.source) == ("listed", "cache")
    assert listing.folders == cached.folders == ["b", NFD]  # sorted by code point, as on disk
    expected = [(str(tmp_path / "split" / "b" / "x.JPG"), 7)]
    expected += sorted((str(tmp_path / "split" / NFD / n), 3) for n in names)
    for index in (listing.samples([7, 3]), cached.samples([7, 3])):
        assert list(index) == expected and index[-1] == expected[-1]
        assert all(os.path.exists(path) for path, _ in index)
        assert isinstance(index.labels, np.ndarray) and isinstance(index.blob, np.ndarray)
    assert list(fi.SampleIndex.from_pairs(expected)) == expected


def test_a_dataset_keeps_its_samples_in_numpy_whatever_it_is_given() -> None:
    dataset = ImageFileDataset([("/a/é.jpg", 3), ("/b/c.png", 1)], load=lambda p: None, size=8)
    assert isinstance(dataset.samples, fi.SampleIndex) and dataset.samples.labels.dtype == np.int64
    assert list(dataset.samples) == [("/a/é.jpg", 3), ("/b/c.png", 1)]


@pytest.mark.parametrize(
    "change", ["file added", "file removed", "file renamed", "class added", "class removed"]
)
def test_a_changed_tree_is_listed_again_not_served_from_the_cache(
    tmp_path: Path, monkeypatch, change: str
) -> None:
    monkeypatch.setattr(fi, "SETTLE_NS", 0)  # trust listings at once; the default 2 s is tested below
    split, cache = tmp_path / "split", tmp_path / "cache"
    for name in ("a", "b"):
        touch_files(split / name, ["1.jpg", "2.jpg"])
    settle()
    first, _ = fi.load_or_scan(split, cache)
    again, _ = fi.load_or_scan(split, cache)
    assert (first.source, again.source) == ("listed", "cache")
    settle()
    if change == "file added":
        (split / "a" / "3.jpg").write_bytes(b"")
    elif change == "file removed":
        (split / "b" / "2.jpg").unlink()
    elif change == "file renamed":
        (split / "a" / "1.jpg").rename(split / "a" / "0.jpg")
    elif change == "class added":
        touch_files(split / "c", ["1.jpg"])
    else:
        shutil.rmtree(split / "b")
    after, _ = fi.load_or_scan(split, cache)
    on_disk = sorted(str(p) for p in split.glob("*/*.jpg"))
    assert after.source == "listed"
    assert [p for p, _ in after.samples(range(len(after.folders)))] == on_disk
    assert fi.load_or_scan(split, cache)[0].source == "cache"  # and that listing is kept


def test_images_in_sub_folders_of_a_class_belong_to_it_and_their_changes_are_seen(
    tmp_path: Path, monkeypatch
) -> None:
    """torchvision's ImageFolder (and predict_dir) take a class's images from its sub-folders too: they were
    left out without a word, so a train/cat/2020/*.jpg tree trained and validated on a fraction of itself.
    A change inside a sub-folder moves only that folder's timestamps: it must list the split again."""
    monkeypatch.setattr(fi, "SETTLE_NS", 0)
    split, cache = tmp_path / "split", tmp_path / "cache"
    touch_files(split / "cat", ["1.jpg"])
    touch_files(split / "cat" / "2020", ["2.jpg", "notes.txt"])
    touch_files(split / "cat" / "2020" / "deep", ["3.png"])
    touch_files(split / "cat" / "__MACOSX", ["4.jpg"])
    touch_files(split / "cat" / ".thumbs", ["5.jpg"])
    touch_files(split / "dog" / "only here", ["6.jpg"])
    os.symlink(split / "cat", split / "cat" / "2020" / "loop")  # a link back up is followed once, not forever
    settle()
    first, _ = fi.load_or_scan(split, cache)
    expected = [
        ("cat/1.jpg", 0),
        ("cat/2020/2.jpg", 0),
        ("cat/2020/deep/3.png", 0),
        ("dog/only here/6.jpg", 1),
    ]
    assert [(os.path.relpath(p, split), y) for p, y in first.samples([0, 1])] == expected
    assert fi.load_or_scan(split, cache)[0].source == "cache"
    settle()
    (split / "cat" / "2020" / "deep" / "7.jpg").write_bytes(b"")
    after, _ = fi.load_or_scan(split, cache)
    assert after.source == "listed" and len(after) == len(expected) + 1


def test_a_link_to_an_image_that_is_gone_is_listed_and_reported_unreadable(tmp_path: Path) -> None:
    """A dangling link was left out of a fresh listing without a word, but reported as unreadable when it
    broke after the listing was cached: now it is listed either way, and its read names it."""
    split = tmp_path / "split"
    touch_files(split / "a", ["1.jpg"])
    touch_files(split / "b", ["1.jpg"])
    os.symlink(tmp_path / "moved_away.jpg", split / "a" / "2.jpg")
    listing, _ = fi.load_or_scan(split, cache_dir=None)
    assert [os.path.relpath(p, split) for p, _ in listing.samples([0, 1])] == [
        "a/1.jpg",
        "a/2.jpg",
        "b/1.jpg",
    ]
    dataset = ImageFileDataset(
        listing.samples([0, 1]), functools.partial(load_eval_crop, size=8, resize=8), 8
    )
    bad = dataset.__getitems__([1]).unreadable
    assert bad[0][0] == str(split / "a" / "2.jpg") and bad[0][1].startswith("FileNotFoundError")


def test_a_folder_replaced_by_one_of_the_same_name_is_listed_again(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(fi, "SETTLE_NS", 0)
    split, cache = tmp_path / "split", tmp_path / "cache"
    touch_files(split / "a", ["1.jpg"])
    touch_files(split / "b", ["1.jpg"])
    settle()
    fi.load_or_scan(split, cache)
    settle()
    touch_files(tmp_path / "new_a", ["9.jpg"])
    os.rename(split / "a", tmp_path / "old_a")
    os.rename(tmp_path / "new_a", split / "a")  # e.g. rsync --delay-updates, or a restore
    after, _ = fi.load_or_scan(split, cache)
    assert after.source == "listed" and [p for p, _ in after.samples([0, 1])][0].endswith("a/9.jpg")


def test_a_listing_made_just_after_a_change_is_shared_by_its_run_but_not_trusted_by_the_next(
    tmp_path: Path,
) -> None:
    split, cache = tmp_path / "split", tmp_path / "cache"
    touch_files(split / "a", ["1.jpg"])  # just now: within SETTLE_NS of the listing
    run_started = time.time()
    first, _ = fi.load_or_scan(split, cache)  # local rank 0's prepare_data
    other_rank, _ = fi.load_or_scan(split, cache, trusted_since=run_started)
    later_run, _ = fi.load_or_scan(split, cache, trusted_since=time.time())
    assert (first.source, other_rank.source, later_run.source) == ("listed", "cache", "listed")


def test_an_unwritable_cache_is_named_and_the_folder_still_listed(tmp_path: Path) -> None:
    touch_files(tmp_path / "split" / "a", ["1.jpg"])
    (tmp_path / "file").write_text("")
    listing, why = fi.load_or_scan(tmp_path / "split", cache_dir=tmp_path / "file" / "cache")
    assert len(listing) == 1 and listing.source == "listed" and why and "NotADirectoryError" in why


def test_cache_files_of_folders_that_are_gone_are_deleted(tmp_path: Path) -> None:
    for name in ("old", "new"):
        touch_files(tmp_path / name / "a", ["1.jpg"])
    fi.load_or_scan(tmp_path / "old", tmp_path / "cache")
    shutil.rmtree(tmp_path / "old")
    fi.load_or_scan(tmp_path / "new", tmp_path / "cache")
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [
        fi.cache_file(Path(), str(tmp_path / "new")).name
    ]


# ---- the data module ------------------------------------------------------------------------------------


def test_a_class_folder_in_nfd_is_the_class_of_the_same_name_in_nfc(tmp_path: Path) -> None:
    """macOS writes names in NFD; a val/ folder copied from a Mac matches train/'s NFC name."""
    for split, name in (("train", NFC), ("val", NFD)):
        for cls in (name, "other"):
            folder = tmp_path / split / cls
            folder.mkdir(parents=True)
            Image.new("RGB", (40, 30), (200, 10, 10)).save(folder / "x.jpg")
    dm = ImageNetDataModule(
        data_dir=str(tmp_path), image_size=16, val_resize=16, index_cache=str(tmp_path / "c")
    )
    dm.setup("fit")
    assert dm.class_names == (NFC, "other")
    assert [(Path(p).parent.name, y) for p, y in dm.val_set.samples] == [(NFD, 0), ("other", 1)]
    assert dm.val_set[0][0].shape == (3, 16, 16)  # the path is the one on disk: it opens


def test_two_train_folders_that_differ_only_in_unicode_form_are_one_line_error(tmp_path: Path) -> None:
    for cls in (NFC, NFD, "other"):
        (tmp_path / "train" / cls).mkdir(parents=True)
    (tmp_path / "val").mkdir()
    with pytest.raises(UserError, match=r"differ only in their Unicode form .*: merge each pair") as err:
        ImageNetDataModule(data_dir=str(tmp_path))
    assert "\n" not in str(err.value)


def test_gif_files_are_predicted_from_their_first_frame(tmp_path: Path) -> None:
    frames = [Image.new("RGB", (48, 40), colour) for colour in ((250, 0, 0), (0, 0, 250))]
    frames[0].save(tmp_path / "anim.gif", save_all=True, append_images=frames[1:])
    (tmp_path / "notes.txt").write_text("not an image")
    assert list_image_files(tmp_path) == [str(tmp_path / "anim.gif")]
    crop = load_eval_crop(str(tmp_path / "anim.gif"), 16, 16)
    assert crop.shape == (16, 16, 3) and crop[..., 0].mean() > 200 and crop[..., 2].mean() < 50


def test_a_predict_dir_names_the_files_it_leaves_out_for_their_extension(tmp_path: Path, caplog) -> None:
    """A folder of a phone's .heic photos was refused as holding "no image files", and those beside .jpg
    files got no row without a word: both name the files left out and the extensions read."""
    make_tree(tmp_path / "tree")
    photos = tmp_path / "photos"
    touch_files(photos / "2024", ["IMG_1.HEIC", "IMG_2.heic", ".DS_Store"])
    expected = (
        "; 2 other file(s) left out: .heic 2 (2024/IMG_1.HEIC). Only .jpg, .jpeg, .png, .ppm, .bmp, .pgm,"
        " .tif, .tiff, .webp, .gif files are read as images: convert any image among them to .jpg or .png"
    )
    with pytest.raises(UserError) as err:
        ImageNetDataModule(data_dir=str(tmp_path / "tree"), predict_dir=str(photos))
    assert str(err.value).endswith(f"are left out){expected}")
    Image.new("RGB", (8, 8)).save(photos / "a.jpg")
    with caplog.at_level("INFO"):
        dm = ImageNetDataModule(data_dir=str(tmp_path / "tree"), predict_dir=str(photos))
    assert dm.predict_files == [str(photos / "a.jpg")]
    assert f"predict_dir={photos}: 1 image files{expected}" in caplog.messages


def validate_on_two_ranks(tree: Path, cache: Path, out: Path) -> list[dict]:
    """What each of 2 ddp_spawn ranks listed (helpers/folder_index_ranks.py), run in a process forked with
    its ranks (conftest.run_python): none of them imports torch anew."""
    argv = ["-m", "folder_index_ranks", str(tree), str(cache), str(out)]
    run = run_python(argv, env=cli_env(WITH_PROBES), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_second_rank_on_the_same_node_does_not_list_the_tree(tmp_path: Path) -> None:
    make_tree(tmp_path / "tree", train_per_class=2, val_per_class=3)
    time.sleep(fi.SETTLE_NS / 1e9)  # a tree made long before the run
    rank0, rank1 = validate_on_two_ranks(tmp_path / "tree", tmp_path / "cache", tmp_path / "run1")
    assert rank0["scans"] == {"val": 1} and rank1["scans"] == {}  # one listing, in rank 0's prepare_data
    assert rank0["files"] == rank1["files"] and len(rank1["files"]) == 3 * 3 + 2

    # The tree changes: rank 0 lists it again and rank 1 takes that listing, though it was made within
    # SETTLE_NS of the change (its own check of the tree could not trust it): both see the new file.
    shutil.copy(
        tmp_path / "tree" / "val" / CLASSES[0] / f"{CLASSES[0]}_0.JPEG",
        tmp_path / "tree" / "val" / CLASSES[0] / "new.JPEG",
    )
    rank0, rank1 = validate_on_two_ranks(tmp_path / "tree", tmp_path / "cache", tmp_path / "run2")
    assert rank0["scans"] == {"val": 1} and rank1["scans"] == {}
    assert rank0["files"] == rank1["files"] and len(rank1["files"]) == 3 * 3 + 3
