"""The network on its own: shapes, and every parameter learns."""

import pytest
import torch
import torch.nn.functional as F

from {{ cookiecutter.package_name }}.models import Net


@pytest.mark.parametrize("num_classes", [3, 10])
@pytest.mark.parametrize("batch_norm", [False, True])
def test_logits_have_one_column_per_class(num_classes: int, batch_norm: bool) -> None:
    net = Net(num_classes=num_classes, batch_norm=batch_norm)
    logits = net(torch.rand(4, 3, 32, 32))
    assert logits.shape == (4, num_classes) and logits.dtype == torch.float32


def test_returns_logits_not_probabilities() -> None:
    # cross_entropy takes logits: a softmax inside the network would make every row sum to 1.
    rows = Net().eval()(torch.rand(8, 3, 32, 32)).sum(dim=1)
    assert not torch.allclose(rows, torch.ones_like(rows))


def test_every_parameter_gets_a_gradient() -> None:
    torch.manual_seed(0)
    net = Net(num_classes=5, width=2, batch_norm=True)
    loss = F.cross_entropy(net(torch.rand(6, 3, 32, 32)), torch.randint(0, 5, (6,)))
    loss.backward()
    for name, param in net.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name
