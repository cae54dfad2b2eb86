"""Your networks: plain ``nn.Module`` classes whose first argument is ``num_classes``.

lit_ddp's ``ImageClassifier`` trains any of them (loss, metrics over all ranks, optimizer, schedule):
``--model.net=Net --model.net.width=2`` on the command line, or ``net: {class_path: ...}`` in YAML.
"""

from .net import Net

__all__ = ["Net"]
