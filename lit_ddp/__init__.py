"""lit_ddp: distributed data-parallel image classification on PyTorch Lightning.

python -m lit_ddp fit                                        # LeNet on the embedded Shapes data, CPU
python -m lit_ddp fit --config configs/lenet_cifar.yaml --trainer.devices=8 --trainer.strategy=ddp
"""

__version__ = "0.3.0"
