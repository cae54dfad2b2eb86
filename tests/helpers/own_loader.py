"""A data module that builds its own loaders with ``self.loader`` and other DataLoader arguments
(test_own_loader.py runs it on 1 and 2 processes against ShapesDataModule itself)."""

from lit_ddp.data import ShapesDataModule


class TunedLoaders(ShapesDataModule):
    def train_dataloader(self):
        return self.loader(self.train_set, train=True, num_workers=1, prefetch_factor=4, pin_memory=False)

    def val_dataloader(self):
        # prefetch_factor without workers is left out, as torch refuses it then
        return self.loader(self.val_set, num_workers=0, prefetch_factor=4, persistent_workers=True)
