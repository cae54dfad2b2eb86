"""The training data path of one lit_ddp checkout, per batch: load from the in-memory Shapes set, then the
data module's on_after_batch_transfer (crop + flip + normalise), on CPU with one thread, no model.

Run it on two checkouts in turn to compare data paths without the model's step (whose timing swamps a
data-path change on a shared 2-core machine):

    for t in /tmp/ab_before /tmp/ab_after2 /tmp/ab_before /tmp/ab_after2; do
        python benchmarks/bench_train_data_path.py $t; done
"""

import sys
import time
from types import SimpleNamespace


def main(tree: str, batches: int = 40, batch_size: int = 128, repeats: int = 3) -> None:
    sys.path.insert(0, tree)
    import torch

    import lit_ddp
    from lit_ddp.data import ShapesDataModule

    assert lit_ddp.__file__.startswith(tree), lit_ddp.__file__
    torch.set_num_threads(1)
    dm = ShapesDataModule(train_size=batch_size * batches, val_size=batch_size, batch_size=batch_size)
    dm.setup("fit")
    loader = dm.train_dataloader()
    dm.trainer = SimpleNamespace(training=True, current_epoch=0, global_rank=0)  # what the hook reads
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for batch in loader:
            dm.on_after_batch_transfer(batch, 0)
        times.append((time.perf_counter() - start) / batches * 1e3)
    print(f"{tree}: ms per batch of {batch_size} (load + augment + normalise):", [round(t, 2) for t in times])


if __name__ == "__main__":
    main(sys.argv[1])
