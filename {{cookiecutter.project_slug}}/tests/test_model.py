"""Your network on its own, as configs/default.yaml builds it: shapes, logits, and every parameter learns."""

import pytest
import torch
import torch.nn.functional as F
from lit_ddp.testing import build


def model_and_input(config: dict, num_classes: int, batch: int):
    """The config's model built for ``num_classes``, and a random batch shaped like its data's images."""
    model, data = build(config, num_classes=num_classes)
    data.setup("fit")
    image, _ = data.train_set[0]
    return model, torch.rand(batch, *image.shape)


@pytest.mark.parametrize("num_classes", [3, 10])
def test_logits_have_one_column_per_class(default_config: dict, num_classes: int) -> None:
    model, x = model_and_input(default_config, num_classes, batch=4)
    logits = model(x)
    assert logits.shape == (4, num_classes) and logits.dtype == torch.float32


def test_returns_logits_not_probabilities(default_config: dict) -> None:
    # cross_entropy takes logits: a softmax inside the network would make every row sum to 1.
    model, x = model_and_input(default_config, 10, batch=8)
    rows = model.eval()(x).sum(dim=1)
    assert not torch.allclose(rows, torch.ones_like(rows))


def test_every_parameter_gets_a_gradient(default_config: dict) -> None:
    torch.manual_seed(0)
    model, x = model_and_input(default_config, 5, batch=6)
    loss = F.cross_entropy(model(x), torch.randint(0, 5, (6,)))
    loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name
