"""Weight initialisation from an explicit ``torch.Generator``, never from torch's global generator.

Why explicit: torch's layer constructors draw their initial weights from the process-wide generator,
which every thread of a process shares. The aggregator builds supernets in one thread (checkpoints,
the dashboard's evaluations) while another replays a peer's gradient for a spot audit; any draw from
shared state in one shifts the other's numbers. So a supernet is constructed on the ``meta`` device
(shapes only: no memory, no draws), materialised on the CPU, and every parameter and buffer is then
written by the network's ``reset_parameters(generator)`` from a generator seeded by the caller.
:func:`initialise_weights` checks that nothing was left unwritten, so a layer added without an
initialisation rule fails loudly instead of starting from uninitialised memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import nn

__all__ = ["build_initialised", "initialise_weights", "torch_default_", "reset_torch_defaults"]

M = TypeVar("M", bound=nn.Module)

Initialiser = Callable[[nn.Module, torch.Generator], None]

_INTEGER_SENTINEL = -(2**31)  # what an integer buffer holds until an initialiser writes it


def torch_default_(module: nn.Module, generator: torch.Generator) -> None:
    """PyTorch's default initialisation of a convolution, transposed convolution or linear layer (what
    its ``reset_parameters`` draws), from ``generator``: weight Kaiming-uniform with ``a = √5``, bias
    uniform in ``±1/√fan_in``."""
    with torch.no_grad():
        nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5), generator=generator)
        if getattr(module, "bias", None) is not None:
            fan_in, _ = nn.init._calculate_fan_in_and_fan_out(module.weight)
            bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
            nn.init.uniform_(module.bias, -bound, bound, generator=generator)


def reset_torch_defaults(net: nn.Module, generator: torch.Generator) -> None:
    """Every convolution and linear layer of ``net`` by :func:`torch_default_`, batch norms to scale 1,
    shift 0 and fresh statistics: a plain torch network as its constructors would have left it."""
    for module in net.modules():
        if isinstance(module, (nn.modules.conv._ConvNd, nn.Linear)):
            torch_default_(module, generator)
        elif isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.reset_parameters()


def initialise_weights(
    net: nn.Module, generator: torch.Generator, initialise: Initialiser | None = None
) -> nn.Module:
    """Write every parameter and buffer of ``net`` with ``initialise(net, generator)`` (default: the
    network's own ``reset_parameters(generator)``); ``RuntimeError`` naming any tensor it left out.

    Tensors are first filled with NaN (integers with a sentinel), so an omission cannot pass for a
    value. Deterministic: the same generator state gives the same weights, whatever other threads
    do with torch's global generator."""
    tensors = [*net.named_parameters(), *net.named_buffers()]
    with torch.no_grad():
        for _, tensor in tensors:
            tensor.fill_(math.nan if tensor.is_floating_point() else _INTEGER_SENTINEL)
        if initialise is None:
            net.reset_parameters(generator)
        else:
            initialise(net, generator)
    missed = [
        name
        for name, tensor in tensors
        if (tensor.isnan().any() if tensor.is_floating_point() else (tensor == _INTEGER_SENTINEL).any())
    ]
    if missed:
        raise RuntimeError(f"initialisation left {', '.join(missed[:5])} unwritten")
    return net


def build_initialised(
    factory: Callable[[], M], generator: torch.Generator, initialise: Initialiser | None = None
) -> M:
    """``factory()`` constructed on the meta device (its constructors draw nothing), materialised on
    the CPU and initialised by :func:`initialise_weights` from ``generator``. Move it afterwards: the
    weights do not depend on the device."""
    with torch.device("meta"):
        net = factory()
    # as Module.to_empty, whose empty_like on a meta tensor imports sympy first (about 1 s of CPU)
    net = net._apply(lambda t: torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="cpu"))
    for module in net.modules():  # a plain tensor attribute would have stayed on the meta device
        for key, value in vars(module).items():
            if isinstance(value, torch.Tensor) and value.device.type == "meta":
                raise RuntimeError(f"{type(module).__name__}.{key}: a tensor neither parameter nor buffer")
    initialise_weights(net, generator, initialise)
    return net
