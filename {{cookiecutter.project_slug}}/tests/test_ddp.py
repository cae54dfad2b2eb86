"""Your model and data under real DDP: 2 CPU processes (gloo), the way a multi-GPU run starts them.

lit_ddp's trust kit checks the promises a DDP run must keep with your code: first-step gradients of 2 × b
equal those of 1 × 2b, validation reports the same metrics on 1 and 2 processes, training shards are
disjoint and cover the data and evaluation has no padded duplicates, augmentation is the same on any
device count, a stop mid-epoch and a resume equal the uninterrupted run, and a seed reproduces a run.
`python -m lit_ddp doctor --config configs/default.yaml` prints the same table for a config.
"""

import pytest
from lit_ddp.models import ImageClassifier
from lit_ddp.testing import check_ddp_invariants

from {{ cookiecutter.package_name }}.data import MyDataModule
from {{ cookiecutter.package_name }}.models import Net


@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_the_network_and_data_keep_the_ddp_invariants(in_tmp) -> None:
    # Small splits; the validation set is odd-sized, so the 2 ranks' evaluation shards are uneven.
    report = check_ddp_invariants(
        model=ImageClassifier(net=Net),
        datamodule=MyDataModule(train_size=512, val_size=101, test_size=8),
    )
    assert report.ok, "\n" + report.table()
