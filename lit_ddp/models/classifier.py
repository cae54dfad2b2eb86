"""The Lightning system shared by every image classifier: steps, metrics, optimizers.

A network is composed in, not subclassed: ``ImageClassifier(net=...)`` takes a plain ``nn.Module`` class
returning logits, which it builds with the data's number of classes; in YAML that is the network's
``class_path`` (Lightning's backbone example does the same)::

    model:
      class_path: lit_ddp.models.ImageClassifier
      init_args:
        net:
          class_path: my_project.models.Net   # any nn.Module whose first argument is num_classes
          init_args: {width: 64}

The built-in recipes (LeNetCIFAR, ArchClassifier) are subclasses that build their network themselves and
hand the module over. Either way ``ImageClassifier`` owns the network's memory format and compilation.
Every metric is a torchmetrics object updated locally on each rank and reduced once, at epoch end,
over all ranks, so reported values are those of the whole dataset, not of rank 0's shard.
"""

import dataclasses
import functools
import inspect
import math
import sys
import types
import warnings
from collections.abc import Callable, Mapping
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from lightning import LightningModule
from lightning.pytorch.plugins import MixedPrecision
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torchmetrics import MeanMetric, Metric, MetricCollection

from lit_ddp.compat import epoch_cut_short, load_train_dataloader
from lit_ddp.errors import UserError
from lit_ddp.models.accuracy import TopKAccuracy
from lit_ddp.models.optim import OptimConfig, build_optimizer
from lit_ddp.models.step_graph import (
    CUDAGraphMode,
    ReplayedStep,
    StepGraph,
    portable_optimizer_states,
    prepare_for_replay,
    replay_blocker,
)
from lit_ddp.utils import (
    LoadsSavedSubclass,
    accumulation,
    global_batch_size,
    imported,
    later_global_batches,
    optimizer_steps,
    plain_data,
    scheduled_accumulation,
)

STAGES = ("train", "val", "test")

# A network class (or any callable) whose first argument is the number of classes: jsonargparse builds it
# from a YAML ``class_path`` with the other arguments given, and the system calls it with num_classes.
NetFactory = Callable[[int], nn.Module]

# torch.compile's modes: "reduce-overhead" replays the network's forward and backward as CUDA graphs, for
# steps too short to hide their kernel launches (LeNet's on a GPU: docs/gpu.md).
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]

# Packages whose networks have no bug of the user's in their forward: an error in their first batch is the
# data's image size, reported in one line. Any other network's error keeps its traceback.
LIBRARY_NETWORKS = ("lit_ddp", "torchvision", "timm")


def build_metrics(num_classes: int, top_k: tuple[int, ...]) -> MetricCollection:
    """``acc`` (top-1) plus ``acc_top{k}`` for each extra k below num_classes: with k classes or fewer the
    label is always among the top k, and a metric stuck at 1.0 (top-5 of 3 classes) says nothing.

    The update does not check its inputs: the step computes the cross-entropy first, which already rejects
    a label outside [0, num_classes), and the logits' shape is the network's. No compute groups: the
    collection would merge metrics whose states are equal after the first batch, and top-1 and top-5 hit
    counts can be (every top-5 hit a top-1 hit), after which top-5 would report top-1's value.
    """
    metrics = {"acc": TopKAccuracy(top_k=1)}
    for k in top_k:
        if 1 < k < num_classes:
            metrics[f"acc_top{k}"] = TopKAccuracy(top_k=k)
    return MetricCollection(metrics, compute_groups=False)


# torch's layers that normalise over the batch in training (their Lazy* forms and timm's BatchNormAct2d are
# subclasses): they cannot normalise a batch of one image ("Expected more than 1 value per channel").
BATCH_NORM_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
# The line for training batches of one image through such a layer; the testing kit names its own option.
BATCH_OF_ONE = (
    "batch_size=1 with a BatchNorm model: BatchNorm cannot normalise a batch of one image per device; pass"
    " --data.batch_size=2 or more, or a model without BatchNorm"
)


def normalises_over_batch(layer: nn.Module) -> bool:
    """Whether ``layer`` normalises each training batch by its own statistics: a ``BATCH_NORM_TYPES`` layer
    in training mode, or one without running statistics (which uses the batch's in eval mode too). One whose
    statistics are frozen (eval mode, ``freeze_norm_stats``) normalises with those, a single image alike."""
    return isinstance(layer, BATCH_NORM_TYPES) and (layer.training or layer.running_mean is None)


def has_batch_norm(net: nn.Module) -> bool:
    """Whether a layer of ``net`` normalises over the batch as it trains (``normalises_over_batch``)."""
    return any(normalises_over_batch(m) for m in net.modules())


def _batch_norm_on_meta(
    build: Callable[[], nn.Module], holds: Callable[[nn.Module], bool] = has_batch_norm
) -> bool | None:
    """Whether the module ``build`` makes on the meta device holds BatchNorm, as ``holds`` reads it; None
    where it cannot be built so. The constructor runs again for the fit: its warnings are that fit's."""
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return bool(holds(build()))
    except Exception:  # a constructor that reads weights, or wants a device of its own: building it tells
        return None


def fails_on_one(model: object) -> str | None:
    """The line a training batch of one image per device fails with through ``model``, or None: its
    ``batch_of_one_failure()`` (an ImageClassifier's, or its override), else whether it declares
    ``batch_norm_per_device`` (a model of your own may), as fit asks."""
    ask = getattr(model, "batch_of_one_failure", None)
    if callable(ask):
        return ask()
    return BATCH_OF_ONE if getattr(model, "batch_norm_per_device", False) else None


def check_batch_of_one(batch_size: int, model: object) -> None:
    """UserError for training batches of one image per device through a model that fails on them."""
    if batch_size == 1 and (line := fails_on_one(model)) is not None:
        raise UserError(line)


class LossMean(MeanMetric):
    """The sample-weighted mean of batch losses, reduced over ranks like ``MeanMetric``.

    A NaN batch loss makes the mean NaN: ``MeanMetric``'s default drops NaN values with a warning, which
    would report the finite mean of the other batches, and checks every update (a host sync on a GPU).
    Its ``nan_strategy="disable"`` skips the check but also replaces the weights by ones (torchmetrics
    1.9; Lightning-AI/torchmetrics#3434), which would weight a short last batch like a full one.

    Fork of ``torchmetrics.aggregation.MeanMetric``: it drops NaN or checks every update for it, and
    ``nan_strategy="disable"`` weights every batch alike (Lightning-AI/torchmetrics#3434); goes when that
    issue is fixed.
    """

    def update(self, value: Tensor | float, weight: Tensor | float = 1.0) -> None:
        value = torch.as_tensor(value, dtype=self.dtype, device=self.device)
        if not isinstance(weight, Tensor):
            # The step passes the sample count as a Python number: used as a scalar it needs no tensor,
            # whose copy to a GPU torch would synchronise with the device on every step. In place, the
            # count as add_'s alpha: no multiply of its own, no nn.Module.__setattr__ per update.
            self.mean_value.add_(value if value.ndim == 0 else value.sum(), alpha=weight)
            self.weight.add_(weight * value.numel())
            return
        weight = weight.to(dtype=self.dtype, device=self.device).broadcast_to(value.shape)
        self.mean_value += (value * weight).sum()
        self.weight += weight.sum()


TRAIN_STATES_KEY = "lit_ddp_train_metric_states"


def _summed_states(metric: Metric) -> dict[str, Tensor]:
    """The metric's states summed over the ranks (every state here reduces by sum), as CPU tensors."""
    with metric.sync_context(should_unsync=True):
        return {name: value.detach().cpu().clone() for name, value in metric.metric_state.items()}


def _network_class(net: object) -> type | None:
    """The nn.Module class a network factory builds: the class itself, or the one a ``functools.partial``
    holds (a class given with arguments; jsonargparse builds a YAML class_path with init_args as one)."""
    if isinstance(net, type) and issubclass(net, nn.Module):
        return net
    if isinstance(net, functools.partial):
        for part in (net.func, *net.args):
            if (found := _network_class(part)) is not None:
                return found
    return None


def _check_num_classes_first(net: object) -> None:
    """UserError for a network class with a ``num_classes`` argument that is not its first (timm's form:
    ``VisionTransformer(img_size, ..., num_classes=1000)``): ``net(num_classes)`` would hand the number of
    classes to its first argument and leave the head at its own default, a model that trains silently."""
    found = _network_class(net)
    if found is None:
        return
    try:
        names = list(inspect.signature(found).parameters)
    except (TypeError, ValueError):  # a class whose signature Python cannot read: nothing to check
        return
    if "num_classes" in names and names[0] != "num_classes":
        name = f"{found.__module__}.{found.__qualname__}"
        raise UserError(
            f"{name} takes num_classes after {names[0]}: ImageClassifier builds a network as"
            f" Net(num_classes, ...), which would give {names[0]} the number of classes and leave the head"
            f" at its default; give a network whose first argument is num_classes (a subclass with"
            f" `def __init__(self, num_classes: int, **kwargs)`)"
        )


class ImageClassifier(LoadsSavedSubclass, LightningModule):
    """Cross-entropy classifier over ``net``; batches are ``(images, labels)`` already normalised.

    ``net`` is called with ``num_classes`` to build the network (``--model.net=Net``,
    ``--model.net.width=64``); a subclass may pass a module it built itself instead, and then saves its own
    hyperparameters, which are what a checkpoint rebuilds it from.

    ``channels_last`` (on by default, as in ``LeNetCIFAR``: a network composed in here gets the same default
    as the built-in recipe) stores the 4-D weights NHWC and hands the network NHWC image batches: what tensor
    cores want under bf16/fp16, and on CPU what oneDNN's convolutions and max-pooling run fastest on
    (docs/benchmarks.md). Inputs that are not (B, C, H, W) pass unchanged. ``compile`` runs
    ``torch.compile`` on the network, in place, so checkpoints keep their parameter names: ``true`` in its
    default mode, or the mode named (``reduce-overhead``: CUDA graphs).

    ``cuda_graph`` replays the whole training step (forward, loss, backward and the optimizer's update) as
    CUDA graphs (models/step_graph.py), for networks whose step is too short to hide its kernel launches:
    ``true`` on one device (on a CPU it runs the same step eagerly), refusing in one line a run it cannot
    replay (several devices, gradient accumulation or clipping, 16-mixed, SGD, ``compile``); ``auto``
    replays where it can (one CUDA device) and trains as usual elsewhere, saying why on a GPU.

    A checkpoint holds the hyperparameters as plain data (``optim`` as a dict), so ``load_from_checkpoint``
    and ``Trainer.fit(ckpt_path=...)`` read it with torch's weights-only load in any Python process.
    """

    def __init__(
        self,
        net: NetFactory,
        num_classes: int = 10,
        optim: OptimConfig = OptimConfig(name="adamw", lr=3e-3, weight_decay=5e-4),
        label_smoothing: float = 0.0,
        top_k: tuple[int, ...] = (1,),
        channels_last: bool = True,
        compile: bool | CompileMode = False,
        cuda_graph: CUDAGraphMode = False,
    ) -> None:
        super().__init__()
        if not isinstance(compile, bool) and compile not in get_args(CompileMode):
            modes = ", ".join(get_args(CompileMode))
            raise UserError(
                f"--model.compile={compile} is not a torch.compile mode: give true, false or {modes}"
            )
        if not 0.0 <= label_smoothing <= 1.0:  # NaN too; torch would raise at the first training step
            raise UserError(
                f"--model.label_smoothing={label_smoothing} must be between 0 and 1 (0.1 is usual)"
            )
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise UserError(f"num_classes={num_classes!r} must be a whole number of classes, 1 or more")
        if any(k < 1 for k in top_k):  # a k of num_classes or more is left out on purpose (build_metrics)
            raise UserError(
                f"--model.top_k={list(top_k)}: each k must be 1 or more (top-1 and top-5 accuracy: [1,5])"
            )
        if isinstance(net, str):  # as a checkpoint holds a network class given from Python
            net = self._imported_net(net)
        if isinstance(net, dict) and "class_path" in net:  # as it holds a functools.partial of one
            # Arguments read from a file go to a network class only, never to a function.
            found = self._imported_net(net["class_path"], classes_only=True)
            net = functools.partial(found, **net.get("init_args", {}))
        self._net_built_here = not isinstance(net, nn.Module)  # else num_classes did not shape it
        if not isinstance(net, nn.Module):
            _check_num_classes_first(net)
            # Composed: these arguments (the network's class_path and its own) are all a checkpoint needs.
            self.save_hyperparameters()
            net = net(num_classes)
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.net = net.to(memory_format=self.memory_format)
        self.compile_net = compile
        self.cuda_graph = cuda_graph
        self._step_graph: StepGraph | None = None  # captured at the first training batch
        self._replays_for, self._replays = None, False  # _replays_step's decision, and its trainer's id
        self._net_compiled = False
        self._train_epoch_open = False  # training batches were seen since the last training epoch end
        self._accumulated: tuple[int, int] | None = None  # images of the accumulation's first, all batches
        self._loss_weight = 1.0  # the batch's weight in its accumulation's backward (_count_accumulated)
        self._input_fits = False  # a batch went through the network (forward's first-batch check)
        self._grads_checked = False  # the first backward of a fit looked for unused parameters
        self._labels_fit: set[str] = set()  # stages whose first batch's labels were checked (_check_labels)
        self.num_classes = num_classes
        # A checkpoint's hyperparameters hold the config as a dict (on_save_checkpoint): what
        # load_from_checkpoint passes back.
        self.optim = OptimConfig(**optim) if isinstance(optim, dict) else optim
        self.label_smoothing = label_smoothing
        for stage in STAGES:
            # Attributes, not a ModuleDict keyed by stage: "train" would clash with nn.Module.train.
            setattr(self, f"{stage}_metrics", build_metrics(num_classes, top_k).clone(prefix=f"{stage}/"))
            setattr(self, f"{stage}_loss", LossMean())

    @staticmethod
    def _imported_net(name: str, classes_only: bool = False) -> NetFactory:
        """The network class (or factory function) a checkpoint names, from a module already imported: a
        name read from a file imports no code, and is called only if it is an nn.Module class or a function
        written in Python outside the standard library (a crafted checkpoint named ``os.system`` with a
        command as ``num_classes``, and loading it ran the command)."""
        found = imported(name)
        if found is None:
            raise UserError(
                f"the checkpoint's network is {name}, which is not imported: import its module first, or pass"
                " net= yourself"
            )
        network_class = isinstance(found, type) and issubclass(found, nn.Module)
        stdlib = str(getattr(found, "__module__", "")).split(".")[0] in sys.stdlib_module_names
        function = isinstance(found, types.FunctionType) and not stdlib  # subprocess.run is Python too
        if not (network_class or (not classes_only and function)):
            kind = "an nn.Module class" if classes_only else "an nn.Module class or a network function"
            raise UserError(f"the checkpoint's network {name} is not {kind}: pass net= yourself")
        return found

    @property
    def automatic_optimization(self) -> bool:
        # Lightning reads this once the trainer is attached, before any hook of the fit: a replayed step
        # drives the optimizer itself (manual optimisation), every other run is Lightning's usual loop.
        return self._automatic_optimization and not self._replays_step()

    @automatic_optimization.setter
    def automatic_optimization(self, value: bool) -> None:
        self._automatic_optimization = value

    def _replays_step(self) -> bool:
        """Whether this fit runs the training step through ``StepGraph`` (``cuda_graph``)."""
        if self.cuda_graph is False:
            return False
        try:
            trainer = self.trainer
        except RuntimeError:  # not attached to a Trainer: no fit to replay
            return False
        if self._replays_for != id(trainer):  # Lightning reads it several times a step: decided once a fit
            blocked = replay_blocker(trainer, self.optim.name, bool(self.compile_net)) is not None
            # A blocked run: true refuses it in setup; auto trains it as usual.
            on_cuda = trainer.strategy.root_device.type == "cuda"
            self._replays = not blocked and (self.cuda_graph is True or on_cuda)
            self._replays_for = id(trainer)
        return self._replays

    def forward(self, x: Tensor) -> Tensor:
        # A no-op when the batch is already in the network's memory format (the ImageNet loader's are).
        if x.ndim == 4:
            x = x.contiguous(memory_format=self.memory_format)
        if self._input_fits:
            return self.net(x)
        self._check_normalised(x)
        # The first batch: images of a size the network was not built for (64 px into LeNet's 32) fail in
        # torch's matmul with "mat1 and mat2 shapes cannot be multiplied" and a 60-line traceback; a ViT
        # built for one size (torchvision's, timm's) checks it with torch._assert: an AssertionError.
        try:
            logits = self.net(x)
        except (RuntimeError, AssertionError) as err:
            if isinstance(err, torch.OutOfMemoryError):
                raise
            name, size = type(self.net).__name__, "×".join(map(str, x.shape[1:]))
            hint = "give the data the image size the network is built for (--data.image_size)"
            if type(self.net).__module__.split(".")[0] not in LIBRARY_NETWORKS:
                # The user's own network: the error may be a bug in its forward (a torch.cat of the wrong
                # shapes fails the same way), which only its traceback locates. Kept, with the hint beside it.
                if hasattr(err, "add_note"):  # Python 3.11+
                    err.add_note(f"lit_ddp: if {name} is not built for the data's {size} images: {hint}")
                raise
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise UserError(
                f"{name} cannot take the data's {size} images ({first}): {hint}, or choose a network for"
                " this size"
            ) from err
        if not isinstance(logits, Tensor) or logits.ndim != 2 or logits.shape[1] != self.num_classes:
            # A tuple (aux logits) or a dict reached cross_entropy as a TypeError traceback; another head
            # width (1000 outputs for 10 classes) trained silently.
            tensor = isinstance(logits, Tensor)
            got = f"shape {tuple(logits.shape)}" if tensor else f"a {type(logits).__name__}"
            fix = "return one tensor of logits from forward, its last layer with num_classes outputs"
            if tensor and logits.ndim == 2 and not self._net_built_here:
                # A module passed built: its width may be the data's classes, and num_classes the default.
                width, system = logits.shape[1], type(self).__name__
                fix = (
                    f"give {system} num_classes={width} if the data has {width} classes (a network passed"
                    " built is not built from num_classes), else a last layer with num_classes outputs"
                )
            raise UserError(
                f"{type(self.net).__name__} returned {got}, not (batch, num_classes={self.num_classes})"
                f" logits: {fix}"
            )
        self._input_fits = True
        return logits

    def setup(self, stage: str) -> None:
        data = getattr(self.trainer, "datamodule", None)
        if stage == "fit" and hasattr(data, "batch_of_one_fails"):  # lit_ddp's: it asks, it reads no model
            data.batch_of_one_fails = self.batch_of_one_failure
        # Every metric starts empty, in tensors of this process's own: ddp_spawn hands the module to its
        # workers through shared memory, so a CPU state they update in place would also be the launching
        # process's (a later trainer.validate there would count those samples again) and each other's.
        self._reset_metrics(*STAGES)
        self._labels_fit.clear()  # another run may bring other data
        self._accumulated, self._loss_weight = None, 1.0  # an earlier fit that stopped on an error
        self._grads_checked = False  # another fit may run under another strategy
        if stage != "fit" or self.cuda_graph is False:
            return
        self._drop_step_graph()  # an earlier fit of this module that stopped on an error kept its graphs
        blocker = replay_blocker(self.trainer, self.optim.name, bool(self.compile_net))
        on_cuda = self.trainer.strategy.root_device.type == "cuda"
        if blocker is not None and self.cuda_graph is True:
            raise UserError(
                f"--model.cuda_graph=true cannot replay this run's training step: {blocker}; or pass"
                " --model.cuda_graph=auto, which trains such a run without graphs"
            )
        if blocker is not None and on_cuda:
            rank_zero_info(f"lit_ddp: --model.cuda_graph=auto: the step runs without CUDA graphs: {blocker}")
        elif blocker is None and not on_cuda and self.cuda_graph is True:
            rank_zero_info("lit_ddp: --model.cuda_graph=true without a CUDA device: the same step, eagerly")

    @property
    def batch_norm_per_device(self) -> bool:
        """Whether a layer of the network normalises over this device's training batch alone (BatchNorm): it
        cannot train on one image per device (``batch_of_one_failure``). Layers the strategy made synchronised
        (``--trainer.sync_batchnorm`` on several processes) normalise over every device's batch: they carry
        the ``process_group`` they span, and N devices' one-image batches are N images."""
        layers = [m for m in self.modules() if normalises_over_batch(m)]
        if not layers:
            return False
        try:
            several = self.trainer.world_size > 1
        except RuntimeError:  # not attached to a Trainer: one process
            several = False
        return not (several and all(hasattr(m, "process_group") for m in layers))

    def batch_of_one_failure(self) -> str | None:
        """The line a training batch of one image per device fails with, or None where it trains: the data
        module asks as it builds the training loader (once the strategy synchronised the layers), to refuse
        ``batch_size=1`` and to leave out an epoch's last batch of one image per device."""
        return BATCH_OF_ONE if self.batch_norm_per_device else None

    @classmethod
    def batch_norm_in(cls, init_args: Mapping) -> bool | None:
        """Whether the network these constructor arguments build holds a BatchNorm layer, asked before
        anything is built (preflight): a network class given (``--model.net``), or a subclass that builds
        its own network, is built on the meta device, which allocates nothing. None where it cannot be built
        so: a subclass may say so by overriding this."""
        net = init_args.get("net")
        if net is None and cls is not ImageClassifier:  # a subclass of your own that builds its network
            # Asked as the data module asks it, so that an override of batch_of_one_failure holds here too.
            return _batch_norm_on_meta(
                lambda: cls(**init_args), lambda model: model.batch_of_one_failure() is not None
            )
        found = imported(str(net.get("class_path"))) if isinstance(net, Mapping) else None
        if not (isinstance(found, type) and issubclass(found, nn.Module)):
            return None
        return _batch_norm_on_meta(
            lambda: found(init_args.get("num_classes") or 10, **(net.get("init_args") or {}))
        )

    def configure_model(self) -> None:
        # On each rank after launch (a compiled module does not pickle for ddp_spawn), before DDP wraps it.
        if self.compile_net and not self._net_compiled:
            self.net.compile(mode=None if self.compile_net is True else self.compile_net)
            self._net_compiled = True

    def _logits_and_loss(self, x: Tensor, y: Tensor, stage: str = "train") -> tuple[Tensor, Tensor]:
        """``y`` is (B,) class indices, or (B, num_classes) probabilities when the data module mixed the
        training batch (MixUp/CutMix): cross-entropy takes both, label smoothing included."""
        logits = self(x)
        # Label smoothing is a training regulariser; evaluation reports the plain cross-entropy.
        smoothing = self.label_smoothing if stage == "train" else 0.0
        return logits, F.cross_entropy(logits, y, label_smoothing=smoothing)

    def _update_metrics(self, stage: str, logits: Tensor, y: Tensor, loss: Tensor) -> None:
        # A mixed target counts for accuracy as its dominant label (the larger share of the mix).
        labels = y.argmax(dim=-1) if y.ndim == 2 else y
        # No detach (one op each, every step): a metric's update runs with autograd off (torchmetrics'
        # update wrapper, the metric's _enable_grad), so no state keeps the step's graph.
        getattr(self, f"{stage}_metrics").update(logits, labels)
        # Weighting by sample count makes the epoch loss the per-sample mean over the whole dataset,
        # also when the last batch or one rank's shard is smaller.
        getattr(self, f"{stage}_loss").update(loss, weight=y.shape[0])

    def _check_labels(self, y: Tensor, stage: str) -> None:
        """UserError for a stage's first batch holding a label outside [0, num_classes): cross-entropy's
        "Target 3 is out of bounds" traceback on a CPU, a device-side assert that ends the process on CUDA.
        The first batch only, before any graph capture: one read of the labels a stage, not one a step."""
        if stage in self._labels_fit:
            return
        self._labels_fit.add(stage)
        if y.ndim != 1 or y.numel() == 0:  # a mixed (B, num_classes) target: its width is the data module's
            return
        low, high = (int(v) for v in torch.aminmax(y))
        if low < 0 or high >= self.num_classes:
            bad, n = (high if high >= self.num_classes else low), self.num_classes
            raise UserError(
                f"a {stage} batch holds label {bad}, and {type(self).__name__} has num_classes={n} (labels 0"
                f" to {n - 1}): give the model the data's number of classes"
                f" (num_classes={max(high + 1, n)} or more), or labels from 0 to num_classes - 1"
            )

    def _check_normalised(self, images: object) -> None:
        """UserError for images that reach the model as uint8: a lit_ddp data module's loaders yield uint8
        batches that its ``on_after_batch_transfer`` augments and normalises, a hook Lightning calls only for
        the data module given to it. Its loaders given alone failed in the network, named as the wrong image
        size, or on the training batch's third tensor."""
        if isinstance(images, Tensor) and images.dtype == torch.uint8:
            raise UserError(
                f"{type(self).__name__} got uint8 images, not normalised ones: a lit_ddp data module"
                " normalises (and augments) its batches in its on_after_batch_transfer hook, which Lightning"
                " runs only for the data module itself: pass datamodule=dm to the Trainer's fit, validate,"
                " test or predict, not dm.train_dataloader() and the like (a loader of your own: give float"
                " images, normalised)"
            )

    def _shared_step(self, batch: tuple[Tensor, Tensor], stage: str) -> tuple[Tensor, Tensor]:
        """The loss and the (B, num_classes) logits of one batch; updates the stage's metrics."""
        if stage not in self._labels_fit and isinstance(batch, tuple | list) and batch:
            self._check_normalised(batch[0])  # before the unpacking: a raw training batch has 3 tensors
        x, y = batch
        self._check_labels(y, stage)
        logits, loss = self._logits_and_loss(x, y, stage)
        self._update_metrics(stage, logits, y, loss)
        return loss, logits

    def _log_epoch(self, stage: str) -> None:
        """Logs the stage's metric objects once, at epoch end. Lightning computes them there, on every rank
        (``compute()`` all-reduces each metric's states over the ranks, so the values are those of the whole
        dataset), then resets them."""
        name = "train/loss_epoch" if stage == "train" else f"{stage}/loss"  # train/loss_step is per step
        self.log(name, getattr(self, f"{stage}_loss"), prog_bar=stage != "train")
        self.log_dict(getattr(self, f"{stage}_metrics"), prog_bar=stage != "train")

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        if self._replays_step():
            self._check_labels(batch[1], "train")  # before the step is captured as a graph
            return self._replayed_training_step(batch)
        loss, _ = self._shared_step(batch, "train")
        self._count_accumulated(batch[1].shape[0])
        return loss  # the StepLoss callback writes it as train/loss_step every log_every_n_steps

    def _count_accumulated(self, images: int) -> None:
        """Weigh each image of an accumulated step alike, as one batch of all their images does. Lightning
        divides each batch's loss by ``accumulate_grad_batches``: the images of an epoch's short last batch
        then weighed more than the others, and a step the epoch's end cut short (3 batches, 2 accumulated)
        took a fraction of its gradient. Each batch's loss is weighed by its images against the step's first
        batch's here, and the gradients by what the step's batches held in ``on_before_optimizer_step``."""
        if self.trainer.accumulate_grad_batches == 1:
            return
        first, total = self._accumulated or (images, 0)
        self._accumulated = (first, total + images)
        self._loss_weight = images / first

    def backward(self, loss: Tensor, *args, **kwargs) -> None:
        super().backward(loss * self._loss_weight if self._loss_weight != 1.0 else loss, *args, **kwargs)
        if not self._grads_checked:  # once a fit: the first backward tells
            self._grads_checked = True
            self._check_every_parameter_learns()

    def _check_every_parameter_learns(self) -> None:
        """A parameter the loss does not reach fails DDP's next forward in every rank with a long traceback
        (its reducer waits for that gradient), where one device trains on: said here, naming them."""
        wrapper = self.trainer.strategy.model
        if not isinstance(wrapper, DistributedDataParallel) or wrapper.find_unused_parameters:
            return
        if wrapper.static_graph:  # it learns at the first step which parameters take part
            return
        unused = [name for name, p in self.named_parameters() if p.requires_grad and p.grad is None]
        if unused:
            shown = ", ".join(unused[:4]) + (f" and {len(unused) - 4} more" if len(unused) > 4 else "")
            raise UserError(
                f"{shown} took no part in the loss, and DDP waits for every parameter's gradient: use them"
                " in forward, freeze them (requires_grad=False) or remove them, or pass"
                " --trainer.strategy=ddp_find_unused_parameters_true (slower: DDP searches the graph each"
                " step)"
            )

    @torch.no_grad()
    def on_before_optimizer_step(self, optimizer) -> None:
        # Before Lightning clips the gradients: each image of the step then weighs 1 / (the step's images).
        if self._accumulated is None:
            return
        (first, total), self._accumulated, self._loss_weight = self._accumulated, None, 1.0
        factor = self.trainer.accumulate_grad_batches * first / total
        if factor != 1.0:  # a step of whole equal batches, as nearly every one is, is left as it is
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if param.grad is not None:
                        param.grad.mul_(factor)

    def _replayed_training_step(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        """The step as ``StepGraph`` replays it, the update through Lightning's optimizer (its hooks, the
        global step) and the schedule stepped after it, as Lightning does for ``interval: step``."""
        optimizer = self.optimizers()
        if self._step_graph is None:  # after any checkpoint's restore: the graph reads what it restored
            prepare_for_replay(optimizer.optimizer, self.device)
            self._step_graph = StepGraph(self, self._logits_and_loss, optimizer.optimizer, batch)
        x, y = batch
        if self._step_graph.fits(batch):
            logits, loss = self._step_graph.run(batch)
        else:  # another shape (the epoch's last batch): eagerly, into the gradients the update graph reads
            optimizer.zero_grad(set_to_none=False)
            logits, loss = self._logits_and_loss(x, y)
            self.manual_backward(loss)
        self._update_metrics("train", logits, y, loss)
        optimizer.step()
        self.lr_schedulers().step()
        return loss.detach()

    def on_train_end(self) -> None:
        self._drop_step_graph()

    def _drop_step_graph(self) -> None:
        if self._step_graph is not None:  # the graphs hold the step's memory; a later fit captures anew
            self._step_graph.release()
            self._step_graph = None

    def teardown(self, stage: str) -> None:
        self._replays_for = None  # the next fit decides again (a trainer's id can be reused)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        # The logits go to callbacks' on_validation_batch_end (callbacks/confusion.py); Lightning keeps none.
        return self._shared_step(batch, "val")[1].detach()

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._shared_step(batch, "test")

    def on_train_epoch_start(self) -> None:
        # A run resumed mid-epoch gets no epoch start: on_load_checkpoint opens the epoch then. A checkpoint
        # of an epoch cut short, resumed where Lightning starts the next epoch, brings states that are not
        # this epoch's: every epoch starts empty.
        self._reset_metrics("train")
        self._train_epoch_open = True

    def on_train_epoch_end(self) -> None:
        # An epoch that max_steps or max_time cut short is not over: nothing is logged for it, and it stays
        # open, so its checkpoints carry the states and a resumed run logs the whole epoch once, as after a
        # stop signal inside an epoch.
        if epoch_cut_short(self.trainer):
            return
        self._log_epoch("train")
        self._train_epoch_open = False

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # Plain data, so that load_from_checkpoint and Trainer.fit(ckpt_path=...) read the file with torch's
        # weights-only load in any process, not only where lit_ddp's CLI allow-listed its classes.
        hparams = checkpoint.get(self.CHECKPOINT_HYPER_PARAMS_KEY)
        if hparams:
            checkpoint[self.CHECKPOINT_HYPER_PARAMS_KEY] = plain_data(hparams)
        if self._replays_step():
            portable_optimizer_states(checkpoint)
        # A checkpoint inside an epoch (a preemption stop) carries the epoch's training metric states so far,
        # summed over the ranks (every rank runs this hook: the sum is one collective), so the resumed run
        # reports train/* over the whole epoch, not only over the batches after the resume.
        if self._train_epoch_open:
            checkpoint[TRAIN_STATES_KEY] = {
                name: _summed_states(metric) for name, metric in self._train_metric_objects().items()
            }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self._check_optimizer_state_fits(checkpoint)
        states = checkpoint.get(TRAIN_STATES_KEY)
        if not states:
            return
        # Open on every rank: a checkpoint inside this epoch sums the states over the ranks, a collective
        # that every rank must join.
        self._train_epoch_open = True
        if self.global_rank != 0:
            return  # the totals go to one rank: the epoch-end sum over ranks counts them once
        for name, metric in self._train_metric_objects().items():
            saved = states[name]
            if isinstance(metric, TopKAccuracy) and "tp" in saved:  # written when accuracy was torchmetrics'
                saved = TopKAccuracy.states_from_stat_scores(saved)
            for state, value in saved.items():
                setattr(metric, state, value.to(getattr(metric, state).device))

    def _check_optimizer_state_fits(self, checkpoint: dict) -> None:
        """UserError for a fit resumed from a checkpoint whose optimizer state this run's optimizer cannot
        take: another ``name`` (torch's KeyError 'step' traceback as Adam loaded SGD's state), or the
        parameters split into another number of groups (weight decay turned on or off: torch's ValueError)."""
        try:
            fitting = self.trainer.state.fn == TrainerFn.FITTING
        except RuntimeError:  # not attached to a Trainer (load_from_checkpoint): no optimizer to restore
            return
        saved = (checkpoint.get(self.CHECKPOINT_HYPER_PARAMS_KEY) or {}).get("optim")
        if not fitting or not isinstance(saved, dict) or "optimizer_states" not in checkpoint:
            return
        ours = dataclasses.asdict(self.optim)
        keys = ["name"]
        split = lambda c: c.get("weight_decay", 0) > 0 and c.get("no_decay_norm_and_bias", True)  # noqa: E731
        if split(saved) != split(ours):  # param_groups: one group, or decaying weights and the rest
            keys += ["weight_decay", "no_decay_norm_and_bias"]
        shown = lambda v: str(v).lower() if isinstance(v, bool) else v  # noqa: E731
        changed = [
            f"--model.optim.{k}={shown(ours[k])} (the checkpoint's: {shown(saved[k])})"
            for k in keys
            if k in saved and saved[k] != ours[k]
        ]
        if changed:
            raise UserError(
                f"cannot resume {self.trainer.ckpt_path}: its optimizer state does not fit this run's"
                f" optimizer, built with {', '.join(changed)}: resume with the checkpoint's settings"
            )

    def _reset_metrics(self, *stages: str) -> None:
        for stage in stages:
            getattr(self, f"{stage}_metrics").reset()
            getattr(self, f"{stage}_loss").reset()

    def _train_metric_objects(self) -> dict[str, Metric]:
        return {"loss": self.train_loss, **dict(self.train_metrics.items(keep_base=True, copy_state=True))}

    def on_validation_epoch_end(self) -> None:
        self._log_epoch("val")

    def on_test_epoch_end(self) -> None:
        self._log_epoch("test")

    def predict_step(self, batch: tuple[Tensor, Tensor, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """Each sample's (num_classes,) probabilities and predicted class, with its label (-1: none) and its
        index in the predict set (the data module's predict batches carry it: the rows of a writer are put
        back in order by it, whatever rank or batch computed them)."""
        x, y, index = batch
        probs = self(x).softmax(dim=-1)
        return {"index": index, "probs": probs, "pred": probs.argmax(dim=-1), "target": y}

    def configure_optimizers(self):
        trainer = self.trainer
        # inf with --trainer.max_epochs=-1 and no max_steps: only schedules that need no length can run.
        total_steps = trainer.estimated_stepping_batches
        steps_per_epoch = 0
        if self.optim.warmup_epochs > 0 or math.isfinite(total_steps):
            if trainer.train_dataloader is None:  # not loaded when the run has no length (as Lightning)
                load_train_dataloader(trainer)
            steps_per_epoch = math.ceil(trainer.num_training_batches / accumulation(trainer, 0))
        if scheduled_accumulation(trainer) is not None and trainer.max_epochs != -1 and steps_per_epoch:
            # Lightning's estimate takes the Trainer's accumulation, 1 until the scheduler sets an epoch's:
            # each epoch's own, and max_steps, which caps Lightning's estimate.
            total_steps = min(optimizer_steps(trainer, max(trainer.max_epochs, 1)), total_steps)
        # The first epoch's: a GradientAccumulationScheduler that grows the batch later keeps the lr (a
        # growing batch stands for a decaying lr, Smith et al., 2018); a resume scales it as the start did.
        global_batch = global_batch_size(trainer, 0)

        def resumed_at() -> int | None:
            # Where a run of this global batch from the start would stand at the data module's resume point
            # (lit_ddp's data modules know it); after the checkpoint's restore, which calls this.
            point = getattr(trainer.datamodule, "resume_point", None)
            if point is None or not steps_per_epoch:
                return None
            epoch, samples = point
            return optimizer_steps(trainer, epoch) + math.ceil(samples / global_batch_size(trainer, epoch))

        # Lightning's mixed precision (16 and bf16) refuses to clip for a fused optimizer: then no fused step.
        amp = isinstance(trainer.precision_plugin, MixedPrecision)
        clips_under_amp = bool(trainer.gradient_clip_val) and amp
        optimizer, scheduler = build_optimizer(
            self.net,
            self.optim,
            global_batch,
            total_steps,
            steps_per_epoch,
            clips_under_amp=clips_under_amp,
            trained_as=trainer.model,  # FSDP there lays the gradients out its own way
            replayed_on=self.device if self._replays_step() else None,
            resumed_at=resumed_at,
        )
        if self.optim.scale_lr:
            later = later_global_batches(trainer)
            rank_zero_info(
                f"lr scaled by global batch: {self.optim.lr} × {global_batch}/{self.optim.base_batch_size}"
                f" = {optimizer.param_groups[0]['initial_lr']:.4g}"
                + (
                    " (the first epoch's; kept as the GradientAccumulationScheduler changes it)"
                    if later
                    else ""
                )
            )
        schedule = {"scheduler": scheduler, "interval": "step"}
        if isinstance(optimizer, ReplayedStep):
            # The learning-rate monitor's tags as a usual run's (lr-AdamW/pg1), not lr-ReplayedAdamW/pg1.
            schedule["name"] = f"lr-{optimizer.torch_name}"
        return {"optimizer": optimizer, "lr_scheduler": schedule}
