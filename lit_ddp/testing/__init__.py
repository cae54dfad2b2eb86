"""The trust kit: check that your model and data module keep lit_ddp's DDP promises, from pytest.

    from lit_ddp.testing import check_ddp_invariants

    def test_my_model_trains_the_same_on_any_device_count():
        report = check_ddp_invariants(model=MyModel(), datamodule=MyData(train_size=512))
        assert report.ok, report.table()

It runs small fits and validations on CPU with 2 gloo processes and with 1 (wall times: docs/benchmarks.md)
and checks:

- first-step gradients 2×b = 1×2b: two processes with per-device batch b compute the gradients one process
  computes with batch 2b, to 1e-4 in ‖Δg‖/‖g‖ (README: what "the same model" means); where they, or the
  weights below, differ with no cause in the records, the two fits run again in float64, whose rows then
  show (float32 rounds 2 × b and 1 × 2b otherwise, which can tip a ReLU or max-pool: as large as a bug);
- weights after each step 2×b = 1×2b, ranks alike: the weights and buffers after every checked step, to
  1e-3 in ‖Δw‖/‖w − w₀‖, the optimizer's settings (learning rate, ...) at each step, and the ranks' weights
  and buffers against each other at the end, exactly;
- samples same on each rank, run and device count: a hash of the un-augmented sample each index returns,
  read twice in each process, on each rank, in two runs of the same seed and on 1 process;
- validation metrics 1 = 2 processes: every metric a 2-process validation logs (``val/acc``,
  ``val_acc``, whatever its name) equals the 1-process one, on every rank;
- training shards disjoint and covering, evaluation unpadded: the ranks' training samples do not overlap
  and together are the whole set; every validation sample is read exactly once; by index and by content;
- augmentation same on any device count: each sample reaches the training step byte-identical on 1 and 2
  processes (MixUp/CutMix are left out: they pair samples within one device's batch);
- stop mid-epoch or at an epoch's end + resume = uninterrupted: a 2-process fit stopped after its first
  step, inside its epoch and (with one-step epochs) at the epoch's end, and resumed from its checkpoint
  ends with the uninterrupted fit's weights, exactly;
- same seed twice = identical: weights and augmented batches.

A failing row names the cause the evidence points to (a loss summed, not averaged; an attribute outside
``state_dict`` that training changes; a buffer updated per rank; a draw from torch's global RNG in forward;
a split that differs between ranks or runs) and the fix. It also warns (a row of the report, and a
``DDPInvariantWarning``), with the measured number, about BatchNorm without SyncBatchNorm at a per-device
batch under 32, a training-set size that leaves padded duplicates on 2, 4, 8 (or ``devices``) processes,
and randomness the data path takes from the global RNGs (judged only when two unperturbed runs agree;
it fails the resume check too: a checkpoint does not hold those RNGs' state).

``report.ok`` is True when every check holds (warnings aside); ``report["augmentation same on any device
count"]`` is one row (``holds``, ``measured``, ``fix``); ``report.table()`` prints check | holds? |
measured | what to change, then the runs' seed. ``python -m lit_ddp doctor --config my.yaml`` runs the
same on a config; ``kit_settings(config)`` gives a test the arguments doctor takes from it (seed,
SyncBatchNorm, accumulation, clipping, unused-parameter search, device count).

The model and data module travel to the ranks pickled by value (cloudpickle): their classes may live in a
script, a notebook or a test function.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lit_ddp.testing.checks import DDPInvariantWarning, Report, Row, check_ddp_invariants
    from lit_ddp.testing.config import build, instantiate, kit_settings, resolved_config
    from lit_ddp.testing.conflicts import conflict_markers

# Each name from its module when first read: `python -m lit_ddp.testing.conflicts` (a project's .ci/run)
# then runs without importing torch and Lightning, and without runpy's warning about a module the package
# imported before running it as __main__.
_MODULES = {
    "DDPInvariantWarning": "checks",
    "Report": "checks",
    "Row": "checks",
    "check_ddp_invariants": "checks",
    "build": "config",
    "instantiate": "config",
    "kit_settings": "config",
    "resolved_config": "config",
    "conflict_markers": "conflicts",
}


def __getattr__(name: str):
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
    globals()[name] = value
    return value


__all__ = [
    "DDPInvariantWarning",
    "Report",
    "Row",
    "build",
    "check_ddp_invariants",
    "conflict_markers",
    "instantiate",
    "kit_settings",
    "resolved_config",
]
