"""Callbacks lit_ddp adds to Lightning's."""

from lit_ddp.callbacks.checkpoint import ModelCheckpoint

__all__ = ["ModelCheckpoint"]
