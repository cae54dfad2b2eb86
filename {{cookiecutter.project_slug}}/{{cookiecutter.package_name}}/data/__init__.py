"""Your data modules: subclasses of lit_ddp's ``ImageDataModule`` (``--data=MyDataModule``)."""

from .datamodule import MyDataModule

__all__ = ["MyDataModule"]
