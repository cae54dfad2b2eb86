"""Models return logits of the right shape; the classifier system's steps, metrics and optimizers."""

import dataclasses
import math
import re

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_RUN, TINY_SHAPES, run_cli
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from lit_ddp.errors import UserError
from lit_ddp.models import ImageClassifier, LeNet, LeNetCIFAR, OptimConfig, TopKAccuracy
from lit_ddp.models.classifier import TRAIN_STATES_KEY, LossMean
from lit_ddp.models.optim import build_optimizer, lr_lambda, param_groups


@pytest.mark.parametrize("batch_norm", [False, True])
def test_lenet_returns_logits_of_shape_batch_by_classes(batch_norm: bool) -> None:
    model = LeNet(num_classes=7, batch_norm=batch_norm)
    logits = model(torch.randn(5, 3, 32, 32))
    assert logits.shape == (5, 7)
    # Logits, not probabilities: a softmax layer would make every row sum to 1 and be non-negative.
    assert not torch.allclose(logits.sum(dim=1), torch.ones(5))
    assert (logits < 0).any()


def test_lenet_architecture_is_lenet5() -> None:
    model = LeNet()
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    fcs = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert [(c.out_channels, c.kernel_size) for c in convs] == [(6, (5, 5)), (16, (5, 5))]
    assert [f.out_features for f in fcs] == [120, 84, 10]
    assert not any(isinstance(m, nn.Softmax) for m in model.modules())
    assert sum(p.numel() for p in model.parameters()) == 62006  # LeNet-5 on 3×32×32 with 10 classes


def _textbook_lenet(model: LeNet, x: torch.Tensor) -> torch.Tensor:
    """LeNet-5 in its textbook order (conv → [BN] → ReLU → pool) with ``model``'s layers."""
    convs = [m for m in model.features if isinstance(m, nn.Conv2d)]
    norms = [m for m in model.features if isinstance(m, (nn.BatchNorm2d, nn.Identity))]
    for conv, norm in zip(convs, norms, strict=True):
        x = F.max_pool2d(F.relu(norm(conv(x))), 2)
    return model.classifier(x)


@pytest.mark.parametrize("batch_norm", [False, True])
def test_lenet_pools_before_relu_without_changing_the_function(batch_norm: bool) -> None:
    # Pooling before the ReLU is a speed-up (the ReLU sees 4x fewer elements), valid because max and
    # ReLU commute: outputs and gradients must equal the textbook order's.
    torch.manual_seed(0)
    model = LeNet(batch_norm=batch_norm).train()
    if batch_norm:  # a negative BN scale is the case where moving the pool before BN would be wrong
        for bn in model.modules():
            if isinstance(bn, nn.BatchNorm2d):
                bn.weight.data.uniform_(-1.0, 1.0)
    x = torch.randn(16, 3, 32, 32)
    ours = model(x)
    grads = torch.autograd.grad(ours.square().sum(), list(model.parameters()))
    textbook = _textbook_lenet(model, x)
    expected = torch.autograd.grad(textbook.square().sum(), list(model.parameters()))
    torch.testing.assert_close(ours, textbook)
    for g, e in zip(grads, expected, strict=True):
        torch.testing.assert_close(g, e)


def test_lenet_batch_norm_adds_bn_after_each_conv_and_hidden_fc() -> None:
    bns = [m for m in LeNet(batch_norm=True).modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert [bn.num_features for bn in bns] == [6, 16, 120, 84]
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in LeNet().modules())


# Every system the CLI can find by short name (--model=NAME): the subclasses lit_ddp.models imports.
# Other tests' subclasses (a user's system in test_ddp_kit.py) are left out: collection order decides which
# of them are imported by then.
SYSTEMS = {
    cls.__name__: cls for cls in ImageClassifier.__subclasses__() if cls.__module__.startswith("lit_ddp.")
}


@pytest.mark.parametrize("name", sorted(SYSTEMS))
def test_systems_save_hyperparameters_and_restore(name: str, tmp_path) -> None:
    system = SYSTEMS[name](num_classes=4)
    assert system.hparams.num_classes == 4
    assert system(torch.randn(2, 3, 32, 32)).shape == (2, 4)
    path = tmp_path / "m.ckpt"
    torch.save(
        {
            "state_dict": system.state_dict(),
            "hyper_parameters": dict(system.hparams),
            "pytorch-lightning_version": "2.6.6",
        },
        path,
    )
    restored = SYSTEMS[name].load_from_checkpoint(path, weights_only=False)
    assert restored.hparams.num_classes == 4
    assert restored.optim == system.optim


def test_shared_step_loss_is_cross_entropy_of_logits() -> None:
    system = LeNetCIFAR()
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    system.log = lambda *a, **k: None  # no trainer attached
    system.log_dict = lambda *a, **k: None
    loss, logits = system._shared_step((x, y), "val")
    assert torch.allclose(loss, nn.functional.cross_entropy(system(x), y))
    assert torch.equal(logits, system(x))
    assert system.val_metrics["acc"].compute() == (system(x).argmax(1) == y).float().mean()


def test_a_training_steps_metric_states_hold_no_graph() -> None:
    """The step hands the metrics its logits and loss as they are (no detach): the updates run with autograd
    off, so no state keeps the step's graph (or its memory) alive until the epoch's end."""
    system = LeNetCIFAR()
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    loss, logits = system._shared_step((x, y), "train")
    assert loss.requires_grad and logits.requires_grad
    states = {**system.train_loss.metric_state, **system.train_metrics["acc"].metric_state}
    assert states and all(not v.requires_grad and v.grad_fn is None for v in states.values()), states
    assert torch.allclose(system.train_loss.compute(), loss.detach())


def test_epoch_loss_is_the_sample_mean_a_nan_batch_makes_it_nan_and_a_bad_label_is_an_error() -> None:
    # The metrics skip torchmetrics' per-update checks; what those checks guarded must still hold.
    system = LeNetCIFAR()
    system.log = lambda *a, **k: None  # no trainer attached
    system.log_dict = lambda *a, **k: None
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    system._shared_step((x, y), "val")
    system._shared_step((torch.full_like(x, float("nan")), y), "val")
    assert torch.isnan(system.val_loss.compute())  # not the finite mean of the other batch
    system.val_loss.reset()
    system._shared_step((x[:6], y[:6]), "val")
    system._shared_step((x[6:], y[6:]), "val")  # a short last batch counts for its 2 samples only
    whole = F.cross_entropy(system(x), y)
    assert torch.allclose(system.val_loss.compute(), whole, atol=1e-6)
    per_sample = F.cross_entropy(system(x), y, reduction="none")
    tensor_weights = LossMean()
    tensor_weights.update(per_sample[:6].mean(), torch.tensor(6))
    tensor_weights.update(per_sample[6:], torch.ones(2))  # a weight per value, as MeanMetric takes them
    assert torch.allclose(tensor_weights.compute(), whole, atol=1e-6)
    with pytest.raises((IndexError, RuntimeError), match="out of bounds"):
        system._shared_step((x, torch.full_like(y, 10)), "val")


@pytest.mark.parametrize(("num_classes", "top_k"), [(10, 1), (10, 3), (10, 10), (1000, 5)])
def test_top_k_accuracy_agrees_with_torchmetrics_sample_by_sample(num_classes: int, top_k: int) -> None:
    """The classifier's accuracy gives torchmetrics' micro MulticlassAccuracy's value after every batch,
    ties among the logits and a short last batch included; an epoch without a sample computes 0 as there."""
    g = torch.Generator().manual_seed(num_classes + top_k)
    ours, theirs = TopKAccuracy(top_k), MulticlassAccuracy(num_classes, top_k=top_k, average="micro")
    assert ours.compute() == theirs.compute() == 0
    ours.reset()
    theirs.reset()
    for batch in (64, 64, 7):
        # Logits from 4 values: most rows hold ties, which argmax and topk break as torchmetrics' do.
        logits = torch.randint(0, 4, (batch, num_classes), generator=g).float()
        labels = torch.randint(0, num_classes, (batch,), generator=g)
        ours.update(logits, labels)
        theirs.update(logits, labels)
        assert ours.compute() == theirs.compute()
    assert ours.total == 135
    with pytest.raises(ValueError, match="top_k must be at least 1"):
        TopKAccuracy(0)
    beyond = TopKAccuracy(top_k=5)  # more than the 3 classes: every label is among them
    beyond.update(torch.randn(4, 3), torch.tensor([0, 1, 2, 0]))
    assert beyond.compute() == 1.0


def test_top_1_and_top_5_stay_apart_when_their_first_batch_counts_agree() -> None:
    """Every top-5 hit of the first batch is a top-1 hit, so the two accuracies' states are equal after it:
    the collection must not merge them (torchmetrics' compute groups would), or top-5 reports top-1."""
    system = LeNetCIFAR(top_k=(1, 5))
    labels = torch.arange(4)
    first = F.one_hot(labels, 10).float()  # the label is the argmax: a top-1 and a top-5 hit
    second = first * 0.5 + F.one_hot(labels + 4, 10).float()  # the label second-highest: top-5 only
    system.train_metrics.update(first, labels)
    system.train_metrics.update(second, labels)
    computed = system.train_metrics.compute()
    assert (computed["train/acc"], computed["train/acc_top5"]) == (0.5, 1.0)


def test_top_k_is_left_out_where_the_classes_are_k_or_fewer() -> None:
    """With 3 classes the label is always among the top 5: acc_top5 stuck at 1.0 on every dashboard."""
    from lit_ddp.models.classifier import build_metrics

    assert set(build_metrics(3, (1, 5))) == {"acc"}
    assert set(build_metrics(5, (1, 5))) == {"acc"}
    assert set(build_metrics(6, (1, 5))) == {"acc", "acc_top5"}


def test_a_mid_epoch_checkpoint_with_torchmetrics_accuracy_states_resumes_with_their_counts() -> None:
    """A checkpoint written mid-epoch while the accuracy was torchmetrics' MulticlassAccuracy (its tp, fp, tn,
    fn states) resumes with its counts: train/acc over the whole epoch, not only after the resume."""
    g = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(50, 10, generator=g), torch.randint(0, 10, (50,), generator=g)
    written = {
        "acc": MulticlassAccuracy(10, average="micro"),
        "acc_top5": MulticlassAccuracy(10, top_k=5, average="micro"),
    }
    for metric in written.values():
        metric.update(logits, labels)
    loss = LossMean()
    loss.update(torch.tensor(2.0), weight=50)
    checkpoint = {
        TRAIN_STATES_KEY: {
            "loss": dict(loss.metric_state),
            **{name: dict(metric.metric_state) for name, metric in written.items()},
        }
    }
    system = LeNetCIFAR(top_k=(1, 5))
    system.on_load_checkpoint(checkpoint)
    resumed = system.train_metrics.compute()
    assert resumed["train/acc"] == written["acc"].compute()
    assert resumed["train/acc_top5"] == written["acc_top5"].compute()
    assert system.train_metrics["acc"].total == 50 and system.train_loss.compute() == 2.0


def test_param_groups_exclude_norm_and_bias_from_weight_decay() -> None:
    model = LeNet(batch_norm=True)
    decay, no_decay = param_groups(model, weight_decay=1e-4, exclude_norm_and_bias=True)
    assert all(p.ndim > 1 for p in decay["params"]) and all(p.ndim == 1 for p in no_decay["params"])
    assert no_decay["weight_decay"] == 0.0
    n = sum(1 for _ in model.parameters())
    assert len(decay["params"]) + len(no_decay["params"]) == n


def test_warmup_then_cosine_schedule() -> None:
    f = lr_lambda("cosine", total_steps=110, warmup_steps=10)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0) and f(60) == pytest.approx(0.5) and f(110) == pytest.approx(0.0)
    step = lr_lambda("step", total_steps=90, warmup_steps=0)
    assert [step(0), step(30), step(60)] == pytest.approx([1.0, 0.1, 0.01])


def test_a_warmup_as_long_as_the_run_is_kept_and_only_a_longer_one_is_cut(caplog) -> None:
    """A one-epoch run with warmup_epochs=1 printed "1.0 is 3 steps, more than the run's 3: the warmup is
    cut to 2 steps", and the cut made its lr peak one step early."""
    cfg = OptimConfig(warmup_epochs=1.0, schedule="cosine")
    with caplog.at_level("INFO"):
        _, scheduler = build_optimizer(LeNet(), cfg, global_batch=32, total_steps=3, steps_per_epoch=3)
    assert not [m for m in caplog.messages if "warmup" in m]
    assert [scheduler.lr_lambdas[0](step) for step in range(3)] == pytest.approx([1 / 3, 2 / 3, 1.0])
    with caplog.at_level("INFO"):
        _, scheduler = build_optimizer(LeNet(), cfg, global_batch=32, total_steps=2, steps_per_epoch=3)
    assert (
        "lit_ddp: note: --model.optim.warmup_epochs=1.0 is 3 steps, more than the run's 2: the warmup is cut"
        " to 2 steps, so the lr reaches its peak only at the last step"
    ) in caplog.messages
    assert [scheduler.lr_lambdas[0](step) for step in range(2)] == pytest.approx([0.5, 1.0])


def test_a_resumed_schedule_says_when_it_was_rebuilt_for_another_length(caplog) -> None:
    """A run stopped early and resumed with a larger --trainer.max_epochs continued on a cosine rebuilt for
    the new length, and ended away from the uninterrupted run, with no word."""

    def state(schedule: str, total_steps: int, steps_done: int = 4) -> dict:
        optimizer, scheduler = build_optimizer(
            LeNet(), OptimConfig(schedule=schedule), 32, total_steps, steps_per_epoch=4
        )
        for _ in range(steps_done):
            optimizer.step()
            scheduler.step()
        return scheduler.state_dict()

    def resumed(saved: dict, schedule: str, total_steps: int) -> list[str]:
        _, scheduler = build_optimizer(LeNet(), OptimConfig(schedule=schedule), 32, total_steps, 4)
        caplog.clear()
        with caplog.at_level("INFO"):
            scheduler.load_state_dict(saved)
        assert scheduler.last_epoch == 4
        return [m for m in caplog.messages if "learning-rate schedule" in m]

    assert resumed(state("cosine", 8), "cosine", 16) == [
        "lit_ddp: note: the checkpoint's learning-rate schedule spans 8 steps, this run's 16 steps (its"
        " budget, --trainer.max_epochs or --trainer.max_steps, decides the length): the lr continues from"
        " step 4 on this run's schedule, so the run ends with other weights than one trained with this budget"
        " from the start"
    ]
    assert resumed(state("cosine", 8), "cosine", 8) == []  # the same budget: the uninterrupted run
    assert resumed(state("constant", 8), "constant", 16) == []  # a curve of any length
    legacy = {k: v for k, v in state("cosine", 8).items() if k != "built_for"}  # length not recorded
    assert resumed(legacy, "cosine", 16) == []


def test_scale_lr_multiplies_by_global_batch_over_base() -> None:
    cfg = OptimConfig(name="sgd", lr=0.1, scale_lr=True, base_batch_size=256)
    optimizer, _ = build_optimizer(LeNet(), cfg, global_batch=1024, total_steps=10, steps_per_epoch=10)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.4)
    unscaled, _ = build_optimizer(
        LeNet(), OptimConfig(lr=0.1), global_batch=1024, total_steps=10, steps_per_epoch=10
    )
    assert unscaled.param_groups[0]["lr"] == pytest.approx(0.1)
    assert math.isclose(cfg.lr, 0.1)  # the config itself is not mutated
    warm = OptimConfig(name="sgd", lr=0.1, scale_lr=True, warmup_epochs=1.0)
    optimizer, _ = build_optimizer(LeNet(), warm, global_batch=1024, total_steps=100, steps_per_epoch=10)
    # The scaled base lr is what the schedule scales; the first warmup step runs at a tenth of it.
    assert optimizer.param_groups[0]["initial_lr"] == pytest.approx(0.4)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.04)


@pytest.mark.parametrize("name", ["sgd", "adam", "adamw"])
def test_fused_optimizer_is_the_default_where_torch_has_it_and_updates_like_the_plain_one(name: str) -> None:
    torch.manual_seed(0)
    plain_model, fused_model = LeNet(), LeNet()
    fused_model.load_state_dict(plain_model.state_dict())
    cfg = OptimConfig(name=name, lr=0.01, weight_decay=1e-3, nesterov=name == "sgd")
    fused, _ = build_optimizer(fused_model, cfg, global_batch=8, total_steps=10, steps_per_epoch=10)
    plain, _ = build_optimizer(
        plain_model, dataclasses.replace(cfg, fused=False), global_batch=8, total_steps=10, steps_per_epoch=10
    )
    assert all(group["fused"] for group in fused.param_groups)  # CPU parameters: torch ≥ 2.4 has it
    assert not any(group["fused"] for group in plain.param_groups)
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    for model, optimizer in ((plain_model, plain), (fused_model, fused)):
        for _ in range(3):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    for p, q in zip(plain_model.parameters(), fused_model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_lenet_cifar_is_channels_last_by_default_with_unchanged_outputs() -> None:
    torch.manual_seed(0)
    nhwc, nchw = LeNetCIFAR(), LeNetCIFAR(channels_last=False)
    nchw.load_state_dict(nhwc.state_dict())  # the memory format does not change the checkpoint
    assert nhwc.net.features[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert nchw.net.features[0].weight.is_contiguous()
    x = torch.randn(4, 3, 32, 32)  # an NCHW batch is converted on the way in
    torch.testing.assert_close(nhwc(x), nchw(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("compile", "mode"), [(True, None), ("reduce-overhead", "reduce-overhead")])
def test_compile_is_torch_compile_in_place_in_the_mode_named(compile, mode, monkeypatch) -> None:
    """``true`` compiles in torch's default mode, a mode's name in that mode (reduce-overhead: CUDA graphs),
    the network in place, so the checkpoint's names do not change; where Lightning compiles it, once."""
    calls: list[dict] = []
    real = torch.compile

    def recorded(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "compile", recorded)
    model, plain = LeNetCIFAR(compile=compile), LeNetCIFAR()
    model.configure_model()
    model.configure_model()
    assert [kwargs.get("mode") for kwargs in calls] == [mode]
    assert model.state_dict().keys() == plain.state_dict().keys()
    with pytest.raises(UserError, match=r"^--model.compile=fast is not a torch.compile mode: give true"):
        LeNetCIFAR(compile="fast")


@pytest.mark.parametrize("nvml_loads", [False, True])
def test_nvml_based_cuda_check_is_skipped_only_where_nvml_cannot_load(
    nvml_loads: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ctypes
    import os
    import sys

    from lit_ddp.runtime.nvml import skip_futile_nvml_checks

    def cdll(name: str):
        if not nvml_loads:
            raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(ctypes, "CDLL", cdll)
    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # what importing Lightning sets
    skip_futile_nvml_checks()
    assert os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] == ("1" if nvml_loads else "0")


def test_open_ended_runs_refuse_schedules_that_need_a_length_and_run_the_others() -> None:
    import math

    from lit_ddp.errors import UserError

    net = LeNet()
    with pytest.raises(UserError, match=r"schedule=cosine .* --trainer.max_epochs or --trainer.max_steps"):
        build_optimizer(net, OptimConfig(schedule="cosine"), 64, math.inf, steps_per_epoch=10)
    optimizer, scheduler = build_optimizer(
        net, OptimConfig(lr=0.1, schedule="constant", warmup_epochs=1), 64, math.inf, steps_per_epoch=10
    )
    lrs = []
    for _ in range(30):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[0] == pytest.approx(0.01) and lrs[9] == pytest.approx(0.1) and lrs[29] == pytest.approx(0.1)


def test_a_composed_network_is_built_with_the_datas_classes_and_its_checkpoint_rebuilds_it(tmp_path) -> None:
    """ImageClassifier(net=<class_path>): one nn.Module plus a YAML line, no system subclass. The data's
    num_classes reaches the network, the checkpoint keeps the network's class_path and arguments, and
    both load_from_checkpoint and `validate --ckpt_path` rebuild it."""
    composed = ["--model=ImageClassifier", "--model.net=LeNet", "--model.net.batch_norm=true"]
    fit = run_cli(["fit", *composed, *TINY_SHAPES, "--trainer.max_epochs=1"], cwd=tmp_path)
    assert fit.returncode == 0, fit.stderr[-3000:]
    ckpt = next(tmp_path.rglob("last.ckpt"))
    hparams = torch.load(ckpt, weights_only=True)["hyper_parameters"]
    assert (
        hparams["net"]["class_path"] == "lit_ddp.models.LeNet" and hparams["net"]["init_args"]["batch_norm"]
    )
    restored = ImageClassifier.load_from_checkpoint(ckpt)
    assert isinstance(restored.net, LeNet) and restored.net.classifier[-1].out_features == 10
    assert any(isinstance(m, nn.BatchNorm2d) for m in restored.net.modules())
    validate = run_cli(["validate", f"--ckpt_path={ckpt}", *TINY_SHAPES], cwd=tmp_path)
    assert validate.returncode == 0, validate.stderr[-3000:]


def test_a_composed_network_takes_num_classes_first() -> None:
    system = ImageClassifier(net=LeNet, num_classes=3)
    assert system(torch.randn(2, 3, 32, 32)).shape == (2, 3)
    assert system.hparams.net is LeNet and system.hparams.num_classes == 3


class _CatBug(nn.Module):
    """A network of the user's own whose forward has a bug of its own (torch.cat of a 2-D and a 3-D tensor),
    whatever the image size."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.head = nn.Linear(5, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = x.mean(dim=(2, 3))
        return self.head(torch.cat([features, torch.zeros(x.shape[0], 1, 2)], dim=1))


def test_an_error_in_a_users_own_network_keeps_its_traceback_and_a_library_network_is_one_line() -> None:
    """Only an error of a library's network (LeNet, torchvision's) is surely the data's image size; one in the
    user's own network may be a bug in its forward, which their traceback shows, not a one-line size hint."""
    with pytest.raises(RuntimeError, match="same number of dimensions") as caught:
        ImageClassifier(net=_CatBug, num_classes=3)(torch.randn(2, 3, 32, 32))
    assert not isinstance(caught.value, UserError)
    assert any(entry.name == "forward" and entry.path.name == "test_models.py" for entry in caught.traceback)
    if hasattr(caught.value, "add_note"):  # Python 3.11: the size hint comes as a note, for a size mismatch
        assert any("--data.image_size" in note for note in caught.value.__notes__)
    with pytest.raises(UserError, match="LeNet cannot take the data's 3×64×64 images"):
        ImageClassifier(net=LeNet, num_classes=3)(torch.randn(2, 3, 64, 64))


def test_labels_outside_the_models_classes_are_one_line_at_the_first_batch() -> None:
    """A model built for 3 classes on data with 4 (from Python, where nothing links the two numbers): a
    cross-entropy traceback ("Target 3 is out of bounds") on a CPU, a device-side assert on CUDA. The data
    module keeps the base's num_classes (10), which its own label check allows."""
    from lightning import Trainer

    from lit_ddp.data import ImageDataModule

    class FourClasses(ImageDataModule):
        def load_split(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.zeros(64, 3, 32, 32, dtype=torch.uint8), torch.arange(64) % 4

    trainer = Trainer(
        max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False, accelerator="cpu"
    )
    with pytest.raises(
        UserError, match="a (train|val) batch holds label 3, and ImageClassifier has num_classes=3"
    ):
        trainer.fit(ImageClassifier(net=LeNet, num_classes=3), datamodule=FourClasses(batch_size=16))


class _NumClassesLater(nn.Module):
    """timm's form: ``VisionTransformer(img_size=224, patch_size=16, in_chans=3, num_classes=1000, ...)``."""

    def __init__(self, img_size: int = 32, in_chans: int = 3, num_classes: int = 1000) -> None:
        super().__init__()
        self.img_size = img_size
        self.head = nn.Linear(in_chans, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x.mean(dim=(2, 3)))


def test_a_network_taking_num_classes_after_another_argument_is_refused_in_one_line() -> None:
    """ImageClassifier builds the network as Net(num_classes, ...): a timm-like class whose num_classes is not
    its first argument trained silently with img_size=3 and a 1000-class head on 3-class data (and the
    printed config said num_classes: 1000). Given from Python or as a class_path with init_args (the config
    form, which jsonargparse builds), it is one line naming the argument and the fix."""
    from lightning import LightningModule

    from lit_ddp.testing import instantiate

    with pytest.raises(UserError, match=r"_NumClassesLater takes num_classes after img_size"):
        ImageClassifier(net=_NumClassesLater, num_classes=3)
    section = {
        "class_path": "lit_ddp.models.ImageClassifier",
        "init_args": {
            "num_classes": 3,
            "net": {"class_path": f"{__name__}._NumClassesLater", "init_args": {"in_chans": 3}},
        },
    }
    with pytest.raises(UserError, match=r"_NumClassesLater takes num_classes after img_size"):
        instantiate(section, LightningModule)


class _Outputs(nn.Module):
    """A network of the user's own that returns ``kind``: a tuple (aux logits), a dict, or 1000 columns."""

    def __init__(self, num_classes: int, kind: str = "tuple") -> None:
        super().__init__()
        self.kind = kind
        self.head = nn.Linear(3, 1000 if kind == "wide" else num_classes)

    def forward(self, x: torch.Tensor):
        logits = self.head(x.mean(dim=(2, 3)))
        return {"tuple": (logits, logits), "dict": {"logits": logits}, "wide": logits}[self.kind]


@pytest.mark.parametrize(
    ("kind", "said"), [("tuple", "a tuple"), ("dict", "a dict"), ("wide", "shape (2, 1000)")]
)
def test_a_network_that_does_not_return_one_logits_tensor_per_class_is_one_line(kind: str, said: str) -> None:
    """A tuple or a dict reached cross_entropy as a TypeError traceback; 1000 outputs for 3 classes trained
    silently (until the confusion matrix failed to reshape)."""
    import functools

    system = ImageClassifier(net=functools.partial(_Outputs, kind=kind), num_classes=3)
    with pytest.raises(
        UserError, match=rf"_Outputs returned {re.escape(said)}, not \(batch, num_classes=3\)"
    ):
        system(torch.randn(2, 3, 32, 32))


def test_a_built_network_of_another_width_than_num_classes_names_num_classes_too() -> None:
    """``ImageClassifier(net=MyNet(3))`` for 3-class data, num_classes left at its default of 10: the line
    said to give the network a last layer of 10 outputs, the wrong fix; a network built from num_classes (a
    class given as net) is still told about its last layer alone."""
    import functools

    system = ImageClassifier(net=nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 3)))
    with pytest.raises(UserError) as err:
        system(torch.randn(2, 3, 32, 32))
    assert str(err.value) == (
        "Sequential returned shape (2, 3), not (batch, num_classes=10) logits: give ImageClassifier"
        " num_classes=3 if the data has 3 classes (a network passed built is not built from num_classes),"
        " else a last layer with num_classes outputs"
    )
    composed = ImageClassifier(net=functools.partial(_Outputs, kind="wide"), num_classes=3)
    with pytest.raises(UserError, match="its last layer with num_classes outputs$"):
        composed(torch.randn(2, 3, 32, 32))


@pytest.mark.timeout(300)
def test_a_resume_whose_optimizer_cannot_take_the_checkpoints_state_is_one_line(tmp_path) -> None:
    """The --model.optim.* a resume gives are this run's, not the checkpoint's: another optimizer stopped on
    torch's KeyError 'step' traceback as it loaded SGD's state; a weight decay turned on split the
    parameters into two groups, torch's ValueError. Settings left at their defaults are the checkpoint's:
    a resume need not repeat the first run's --model.optim.name=sgd."""
    run = ["fit", *TINY_RUN, "--model.optim.schedule=constant"]
    first = run_cli([*run, "--model.optim.name=sgd", "--model.optim.weight_decay=0"], cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    ckpt = "logs/lightning_logs/version_0/checkpoints/last.ckpt"
    again = run_cli(
        [*run, "--model.optim.weight_decay=0", "--trainer.max_epochs=2", "--ckpt_path=last"], cwd=tmp_path
    )
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr[-2000:]
    for changed, said in (
        (["--model.optim.name=adam"], "--model.optim.name=adam (the checkpoint's: sgd)"),
        (["--model.optim.name=sgd", "--model.optim.weight_decay=0.01"], "--model.optim.weight_decay=0.01 ("),
    ):
        resumed = run_cli([*run, *changed, "--trainer.max_epochs=2", "--ckpt_path=last"], cwd=tmp_path)
        errors = [line for line in resumed.stderr.splitlines() if "error" in line.lower()]
        assert resumed.returncode == 2 and len(errors) == 1 and "Traceback" not in resumed.stderr, errors
        assert errors[0].startswith(f"lit_ddp: error: cannot resume {ckpt}: its optimizer state"), errors
        assert said in errors[0], errors


def test_a_resume_trains_with_its_own_optimizer_settings_and_says_which_changed(tmp_path, caplog) -> None:
    """torch's load_state_dict takes each param group's settings from the checkpoint: `fit --ckpt_path=last
    --model.optim.weight_decay=0.001` over a run trained at 0.0005 trained on at 0.0005 without a word,
    while its config.yaml recorded 0.001. This run's settings are put back after the load, with a note."""
    from lit_ddp.cli import build_cli

    root = f"--trainer.default_root_dir={tmp_path}"
    run = ["fit", *TINY_RUN, "--model.optim.name=sgd", "--model.optim.schedule=constant", root]
    build_cli([*run, "--model.optim.weight_decay=0.0005", "--model.optim.momentum=0.9"])
    changed = ["--model.optim.weight_decay=0.001", "--model.optim.momentum=0.8"]
    with caplog.at_level("INFO"):
        resumed = build_cli([*run, *changed, "--trainer.max_epochs=2", "--ckpt_path=last"])
    decay, rest = resumed.trainer.optimizers[0].param_groups
    assert (decay["weight_decay"], rest["weight_decay"], decay["momentum"], rest["momentum"]) == (
        1e-3,
        0,
        0.8,
        0.8,
    )
    notes = [m for m in caplog.messages if "trains on with this run's" in m]
    assert notes == [
        "lit_ddp: note: the optimizer trains on with this run's momentum 0.8 (the checkpoint's: 0.9),"
        " weight_decay 0.001 (the checkpoint's: 0.0005)"
    ], caplog.messages
    assert resumed.trainer.global_step == 4  # two epochs of two steps: it resumed


def _weights_after_one_epoch(train_size: int, batch_size: int, accumulate: int) -> dict[str, torch.Tensor]:
    from lightning import Trainer, seed_everything

    from lit_ddp.data import ShapesDataModule

    seed_everything(0)  # the same initial weights in each run
    model = ImageClassifier(net=LeNet, optim=OptimConfig(name="sgd", lr=0.5, schedule="constant"))
    data = ShapesDataModule(train_size=train_size, val_size=16, test_size=16, batch_size=batch_size)
    trainer = Trainer(
        max_epochs=1,
        accumulate_grad_batches=accumulate,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        accelerator="cpu",
    )
    trainer.fit(model, datamodule=data)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("train_size", [48, 56])
def test_accumulated_batches_train_as_one_batch_of_their_images_at_the_epochs_ragged_end(
    train_size: int,
) -> None:
    """1 × 16 with 2 accumulated batches takes 1 × 32's global batches, the epoch's last one too. Lightning
    divides every batch's loss by the accumulation: 48 images end with a step of one batch of 16 (half its
    gradient), 56 with 16 + 8 images (the 8 weighing as much as the 16), where 1 × 32 takes their mean."""
    whole = _weights_after_one_epoch(train_size, batch_size=32, accumulate=1)
    accumulated = _weights_after_one_epoch(train_size, batch_size=16, accumulate=2)
    largest = max((whole[k] - accumulated[k]).abs().max().item() for k in whole)
    assert largest < 1e-6, f"weights differ by {largest:.2e}"
