"""`python -m lit_ddp predict`: predictions.csv, one row per image, the same rows on 1 and on 2 processes."""

import csv
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from conftest import run_cli
from PIL import Image

from lit_ddp.callbacks.predictions import PredictionWriter
from lit_ddp.cli import build_cli, main
from lit_ddp.data import ShapesDataModule
from lit_ddp.data.shapes import CLASS_NAMES

# 63 test images: two processes get 32 and 31, so a padding sampler would repeat one.
DATA = ["--data.train_size=64", "--data.val_size=16", "--data.test_size=63", "--data.batch_size=16"]
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    """A checkpoint one 4-step epoch away from the seeded start: enough to make predictions differ."""
    root = tmp_path_factory.mktemp("fit")
    args = ["--trainer.max_epochs=1", "--trainer.limit_val_batches=1", f"--trainer.default_root_dir={root}"]
    build_cli(["fit", *DATA, *QUIET, *args])
    return next(root.rglob("last.ckpt"))


def predict(ckpt: Path, root: Path, *args: str) -> list[dict[str, str]]:
    build_cli(["predict", *DATA, *QUIET, f"--ckpt_path={ckpt}", f"--trainer.default_root_dir={root}", *args])
    return read_rows(root)


def read_rows(root: Path) -> list[dict[str, str]]:
    (path,) = root.rglob("predictions.csv")
    assert not list(path.parent.glob(".*.tmp"))  # the temporary file was renamed, not left behind
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def top_k(row: dict[str, str]) -> list[tuple[str, float]]:
    pairs = [entry.rsplit(" ", 1) for entry in row["top5"].split("; ")]
    return [(name, float(p)) for name, p in pairs]


def test_predict_writes_one_row_per_test_image(ckpt: Path, tmp_path: Path, capsys) -> None:
    rows = predict(ckpt, tmp_path)
    out = capsys.readouterr().out
    assert list(rows[0]) == ["index", "prediction", "probability", "top5", "label"]  # no files: no path
    assert [int(r["index"]) for r in rows] == list(range(63))
    data = ShapesDataModule(train_size=64, val_size=16, test_size=63)  # DATA's seeded test split
    data.setup("test")
    assert [r["label"] for r in rows] == [CLASS_NAMES[y] for y in data.test_set.labels]
    for row in rows:
        top = top_k(row)
        probs = [p for _, p in top]
        assert len(top) == 5 and len({name for name, _ in top}) == 5
        assert (row["prediction"], float(row["probability"])) == top[0]
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.0 + 5e-4
    csv_path = next(tmp_path.rglob("predictions.csv"))
    assert (csv_path.parent / "config.yaml").is_file()  # the run directory, beside the run's config
    assert out.count("predictions: 63 rows (test split) → ") == 1 and str(csv_path) in out


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_two_processes_write_the_same_rows_in_the_same_order(ckpt: Path, tmp_path: Path) -> None:
    one = predict(ckpt, tmp_path / "one")
    ddp = ["--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp_spawn"]
    result = run_cli(["predict", *DATA, *QUIET, f"--ckpt_path={ckpt}", *ddp], cwd=tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    two = read_rows(tmp_path / "logs")
    assert [r["index"] for r in two] == [r["index"] for r in one]  # 63 rows, once each, in order
    for a, b in zip(one, two, strict=True):
        assert (a["prediction"], a["label"]) == (b["prediction"], b["label"])
        # Other batch compositions may change the last digit of a float32 sum, not more.
        assert float(a["probability"]) == pytest.approx(float(b["probability"]), abs=2e-4)
    assert result.stdout.count("predictions: 63 rows (test split)") == 1  # rank 0 alone reports


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_a_fractional_predict_limit_runs_on_uneven_shards(ckpt: Path, tmp_path: Path) -> None:
    """`--trainer.limit_predict_batches=0.5` on 2 processes over 33 images in batches of 16 (shards of 17
    and 16: 2 batches and 1) raised on rank 1 (0.5 × 1 is no batch) and left rank 0 "lost contact with
    another rank". The fraction is taken of the largest shard, as for validation and test: 1 batch each."""
    ddp = ["--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp_spawn"]
    data = [*(a for a in DATA if not a.startswith("--data.test_size")), "--data.test_size=33"]
    args = ["predict", *data, *QUIET, f"--ckpt_path={ckpt}", *ddp, "--trainer.limit_predict_batches=0.5"]
    result = run_cli(args, cwd=tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_rows(tmp_path / "logs")
    assert [int(r["index"]) for r in rows] == list(range(32))  # rank 0: 0, 2, .., 30; rank 1: 1, 3, .., 31
    assert "limit_predict_batches=0.5: 1 batch(es) per device, the same on every rank" in result.stderr
    assert "1 image(s) not predicted" in result.stdout and "unreadable" not in result.stdout


def write_images(root: Path) -> list[Path]:
    """Images of several sizes and formats, nested; returns those predict must read, in their order."""
    rng = np.random.default_rng(0)
    image = lambda w, h: Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))  # noqa: E731
    wanted = [root / "b.png", root / "a" / "z.JPG", root / "a" / "c.jpeg", root / "a" / "deep" / "d.png"]
    junk = [root / ".hidden.png", root / "__MACOSX" / "e.png", root / ".cache" / "f.png"]
    for i, path in enumerate(wanted + junk):
        path.parent.mkdir(parents=True, exist_ok=True)
        image(40 + 10 * i, 30 + 7 * i).save(path, format="PNG" if path.suffix == ".png" else "JPEG")
    (root / "notes.txt").write_text("not an image")
    (root / "broken.jpg").write_bytes(b"\xff\xd8\xff not really a JPEG")  # listed, unreadable: left out
    return sorted(wanted, key=str)


def test_predict_dir_reads_every_image_under_it_unlabelled(ckpt: Path, tmp_path: Path, capsys) -> None:
    images = tmp_path / "images"
    wanted = write_images(images)
    rows = predict(ckpt, tmp_path / "run", f"--data.predict_dir={images}")
    out = capsys.readouterr().out
    assert list(rows[0]) == ["index", "path", "prediction", "probability", "top5", "label"]
    listed = sorted([*map(str, wanted), str(images / "broken.jpg")])  # indices count the broken file too
    assert [r["path"] for r in rows] == list(map(str, wanted))
    assert [int(r["index"]) for r in rows] == [listed.index(str(p)) for p in wanted]
    assert all(r["label"] == "" and r["prediction"] in CLASS_NAMES for r in rows)
    assert f"predictions: 4 rows ({images})" in out
    assert f"1 unreadable image(s) left out: {images / 'broken.jpg'}" in out


def test_without_the_predictions_writer_the_unreadable_files_left_out_are_still_named(
    ckpt: Path, tmp_path: Path, capsys
) -> None:
    """With --predictions=null the report line that names the unreadable files left out (the writer's) is
    not printed: the files were skipped without a word. The skipped-images report names them then."""
    images = tmp_path / "images"
    write_images(images)
    with pytest.warns(UserWarning, match="skipped 1 unreadable predict image file") as warned:
        build_cli(
            ["predict", *DATA, *QUIET, f"--ckpt_path={ckpt}", f"--trainer.default_root_dir={tmp_path}"]
            + [f"--data.predict_dir={images}", "--predictions=null"]
        )
    assert any(str(images / "broken.jpg") in str(w.message) for w in warned)


def test_images_a_predict_limit_left_unread_are_not_called_unreadable(
    ckpt: Path, tmp_path: Path, capsys
) -> None:
    """`--trainer.limit_predict_batches=2` left the last images unread, and the report named them as
    "unreadable image(s) left out": a user would go looking for broken files that are not."""
    images = tmp_path / "images"
    images.mkdir()
    for name in ("a.png", "b.png", "c.png", "d.png"):
        Image.new("RGB", (40, 30), (len(name) * 40, 90, 10)).save(images / name)
    (images / "aa.jpg").write_bytes(b"\xff\xd8\xff not really a JPEG")  # read in the 1st batch, left out
    data = [a for a in DATA if not a.startswith("--data.batch_size")]
    build_cli(
        ["predict", *data, *QUIET, f"--ckpt_path={ckpt}", f"--trainer.default_root_dir={tmp_path / 'run'}",
         f"--data.predict_dir={images}", "--data.batch_size=2", "--trainer.limit_predict_batches=2"]
    )  # fmt: skip
    out = capsys.readouterr().out
    rows = read_rows(tmp_path / "run")
    assert [Path(r["path"]).name for r in rows] == ["a.png", "b.png", "c.png"]  # batches a, aa.jpg / b, c
    assert "predictions: 3 rows" in out
    assert "1 image(s) not predicted: --trainer.limit_predict_batches=2" in out
    assert f"1 unreadable image(s) left out: {images / 'aa.jpg'}" in out and "d.png" not in out


@pytest.mark.parametrize("writer", [[], ["--predictions=null"]], ids=["writer", "no writer"])
def test_a_predict_dir_of_unreadable_files_only_is_one_line(tmp_path: Path, capsys, writer: list) -> None:
    """Every file of predict_dir unreadable (text under .jpg names): predict wrote a predictions.csv of no
    row and exited 0, where train, val and test refuse such a split. It stops as they do, in one line naming
    a file and why it could not be read, and leaves no run folder (an empty predictions.csv would read as "no
    image to label"). Without the predictions writer it exited 0, having labelled nothing: the refusal is
    about the input, not about the file written."""
    folder = tmp_path / "images"
    folder.mkdir()
    for name in ("a.jpg", "b.jpg", "c.jpg"):
        (folder / name).write_text("not an image")
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "predict",
                *DATA,
                *QUIET,
                f"--data.predict_dir={folder}",
                "--ckpt_path=untrained",
                f"--trainer.default_root_dir={tmp_path / 'run'}",
                *writer,
            ]
        )
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("lit_ddp: error: every one of the 3 image files read under ")
    assert f"--data.predict_dir={folder}" in err and f"(such as {folder / 'a.jpg'}: " in err
    assert "replace them with readable images" in err
    assert not list((tmp_path / "run").rglob("predictions.csv"))
    assert not list((tmp_path / "run").rglob("version_*"))


def earlier_run(ckpt: Path, tmp_path: Path) -> Path:
    """A copy of ``ckpt``'s run as ``logs/lightning_logs/version_0``, with the metrics.csv a CSV logger
    writes there."""
    run = tmp_path / "logs" / "lightning_logs" / "version_0"
    shutil.copytree(ckpt.parent.parent, run)
    (run / "metrics.csv").write_text("epoch,step,val/acc\n0,3,0.25\n")
    return run


@pytest.mark.parametrize("logger", ["TensorBoardLogger", "CSVLogger"])
def test_a_refused_predict_into_a_pinned_version_leaves_that_run_as_it_was(
    ckpt: Path, tmp_path: Path, capsys, logger: str
) -> None:
    """predict into an earlier run's folder (``--trainer.logger.init_args.version=0``), refused once its
    files were read: it left a new event file there and the run's config.yaml replaced by its own (a CSV
    logger's hparams.yaml too), and a CSV logger's writer deleted the run's metrics.csv as it opened the
    folder. The run's folder is as it was, file for file."""
    run = earlier_run(ckpt, tmp_path)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "a.jpg").write_text("not an image")
    pinned = [f"--trainer.logger={logger}", f"--trainer.logger.save_dir={tmp_path / 'logs'}"]
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "predict",
                *DATA,
                *QUIET,
                f"--data.predict_dir={folder}",
                f"--ckpt_path={run / 'checkpoints' / ckpt.name}",
                *pinned,
                "--trainer.logger.version=0",
            ]
        )
    assert exit_info.value.code == 2, capsys.readouterr().err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    assert [p.name for p in run.parent.iterdir()] == ["version_0"]


@pytest.mark.parametrize("logger", ["TensorBoardLogger", "CSVLogger"])
def test_a_predict_into_a_pinned_version_keeps_that_runs_files_and_config(
    ckpt: Path, tmp_path: Path, logger: str
) -> None:
    """predict into an earlier run's folder (``--trainer.logger.version=0``): a CSV logger's writer deleted
    the run's metrics.csv as it opened the folder, and the run's config.yaml was replaced by the predict's.
    The run's files stay as they were; the predict's settings go beside its predictions, in
    predict_config.yaml."""
    run = earlier_run(ckpt, tmp_path)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    images = tmp_path / "images"
    write_images(images)
    pinned = [f"--trainer.logger={logger}", f"--trainer.logger.save_dir={tmp_path / 'logs'}"]
    build_cli(
        ["predict", *DATA, *QUIET, f"--data.predict_dir={images}", f"--ckpt_path={ckpt}", *pinned]
        + ["--trainer.logger.version=0"]
    )
    assert {p: p.read_bytes() for p in before if p.is_file()} == before
    assert (run / "predictions.csv").is_file()
    saved = yaml.safe_load((run / "predict_config.yaml").read_text())
    assert saved["data"]["init_args"]["predict_dir"] == str(images)
    assert [p.name for p in run.parent.iterdir()] == ["version_0"]


@pytest.mark.parametrize("make", ["missing", "empty", "junk only"])
def test_a_predict_dir_without_images_is_one_line(tmp_path: Path, capsys, make: str) -> None:
    folder = tmp_path / "images"
    if make != "missing":
        (folder / "__MACOSX").mkdir(parents=True)
    if make == "junk only":
        Image.new("RGB", (8, 8)).save(folder / ".hidden.png")
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "predict",
                *DATA,
                f"--data.predict_dir={folder}",
                "--ckpt_path=untrained",
                f"--trainer.default_root_dir={tmp_path}",
            ]
        )
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("lit_ddp: error: ") and str(folder) in err
    assert not (tmp_path / "lightning_logs").exists()


def test_the_top_k_column_is_named_by_the_k_asked_for(tmp_path: Path) -> None:
    """README's columns are fixed: a 3-class model's file also has ``top5``, holding its 3 classes (the
    header was ``top3`` there, and a script reading ``top5`` failed)."""
    rows = {
        "index": torch.tensor([0, 1]),
        "probs": torch.tensor([[0.7, 0.2, 0.1], [0.5, 0.3, 0.2]]),
        "classes": torch.tensor([[2, 0, 1], [1, 2, 0]]),
        "target": torch.tensor([2, -1]),
    }
    dm = SimpleNamespace(class_names=("cat", "dog", "fox"), predict_set=None)
    for top_k, column in ((5, "top5"), (3, "top3"), (2, "top2")):
        path = tmp_path / f"top{top_k}.csv"
        k = min(top_k, 3)
        PredictionWriter(top_k=top_k)._write(
            path, {**rows, "probs": rows["probs"][:, :k], "classes": rows["classes"][:, :k]}, dm
        )
        with open(path, newline="") as f:
            written = list(csv.DictReader(f))
        assert list(written[0]) == ["index", "prediction", "probability", column, "label"]
        assert written[0][column].split("; ")[:2] == ["fox 0.7000", "cat 0.2000"][:k]
        assert [r["label"] for r in written] == ["fox", ""]


def test_predictions_stay_in_the_run_directory_and_never_replace_a_file(
    ckpt: Path, tmp_path: Path, capsys
) -> None:
    """`--predictions.filename=../../../../escape.csv` was written outside the run directory, and
    `predictions: {filename: /path/important.txt}` replaced that file's content with the CSV."""
    root = tmp_path / "runs"
    args = ["predict", *DATA, *QUIET, f"--ckpt_path={ckpt}", f"--trainer.default_root_dir={root}"]
    escape = "../../../../escape.csv"
    with pytest.raises(SystemExit):
        main([*args, f"--predictions.filename={escape}"])
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"lit_ddp: error: --predictions.filename={escape} leads out of the run directory")
    assert len(err.splitlines()) == 1 and not list(tmp_path.rglob("escape.csv"))
    important = tmp_path / "important.txt"
    important.write_text("mine\n")
    with pytest.raises(SystemExit):
        main([*args, f"--predictions.filename={important}"])
    err = capsys.readouterr().err.strip()
    assert err == (
        f"lit_ddp: error: --predictions.filename={important}: {important} exists and this run did not write"
        " it: choose another name, or move that file away first"
    )
    assert important.read_text() == "mine\n"
    # An absolute path to a new file is written where it says, on purpose; a subfolder of the run is fine.
    build_cli([*args, f"--predictions.filename={tmp_path / 'out.csv'}"])
    assert len((tmp_path / "out.csv").read_text().splitlines()) == 64
    build_cli([*args, "--predictions.filename=sub/p.csv"])
    assert len(list(root.rglob("sub/p.csv"))) == 1


def test_a_predictions_file_that_cannot_be_written_is_refused_before_any_image_is_scored(
    ckpt: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    """`--predictions.filename=/elsewhere/p.csv` in a folder that could not be written scored every image,
    then failed at the last step, naming --trainer.default_root_dir, which does not move an absolute path:
    it is refused at the start, naming the option that does."""
    scored = []
    batch_end = PredictionWriter.on_predict_batch_end
    monkeypatch.setattr(
        PredictionWriter, "on_predict_batch_end", lambda *a, **k: scored.append(1) or batch_end(*a, **k)
    )
    (tmp_path / "a_file").write_text("mine\n")
    target = tmp_path / "a_file" / "p.csv"  # its folder's place taken by a file: no privileges needed
    args = ["predict", *DATA, *QUIET, f"--ckpt_path={ckpt}", f"--trainer.default_root_dir={tmp_path / 'run'}"]
    with pytest.raises(SystemExit) as exit_info:
        main([*args, f"--predictions.filename={target}"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"lit_ddp: error: could not write predictions {target} (Not a directory): "), err
    assert err.endswith(
        "move away the file that stands in place of a folder on that path, or pass --predictions.filename in"
        " another folder, then run it again"
    )
    assert not scored and (tmp_path / "a_file").read_text() == "mine\n"
    assert not list((tmp_path / "run").rglob("version_*"))  # the failed run's folder is removed


def test_predictions_from_image_folder_shards_name_each_rows_file(tmp_path: Path, capsys) -> None:
    """Shards of an image folder keep each file's path: predictions.csv had rows of indices only, with no way
    to tell which image a row was."""
    from imagenet_tree import make_tree

    from lit_ddp.data.convert import convert

    special = make_tree(tmp_path / "tree")
    convert(str(tmp_path / "tree"), str(tmp_path / "shards"), shard_mb=0.05)
    data = [f"--data.url={tmp_path / 'shards'}", "--data.image_size=32", "--data.val_resize=36"]
    data += ["--data.batch_size=4", "--data.num_workers=0"]
    build_cli(
        ["predict", "--data=StreamingDataModule", *data, *QUIET, "--ckpt_path=untrained"]
        + [f"--trainer.default_root_dir={tmp_path / 'run'}"]
    )
    rows = read_rows(tmp_path / "run")
    corrupt = special["corrupt"].relative_to(tmp_path / "tree").as_posix()
    tree = tmp_path / "tree"
    files = sorted(p.relative_to(tree).as_posix() for p in (tree / "val").rglob("*"))
    assert list(rows[0]) == ["index", "path", "prediction", "probability", "top5", "label"]
    assert sorted(r["path"] for r in rows) == [f for f in files if f.endswith(".JPEG") and f != corrupt]
    assert all(r["path"].split("/")[1] == r["label"] for r in rows)  # the label is the file's class folder
    assert f"1 unreadable image(s) left out: {corrupt}" in capsys.readouterr().out
