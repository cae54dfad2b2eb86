"""``--model.cuda_graph``: the training step replayed as CUDA graphs (lit_ddp/models/step_graph.py).

On a CPU the same step runs eagerly, so these tests check everything but the capture itself: it trains as
the usual step does (the epoch's partial batch, the hooks, the schedule), its warm-up trains nothing, it
resumes exactly and its checkpoints resume a run without graphs, and what it cannot replay is refused in one
line. test_cuda.py runs the captured step on a GPU against the usual one.
"""

from pathlib import Path

import pytest
import torch
from conftest import TINY_RUN, read_scalars, run_dirs
from lenet_fits import BATCH, GradsBeforeUpdate, StopAfterFirstEpoch, assert_close, fit, lenet, trainer
from lightning import Callback, Trainer
from lightning.pytorch.callbacks import GradientAccumulationScheduler
from test_mistakes import one_error_line
from torch import nn

from lit_ddp.callbacks import StepLoss
from lit_ddp.cli import build_cli
from lit_ddp.models import OptimConfig
from lit_ddp.models.step_graph import ReplayedAdamW, ReplayedStep, StepGraph, replay_blocker


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_a_replayed_step_trains_as_the_usual_step_with_the_partial_batch_hooks_and_schedule(
    tmp_path: Path, precision: str
) -> None:
    usual, logs = lenet(False), dict(callbacks=[StepLoss()], log_every_n_steps=1, precision=precision)
    expected = fit(usual, trainer(tmp_path / "usual", **logs))
    replayed, replay_hook = lenet(True), GradsBeforeUpdate()
    logs["callbacks"].append(replay_hook)
    got = fit(replayed, trainer(tmp_path / "replayed", **logs))

    assert not replayed.automatic_optimization and usual.automatic_optimization
    optimizer = replayed.optimizers().optimizer
    assert isinstance(optimizer, ReplayedAdamW) and torch.is_tensor(optimizer.param_groups[0]["lr"])
    # 2 epochs of 3 full batches and the partial one, each an optimizer step seeing its gradients.
    assert replayed.trainer.global_step == usual.trainer.global_step == 8
    assert replay_hook.seen == [(step, True) for step in range(8)]
    lrs = [group["lr"] for group in usual.optimizers().optimizer.param_groups]
    assert [g["lr"].item() for g in optimizer.param_groups] == pytest.approx(lrs, rel=1e-6)
    assert_close(got, expected, atol=1e-6 if precision == "32-true" else 1e-3)
    for name in ("train/loss_epoch", "train/acc", "train/loss_step"):  # the last: the last batch's loss
        theirs, ours = usual.trainer.callback_metrics[name], replayed.trainer.callback_metrics[name]
        assert float(ours) == pytest.approx(float(theirs), abs=1e-5 if precision == "32-true" else 1e-2)


def small_net() -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)]
    return nn.Sequential(*layers)


@pytest.mark.parametrize("resumed", [False, True], ids=["fresh", "resumed"])
def test_the_warm_up_before_a_capture_trains_nothing(resumed: bool) -> None:
    """The capture is preceded by 3 real steps (cuDNN's choices, the optimizer's state): the weights,
    BatchNorm's running statistics, the optimizer's state (fresh, or a resumed run's) and the random state
    must come out as they went in, or a replayed run would differ from the usual one by 3 steps."""
    net = small_net()
    optimizer = ReplayedAdamW(net.parameters(), lr=torch.tensor(0.01), foreach=False)
    x, y = torch.randn(5, 3, 8, 8), torch.tensor([0, 1, 2, 0, 1])

    def loss_of(x, y):
        logits = net(x)
        return logits, nn.functional.cross_entropy(logits, y)

    if resumed:  # the state a checkpoint would have restored
        loss_of(x, y)[1].backward()
        optimizer.step()
    weights = {k: v.clone() for k, v in net.state_dict().items()}
    state = {p: {k: v.clone() for k, v in s.items()} for p, s in optimizer.state.items()}
    rng = torch.get_rng_state()

    graph = StepGraph(net, loss_of, optimizer, (x, y))

    for name, value in net.state_dict().items():
        assert torch.equal(value, weights[name]), name
    assert len(optimizer.state) == len(net_params := list(net.parameters()))
    for p in net_params:
        for key, value in optimizer.state[p].items():
            expected = state[p][key] if resumed else torch.zeros_like(value)
            assert torch.equal(value, expected), key
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in net_params)
    # The first step after it: the gradients of this batch, as a plain backward gives them.
    logits, loss = graph.run((x, y))
    grads = [p.grad.clone() for p in net_params]
    net.zero_grad()
    plain_logits, plain_loss = loss_of(x, y)
    plain_loss.backward()
    assert torch.equal(loss, plain_loss.detach()) and torch.equal(logits, plain_logits.detach())
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, net_params, strict=True))


BLOCKERS = {
    "ddp": (dict(devices=2, strategy="ddp"), {}, "this run's strategy is DDPStrategy"),
    "accumulation": (dict(accumulate_grad_batches=2), {}, "--trainer.accumulate_grad_batches=2"),
    # The Trainer's accumulation says 1 until the scheduler sets an epoch's: replayed, Lightning's scheduler
    # raised its RuntimeError for manual optimisation at the fit's start (cuda_graph: auto on a GPU too).
    "scheduled": (
        dict(callbacks=[GradientAccumulationScheduler({0: 1, 1: 2})]),
        {},
        "the GradientAccumulationScheduler accumulates up to 2",
    ),
    "clipping": (dict(gradient_clip_val=1.0), {}, "--trainer.gradient_clip_val=1.0 clips outside"),
    "sgd": ({}, dict(optim=OptimConfig(name="sgd", lr=0.1)), "--model.optim.name=sgd has no update"),
    "compile": ({}, dict(compile=True), "--model.compile already compiles the network"),
}


def fresh(trainer_args: dict) -> dict:
    """A copy of each list: a Trainer adds its default callbacks to the list it is given."""
    return {key: list(value) if isinstance(value, list) else value for key, value in trainer_args.items()}


@pytest.mark.parametrize("case", BLOCKERS)
def test_a_run_the_graphs_cannot_replay_is_named_true_refuses_it_and_auto_trains_it_as_usual(
    case: str, tmp_path: Path
) -> None:
    trainer_args, model_args, reason = BLOCKERS[case]
    model = lenet(True, **model_args)
    run = Trainer(accelerator="cpu", logger=False, **{"devices": 1, **fresh(trainer_args)})
    blocker = replay_blocker(run, model.optim.name, bool(model.compile_net))
    assert blocker is not None and reason in blocker
    model.trainer = run
    assert model.automatic_optimization  # Lightning's own checks then see the usual loop, not manual
    if case in ("ddp", "compile"):
        return  # a fit would launch processes or compile: the rest is what the other cases check
    with pytest.raises(Exception, match="--model.cuda_graph=true cannot replay this run's training step"):
        fit(lenet(True, **model_args), trainer(tmp_path / "true", **fresh(trainer_args)))
    auto = lenet("auto", **model_args)
    fit(auto, trainer(tmp_path / "auto", **fresh(trainer_args)))
    assert auto.trainer.global_step > 0 and not isinstance(auto.optimizers().optimizer, ReplayedStep)


def test_the_16_mixed_loss_scaler_is_named_as_a_blocker() -> None:
    """A GradScaler skips a step by a check on the host: read from the precision plugin's ``scaler``."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    run = Trainer(accelerator="cpu", devices=1, logger=False)
    scaler = torch.amp.GradScaler("cpu")
    run.strategy.precision_plugin = MixedPrecision("16-mixed", "cpu", scaler=scaler)
    assert "skips steps by a check on the host" in replay_blocker(run, "adamw", False)


def test_true_refuses_in_one_line_from_the_command_line(tmp_path: Path, capsys) -> None:
    root = f"--trainer.default_root_dir={tmp_path}"
    argv = ["fit", *TINY_RUN, "--model.cuda_graph=true", "--trainer.accumulate_grad_batches=2", root]
    line = one_error_line(capsys, argv)
    assert line == (
        "--model.cuda_graph=true cannot replay this run's training step: it updates at every batch, and"
        " --trainer.accumulate_grad_batches=2; or pass --model.cuda_graph=auto, which trains such a run"
        " without graphs"
    )
    assert not list(tmp_path.rglob("*.ckpt"))


def test_auto_off_cuda_is_the_usual_step_and_says_nothing(tmp_path: Path, capsys) -> None:
    model = lenet("auto")
    fit(model, trainer(tmp_path, epochs=1))
    assert model.automatic_optimization and not isinstance(model.optimizers().optimizer, ReplayedStep)
    assert "cuda_graph" not in capsys.readouterr().err


def test_a_replayed_run_resumes_exactly_and_its_checkpoints_resume_a_run_without_graphs(
    tmp_path: Path,
) -> None:
    """Stopped after its first epoch and resumed, a replayed run ends where the uninterrupted one does; its
    checkpoint holds numbers, not the device tensor the graph reads, so a run without graphs (another
    device count, say) resumes from it, and the other way round."""
    whole = fit(lenet(True), trainer(tmp_path / "whole"))
    fit(lenet(True), trainer(tmp_path / "first", callbacks=[StopAfterFirstEpoch()]))
    resumed = fit(lenet(True), trainer(tmp_path / "resumed"), ckpt_path=tmp_path / "first" / "last.ckpt")
    assert_close(resumed, whole, atol=0)

    checkpoint = torch.load(tmp_path / "first" / "last.ckpt", weights_only=True)
    groups = checkpoint["optimizer_states"][0]["param_groups"]
    assert all(type(g["lr"]) is float and g["capturable"] is False and g["fused"] is None for g in groups)
    assert all(type(lr) is float for lr in checkpoint["lr_schedulers"][0]["base_lrs"])

    usual_whole = fit(lenet(False), trainer(tmp_path / "usual"))
    fit(lenet(False), trainer(tmp_path / "usual_first", callbacks=[StopAfterFirstEpoch()]))
    replayed_ckpt, usual_ckpt = tmp_path / "first" / "last.ckpt", tmp_path / "usual_first" / "last.ckpt"
    into_usual = fit(lenet(False), trainer(tmp_path / "into_usual"), ckpt_path=replayed_ckpt)
    into_replayed = fit(lenet(True), trainer(tmp_path / "into_replayed"), ckpt_path=usual_ckpt)
    assert_close(into_usual, usual_whole, atol=1e-6)
    assert_close(into_replayed, whole, atol=1e-6)


def test_lenet_batches_leave_one_partial_batch_per_epoch() -> None:
    """What the tests above rely on: the epoch's last batch is another shape, which runs eagerly."""
    from lenet_fits import IMAGES

    assert IMAGES % BATCH != 0 and IMAGES // BATCH == 3


class FailAtSecondBatch(Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx == 1:
            raise KeyError("a failure in the middle of an epoch")


class GraphOfThisFit(Callback):
    """Whether each step's graph steps the optimizer of the fit that runs it."""

    def __init__(self) -> None:
        self.own: list[bool] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.own.append(pl_module._step_graph.optimizer is pl_module.optimizers().optimizer)


def test_a_fit_that_failed_leaves_no_graph_to_the_next_fit_of_the_module(tmp_path: Path) -> None:
    model = lenet(True)
    with pytest.raises(KeyError):
        fit(model, trainer(tmp_path / "failed", callbacks=[FailAtSecondBatch()]))
    assert model._step_graph is not None  # no on_train_end ran
    check = GraphOfThisFit()
    fit(model, trainer(tmp_path / "again", callbacks=[check]))
    assert check.own == [True] * 8 and model._step_graph is None


def test_fit_from_the_command_line_replays_with_every_default_callback_and_logs_as_usual(
    tmp_path: Path,
) -> None:
    """`fit --model.cuda_graph=true` with all of fit's callbacks and its logger (eagerly here): the NaN
    guard, the learning-rate monitor reading the tensor lr, the step loss, checkpoints with portable
    optimizer states; the scalars written are those of the usual step's run."""
    runs = {}
    for mode in ("false", "true"):
        root = tmp_path / mode
        args = [*TINY_RUN, "--trainer.max_epochs=2", "--trainer.log_every_n_steps=1"]
        args.append(f"--model.cuda_graph={mode}")
        cli = build_cli(["fit", *args, f"--trainer.default_root_dir={root}"])
        assert cli.model.automatic_optimization is (mode == "false")
        (run_dir,) = run_dirs(root)
        runs[mode] = read_scalars(run_dir)
    usual, replayed = runs["false"], runs["true"]
    assert set(replayed) == set(usual) and any(tag.startswith("lr-") for tag in usual)
    for tag in ("train/loss_step", "val/loss", "val/acc", "lr-AdamW/pg1"):
        assert replayed[tag] == pytest.approx(usual[tag], rel=1e-4, abs=1e-6), tag
