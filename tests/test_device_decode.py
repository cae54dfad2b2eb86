"""``--data.decode=gpu`` (data/decoders.py, data/device_decode.py): the workers read bytes and draw the
crops, the device decodes. On a CPU device the decoder is the CPU path's own (libjpeg-turbo), so these tests
hold the device path to the CPU path's exact pixels; on a GPU nvJPEG's IDCT and chroma upsampling differ by
a few gray levels (docs/gpu.md)."""

import threading
import time
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, read_scalars, run_cli, run_dirs
from imagenet_tree import CLASSES, draw, make_tree
from lightning.fabric.utilities.apply_func import move_data_to_device
from PIL import Image

from lit_ddp.data import ImageNetDataModule, RandomResizedCropFlip, device_decode, jpeg
from lit_ddp.data.batch import Batch
from lit_ddp.data.batch_transforms import SampleRandom
from lit_ddp.data.datasets import IndexedDataset
from lit_ddp.data.device_decode import EncodedBatch
from lit_ddp.data.samplers import stable_seed
from lit_ddp.errors import UserError

SIZE, RESIZE = 48, 56


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("imagenet")
    make_tree(root, train_per_class=6, val_per_class=3)
    # A photo stored turned a quarter (EXIF orientation 6): decoded in the worker, as on the CPU path.
    exif = Image.Exif()
    exif[jpeg.ORIENTATION] = 6
    draw(1, (120, 80), np.random.default_rng(1)).save(root / "train" / CLASSES[1] / "turned.JPEG", exif=exif)
    return root


def data_module(root: Path, gpu_decode: bool, draft: bool = False, **kwargs) -> ImageNetDataModule:
    dm = ImageNetDataModule(
        data_dir=str(root), image_size=SIZE, val_resize=RESIZE, batch_size=8, num_workers=0, draft=draft,
        decode="gpu" if gpu_decode else "cpu", index_cache=str(root / ".cache"), **kwargs,
    )  # fmt: skip
    dm.setup("fit")
    return dm


def seeded(indices: list[int], epoch: int = 3) -> list[tuple[int, int]]:
    """The training sampler's (index, seed) pairs: the seed a function of (seed 0, epoch, index) only."""
    return [(i, stable_seed(0, epoch, i)) for i in indices]


def both(root: Path, split: str, indices, draft: bool = False):
    """The CPU path's batch and the device path's (decoded on the CPU) for the same indices."""
    cpu, dev = data_module(root, False, draft), data_module(root, True)
    cpu_set, dev_set = (getattr(d, f"{split}_set") for d in (cpu, dev))
    cpu_batch, dev_batch = cpu_set.__getitems__(indices), dev_set.__getitems__(indices)
    assert isinstance(dev_batch.images, EncodedBatch)
    x_dev, device_bad = dev_batch.images.decode(torch.device("cpu"))
    return cpu_batch.images, cpu_batch.unreadable, x_dev, {**dev_batch.unreadable, **device_bad}


def test_training_crops_and_flips_are_the_cpu_paths_to_the_pixel(tree: Path) -> None:
    n = len(data_module(tree, False).train_set)
    x, bad, x_dev, bad_dev = both(tree, "train", seeded(list(range(n))))
    assert set(bad) == set(bad_dev) and [Path(p).name for p, _ in bad.values()] == ["truncated.JPEG"]
    good = [i for i in range(n) if i not in bad]
    assert x_dev.shape == x.shape and x_dev.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(x_dev[good], x[good])  # every box, flip and resize the same
    flipped = [i for i in good if not torch.equal(x[i], x[i].flip(-1))]
    assert flipped  # a test with only unflipped crops would not see a flip drawn differently


def test_the_boxes_drawn_are_the_cpu_paths(tree: Path, monkeypatch) -> None:
    drawn: list[tuple] = []

    def recording(*args, **kwargs):
        drawn.append(jpeg_box(*args, **kwargs))
        return drawn[-1]

    jpeg_box = jpeg.random_resized_crop_box
    monkeypatch.setattr(jpeg, "random_resized_crop_box", recording)
    monkeypatch.setattr(device_decode, "random_resized_crop_box", recording)
    indices = seeded([0, 5, 9, 13], epoch=7)
    data_module(tree, False, draft=True).train_set.__getitems__(indices)
    cpu, drawn[:] = list(drawn), []
    data_module(tree, True).train_set.__getitems__(indices)
    assert drawn == cpu and len(cpu) == 4


def test_each_samples_draws_are_its_own_whatever_batch_carries_it(tree: Path) -> None:
    train_set = data_module(tree, True).train_set
    alone, _ = train_set.__getitems__(seeded([4])).images.decode(torch.device("cpu"))
    among, _ = train_set.__getitems__(seeded([11, 2, 4, 7])).images.decode(torch.device("cpu"))
    assert torch.equal(alone[0], among[2])
    other_epoch, _ = train_set.__getitems__(seeded([4], epoch=4)).images.decode(torch.device("cpu"))
    assert not torch.equal(alone[0], other_epoch[0])


def test_evaluation_crops_are_the_cpu_paths_to_the_pixel(tree: Path) -> None:
    n = len(data_module(tree, False).val_set)
    x, bad, x_dev, bad_dev = both(tree, "val", list(range(n)))
    assert set(bad) == set(bad_dev) != set()  # the corrupt file, refused in the worker on both paths
    good = [i for i in range(n) if i not in bad]
    assert torch.equal(x_dev[good], x[good])


def test_against_the_default_dct_reduced_cpu_decode_within_a_bound(tree: Path) -> None:
    """The CPU path reduces large crops in the DCT domain (draft); the device always decodes in full. The
    tree's small images seldom draft, so the bound is checked on the crops that differ at all."""
    n = len(data_module(tree, False).train_set)
    x, bad, x_dev, _ = both(tree, "train", seeded(list(range(n))), draft=True)
    good = [i for i in range(n) if i not in bad]
    diff = (x[good].int() - x_dev[good].int()).abs()
    assert diff.float().mean() <= 2.0  # gray levels, over all pixels


def test_a_batch_with_unreadable_files_is_dropped_and_reported_like_the_cpu_paths(tree: Path) -> None:
    dm = data_module(tree, True)
    n = len(dm.train_set)
    batch = dm.train_set.__getitems__(seeded(list(range(n))))
    batch = dm.on_before_batch_transfer(batch, 0)  # as Lightning runs the hooks; no trainer: no augmentation
    x, y = dm.on_after_batch_transfer(batch, 0)
    assert x.dtype == torch.float32 and len(x) == len(y) == n - 1
    assert [Path(p).name for p in dm.unreadable.take_pending("predict")] == ["truncated.JPEG"]


def test_gpu_decode_with_worker_augmentations_is_one_clear_line(tree: Path) -> None:
    with pytest.raises(
        UserError, match="--data.decode=gpu cannot run --data.augmentation.auto_augment=trivial"
    ):
        data_module(tree, True, augmentation=RandomResizedCropFlip(auto_augment="trivialaugment"))


def test_gpu_decode_with_the_modern_recipe_names_each_augmentation_to_turn_off(tmp_path: Path) -> None:
    """The modern recipe sets auto_augment and random_erasing; the line said "drop those two", and a user who
    passed --data.augmentation.auto_augment=none got the same line again, for the recipe's random_erasing."""
    root = tmp_path / "data"
    make_tree(root)
    recipe = [f"--config={REPO / 'configs' / 'resnet50_imagenet_modern.yaml'}", f"--data.data_dir={root}"]
    option = "--data.augmentation."
    result = run_cli(["fit", *recipe, "--data.decode=gpu", f"{option}auto_augment=none"], cwd=tmp_path)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr[-3000:]
    assert result.stderr.strip() == (
        f"lit_ddp: error: --data.decode=gpu cannot run {option}random_erasing=0.1 (per-image augmentation"
        " in the loader workers, which then decode no image): pass --data.decode=cpu,"
        f" or {option}random_erasing=0"
    )
    result = run_cli(["fit", *recipe, "--data.decode=gpu"], cwd=tmp_path)
    assert f"cannot run {option}auto_augment=trivialaugment and {option}random_erasing=0.1 (" in result.stderr
    assert result.stderr.rstrip().endswith(f"or {option}auto_augment=none {option}random_erasing=0")


def test_the_older_gpu_decode_key_still_chooses_the_device_with_a_deprecation_line(tree: Path) -> None:
    args = dict(data_dir=str(tree), index_cache=str(tree / ".cache"))
    with pytest.warns(DeprecationWarning, match=r"gpu_decode=true is deprecated: use --data.decode=gpu"):
        assert ImageNetDataModule(**args, gpu_decode=True).decoder.on_device
    with pytest.warns(DeprecationWarning, match=r"gpu_decode=false is deprecated: use --data.decode=cpu"):
        assert not ImageNetDataModule(**args, decode="gpu", gpu_decode=False).decoder.on_device
    with pytest.raises(UserError, match=r"^--data.decode=nvjpeg is not one of: cpu, gpu$"):
        ImageNetDataModule(**args, decode="nvjpeg")


@pytest.mark.slow
def test_the_cli_fits_with_gpu_decode(tree: Path, tmp_path: Path) -> None:
    args = [f"--config={REPO / 'configs' / 'resnet_imagenet.yaml'}", f"--data.data_dir={tree}"]
    args += ["--model.arch=resnet18", f"--data.image_size={SIZE}", f"--data.val_resize={RESIZE}"]
    args += ["--data.batch_size=8", "--data.num_workers=1", "--data.decode=gpu"]
    args += ["--trainer.accelerator=cpu", "--trainer.precision=32-true", "--trainer.max_epochs=1"]
    args += ["--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}"]
    args += [f"--data.index_cache={tmp_path / 'cache'}"]
    result = run_cli(["fit", *args], tmp_path, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    (run,) = run_dirs(tmp_path)
    assert len(read_scalars(run)["val/acc"]) == 1
    assert "truncated.JPEG" in result.stderr + result.stdout  # the skipped-images report names it


def test_the_float_resize_that_cuda_runs_is_within_one_gray_level_of_the_uint8_one() -> None:
    x = torch.randint(0, 256, (2, 3, 97, 131), dtype=torch.uint8)
    x = x.contiguous(memory_format=torch.channels_last)
    fast = jpeg.resize_uint8(x, size=(48, 48))
    kwargs = dict(size=(48, 48), mode="bilinear", antialias=True, align_corners=False)
    through_float = torch.nn.functional.interpolate(x.float(), **kwargs).round().clamp(0, 255).to(torch.uint8)
    assert (fast.int() - through_float.int()).abs().max() <= 1


@pytest.mark.parametrize("split", ["train", "val"])
def test_the_batch_resized_in_float_as_on_a_gpu_is_the_uint8_paths_within_one_gray_level(
    tree: Path, split: str, monkeypatch
) -> None:
    """On a GPU the batch is resized through float32 and rounded once for the whole batch (resizes_in_float);
    here on the CPU: the same crops, flips and unreadable slots as the uint8 path, within one gray level,
    and 3 tensor ops an image besides the batch's own."""
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_step_overhead import DispatchedOps

    dataset = getattr(data_module(tree, True), f"{split}_set")
    n = len(dataset)
    encoded = dataset.__getitems__(seeded(list(range(n))) if split == "train" else list(range(n))).images
    uint8, bad = encoded.decode(torch.device("cpu"))
    monkeypatch.setattr(device_decode, "resizes_in_float", lambda device: True)
    with DispatchedOps() as ops:
        through_float, bad_float = encoded.decode(torch.device("cpu"))
    assert bad_float == bad and through_float.dtype == torch.uint8
    assert through_float.is_contiguous(memory_format=torch.channels_last)
    diff = (through_float.int() - uint8.int()).abs()
    assert diff.max() <= 1 and diff.float().mean() < 0.25  # the uint8 kernel rounds in fixed point
    resized = sum(slot[0] == "jpeg" for slot in encoded.slots) - len(bad)
    per_image = [name for name in ops.names if name in ("_to_copy", "_upsample_bilinear2d_aa", "copy_")]
    assert len(per_image) == 3 * resized + 1, ops.names  # + 1: the batch's cast to uint8


# ---- decode ahead: batch k+1 decoded on a thread while batch k trains ----------------------------------


def loader(dm: ImageNetDataModule, split: str = "train", ahead: bool = True, device: str = "cpu"):
    """The split's loader as a Trainer on ``device`` iterates it (device_decode.DecodeAheadLoader, the
    device the Trainer's strategy would name), or without the thread, as the batches came before.
    test_cuda_resnet.py runs it on a GPU."""
    dm.decoder.ahead = ahead
    split_loader = getattr(dm, f"{split}_dataloader")()
    if ahead:
        split_loader.device = lambda: torch.device(device)
    return split_loader


def through_hooks(dm: ImageNetDataModule, batch, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Lightning's hooks around its copy of the batch to ``device``, outside a Trainer: no training state,
    so no on-device augmentation, only the decode and normalisation (test_cuda_resnet.py: on a GPU)."""
    dm.trainer = None
    batch = dm.on_before_batch_transfer(batch, 0)
    return dm.on_after_batch_transfer(move_data_to_device(batch, device), 0)  # Lightning's copy


@pytest.mark.parametrize("split", ["train", "val"])
def test_decoding_ahead_gives_the_batches_of_decoding_in_the_loop(tree: Path, split: str) -> None:
    dm = data_module(tree, True)
    ahead, inline = (list(loader(dm, split, on)) for on in (True, False))
    assert isinstance(loader(dm, split), device_decode.DecodeAheadLoader)
    assert all(isinstance(b.images, device_decode.DecodedAhead) for b in ahead)
    assert all(isinstance(b.images, EncodedBatch) for b in inline) and len(ahead) == len(inline) > 1
    for a, b in zip(ahead, inline, strict=True):
        xa, ya = through_hooks(dm, a)
        reported_a = dm.unreadable.take_pending("predict")  # no trainer: the hooks file them under predict
        xb, yb = through_hooks(dm, b)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert reported_a == dm.unreadable.take_pending("predict")


def test_a_decode_ahead_keeps_samples_as_the_bytes_do() -> None:
    """What the workers could not read is dropped after the decode started (``DecodedAhead[keep]``, twice
    here): the same pixels and the same decoder verdicts, renumbered, as dropping the bytes first."""
    pixels = torch.arange(6 * 3 * 2 * 2, dtype=torch.uint8).reshape(6, 3, 2, 2)
    done: Future = Future()
    done.set_result((pixels, {1: ("b.JPEG", "OSError: x"), 4: ("e.JPEG", "OSError: y")}, None))
    first, second = torch.tensor([1, 1, 0, 1, 1, 1], dtype=torch.bool), torch.tensor([0, 1, 1, 1, 1])
    out, bad = device_decode.DecodedAhead(done)[first][second.bool()].decode(torch.device("cpu"))
    assert torch.equal(out, pixels[[1, 3, 4, 5]])
    assert bad == {0: ("b.JPEG", "OSError: x"), 2: ("e.JPEG", "OSError: y")}


def test_batch_k_plus_1_is_decoded_on_a_thread_while_batch_k_is_held(tree: Path, monkeypatch) -> None:
    started: list[str] = []
    decode = EncodedBatch.decode

    def recording(self, device):
        started.append(threading.current_thread().name)
        return decode(self, device)

    monkeypatch.setattr(EncodedBatch, "decode", recording)
    batches = iter(loader(data_module(tree, True)))
    first = next(batches)  # not yet used: the second batch's decode starts all the same
    deadline = time.monotonic() + 30
    while len(started) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(started) == 2 and all(name.startswith("lit_ddp-decode") for name in started)
    first.images.decode(torch.device("cpu"))
    batches.close()  # an epoch cut short: the thread finishes and goes
    assert not [t for t in threading.enumerate() if t.name.startswith("lit_ddp-decode")]


def test_an_epoch_cut_short_does_not_decode_the_batch_no_one_will_use(tree: Path, monkeypatch) -> None:
    decoded: list[int] = []
    decode, cancel = EncodedBatch.decode, device_decode.DecodedAhead.cancel
    cancelled = threading.Event()

    def held(self, device):
        # The first batch's decode is still running when the epoch stops: it waits for the stop to cancel
        # the second, queued behind it (an event, not a time: the order holds on a loaded machine).
        cancelled.wait(timeout=60)
        decoded.append(len(self))
        return decode(self, device)

    def cancelling(self) -> bool:
        result = cancel(self)
        cancelled.set()
        return result

    monkeypatch.setattr(EncodedBatch, "decode", held)
    monkeypatch.setattr(device_decode.DecodedAhead, "cancel", cancelling)
    batches = iter(loader(data_module(tree, True)))
    first = next(batches)  # the second batch's decode waits behind the first's
    batches.close()
    assert len(decoded) == 1  # the first, handed out, was decoded; the second never started
    assert first.images.decode(torch.device("cpu"))[0].shape[0] == decoded[0]


def test_an_error_on_the_decode_thread_is_raised_where_the_batch_is_used(tree: Path, monkeypatch) -> None:
    def failing(self, device):
        raise MemoryError("no room for the batch")

    monkeypatch.setattr(EncodedBatch, "decode", failing)
    batch = next(iter(loader(data_module(tree, True))))
    with pytest.raises(MemoryError, match="no room for the batch"):
        through_hooks(data_module(tree, True), batch)


def test_outside_a_trainer_the_loader_hands_out_the_bytes(tree: Path) -> None:
    dm = data_module(tree, True)
    assert isinstance(next(iter(dm.train_dataloader())).images, EncodedBatch)  # no trainer: no device to name
    plain = data_module(tree, True, decode_ahead=False).train_dataloader()
    assert not isinstance(plain, device_decode.DecodeAheadLoader)


def test_predict_dir_is_decoded_on_the_device_as_the_cpu_path_decodes_it(tree: Path) -> None:
    """``predict --data.gpu_decode=true --data.predict_dir=DIR``: the folder's files were crops decoded in
    the workers, which the decode-ahead loader then asked to decode again (AttributeError on a Tensor)."""
    predict_dir = tree / "val" / CLASSES[0]  # clean JPEGs, unlabelled here
    dms = [data_module(tree, gpu, predict_dir=str(predict_dir)) for gpu in (False, True)]
    for dm in dms:
        dm.setup("predict")
    cpu = list(dms[0].predict_dataloader())
    dev = list(loader(dms[1], "predict"))
    assert all(isinstance(b.images, device_decode.DecodedAhead) for b in dev) and len(dev) == len(cpu)
    for on_cpu, on_device in zip(cpu, dev, strict=True):
        x_cpu, y_cpu, index_cpu = through_hooks(dms[0], on_cpu)
        x_dev, y, index = through_hooks(dms[1], on_device)
        assert torch.equal(index, index_cpu) and (y == -1).all()
        assert torch.equal(x_dev, x_cpu)


# ---- the typed batch -----------------------------------------------------------------------------------


def test_lightnings_copy_moves_the_batchs_tensors_and_leaves_the_encoded_images_on_the_host(
    tree: Path,
) -> None:
    """Lightning copies a dataclass batch field by field: the labels and indices move, the file bytes stay
    where the decoder reads them (a field that is neither a tensor nor has ``to``)."""
    dm = data_module(tree, True)
    batch = IndexedDataset(dm.train_set).__getitems__(seeded([0, 1, 2]))
    assert isinstance(batch, Batch) and isinstance(batch.images, EncodedBatch)
    moved = move_data_to_device(batch, torch.device("meta"))  # any device but the host's
    assert moved.labels.device.type == moved.index.device.type == "meta"
    assert moved.images is batch.images and moved.images.data.device.type == "cpu"


def test_a_batch_moves_each_field_as_lightnings_own_copy_would_move_it() -> None:
    """``Batch.to`` (what Lightning calls for the whole batch) moves each field as Lightning's
    ``move_data_to_device`` moves it alone: a tensor non-blocking onto a device the host need not wait for
    (blocking onto the CPU), the draws by their own ``to``, an object without ``to`` left as it is."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Copies(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.non_blocking: list[bool] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ == "_to_copy":
                self.non_blocking.append(bool((kwargs or {}).get("non_blocking", False)))
            return func(*args, **(kwargs or {}))

    encoded = object()
    batch = Batch(
        encoded, torch.arange(4), torch.arange(4) + 10, SampleRandom(torch.arange(4), 5), {9: ("f", "x")}
    )
    for device in ("meta", "cpu"):
        with Copies() as ours:
            moved = batch.to(device)
        with Copies() as lightnings:
            fields = [move_data_to_device(v, torch.device(device)) for v in (batch.labels, batch.index)]
            draws = move_data_to_device(batch.draws, torch.device(device))
        assert ours.non_blocking == lightnings.non_blocking  # onto the CPU: no copy at all
        assert ours.non_blocking[:2] == ([True, True] if device == "meta" else [])  # the labels, the indices
        assert moved.images is encoded and moved.unreadable == batch.unreadable
        for mine, theirs in ((moved.labels, fields[0]), (moved.index, fields[1])):
            assert mine.device == theirs.device == torch.device(device)
        assert moved.draws.bits(0).device == draws.bits(0).device == torch.device(device)
        if device == "cpu":
            assert torch.equal(moved.labels, batch.labels) and torch.equal(
                moved.draws.bits(0), batch.draws.bits(0)
            )


def test_a_batch_drops_unreadable_slots_with_their_labels_indices_and_draws() -> None:
    x, y, index = (
        torch.arange(12, dtype=torch.uint8).reshape(4, 3, 1, 1),
        torch.arange(4),
        torch.arange(10, 14),
    )
    batch = Batch(x, y, index=index, draws=SampleRandom(index, 1), unreadable={1: ("b.JPEG", "OSError: x")})
    kept = batch.drop(batch.unreadable)
    assert kept.labels.tolist() == [0, 2, 3] and kept.index.tolist() == [10, 12, 13] and not kept.unreadable
    assert torch.equal(kept.images, x[[0, 2, 3]])
    assert torch.equal(kept.draws.bits(5), SampleRandom(index[[0, 2, 3]], 1).bits(5))
    every = {i: ("f.JPEG", "OSError: x") for i in range(4)}
    assert len(Batch(x, y).drop(every)) == 4  # training, evaluation: no empty batch, the placeholders stay
    assert len(Batch(x, y, index=index).drop(every)) == 0  # predict: no row beats a wrong one
