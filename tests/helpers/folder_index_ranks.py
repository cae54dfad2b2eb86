"""An ImageFolder tree validated on 2 ``ddp_spawn`` ranks, for tests/test_folder_index.py: each rank writes
``rank<N>.json`` in OUT, how often it listed each split and the files it got.

    python -m folder_index_ranks TREE CACHE OUT
"""

import json
import sys
from pathlib import Path

import lightning as L
import torch

from lit_ddp.data import ImageNetDataModule


class RecordScans(L.LightningModule):
    def __init__(self, out: str) -> None:
        super().__init__()
        self.out = out
        self.layer = torch.nn.Linear(1, 1)

    def validation_step(self, batch, batch_idx: int) -> None:
        pass

    def on_validation_end(self) -> None:
        dm = self.trainer.datamodule
        record = {"scans": dm.scans, "files": [p for p, _ in dm.val_set.samples]}
        Path(self.out, f"rank{self.global_rank}.json").write_text(json.dumps(record))


def main(tree: str, cache: str, out: str) -> None:
    dm = ImageNetDataModule(
        data_dir=tree, image_size=16, val_resize=16, batch_size=4, num_workers=0, index_cache=cache
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        limit_val_batches=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    Path(out).mkdir()
    trainer.validate(RecordScans(out), datamodule=dm)


if __name__ == "__main__":
    main(*sys.argv[1:])
