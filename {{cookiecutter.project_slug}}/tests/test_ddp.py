"""Your model and data under real DDP: 2 CPU processes (gloo), the way a multi-GPU run starts them.

lit_ddp's trust kit checks the promises a DDP run must keep with your code: first-step gradients of 2 × b
equal those of 1 × 2b, and so do the weights and buffers after each step (the ranks' identical at the end),
each index returns the same sample on every rank, run and device count, validation reports the same metrics
on 1 and 2 processes, training shards are disjoint and cover the data and evaluation has no padded
duplicates, augmentation is the same on any device count, a stop (mid-epoch or at an epoch's end) and a
resume equal the uninterrupted run, and a seed reproduces a run. A failing row names the cause and the fix.
The project's `doctor` command (`python -m` the package, then `doctor --config configs/default.yaml`) prints
the same table for any config.
"""

import pytest
from lit_ddp.testing import build, check_ddp_invariants, kit_settings


@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_the_network_and_data_keep_the_ddp_invariants(default_config: dict, in_tmp) -> None:
    # The kit runs on the head of each split, with configs/default.yaml's model, data, seed and the trainer
    # settings the run trains with (SyncBatchNorm, gradient accumulation and clipping), as doctor does.
    model, data = build(default_config)
    report = check_ddp_invariants(model, data, **kit_settings(default_config))
    assert report.ok, "\n" + report.table()
