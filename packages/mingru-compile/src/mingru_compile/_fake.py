"""Shape, dtype and device propagation on fake tensors: no memory, no kernels, any device."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_flatten, tree_map

from mingru_compile._indexing import GuardFreeIndexing


@dataclass(frozen=True)
class TensorSpec:
    """What a fake run says about one output tensor."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool

    @classmethod
    def of(cls, tensor: Tensor) -> TensorSpec:
        return cls(tuple(tensor.shape), tensor.dtype, tensor.device, tensor.requires_grad)


def fake_output_shapes(
    fn: Callable[..., Any],
    *args: Any,
    kwargs: Mapping[str, Any] | None = None,
    device: torch.device | str | None = None,
    backward: bool = False,
) -> Any:
    """Run ``fn`` under ``FakeTensorMode`` on fake copies of its tensor arguments; describe its outputs.

    Every tensor argument (and, for an ``nn.Module``, every parameter and buffer) is replaced by a
    fake tensor of the same shape, strides, dtype and ``requires_grad``, placed on ``device`` (None:
    the tensor's own device). Fake tensors hold no data, so ``device="cuda"`` works on a CPU-only
    build of PyTorch and sizes far beyond memory cost nothing. Data-dependent Python control flow
    (``.item()``, ``bool(t)``) in ``fn`` raises, as it would break a compiled graph.

    On a device whose runtime is absent (fake CUDA on a machine without CUDA) two parts of PyTorch
    still touch the runtime: autograd records the device's streams (the process aborts), and Python
    indexing sets a device guard (it raises). There the run is a forward under ``torch.no_grad()``
    with every ``requires_grad`` dropped, and indexing is rewritten as the equivalent aten ops
    (see :class:`~mingru_compile._indexing.GuardFreeIndexing`; boolean masks are not supported).

    Args:
        fn: function or module to run.
        *args: its positional arguments.
        kwargs: its keyword arguments.
        device: device of the fake copies.
        backward: also differentiate the sum of the floating outputs that require grad with respect
            to every fake input that requires grad, and check each gradient's shape, dtype and device.

    Returns:
        The output structure of ``fn`` with every tensor replaced by a :class:`TensorSpec`.

    Raises:
        AssertionError: with ``backward``, a gradient whose shape, dtype or device is not its input's.
        ValueError: with ``backward``, no output requires grad, or a device whose runtime is absent.
        Exception: whatever ``fn`` (or its backward) raises on fake tensors.
    """
    target = torch.device(device) if device is not None else None
    module_tensors = [*fn.parameters(), *fn.buffers()] if isinstance(fn, nn.Module) else []
    real_tensors = [t for t in (*tree_flatten((args, kwargs))[0], *module_tensors) if isinstance(t, Tensor)]
    devices = {target} if target is not None else {t.device for t in real_tensors}
    absent = sorted(str(d) for d in devices if not _runtime_present(d))
    if backward and absent:
        raise ValueError(
            f"fake_output_shapes: backward=True needs the runtime of every device, since autograd records "
            f"device streams even for fake tensors; absent here: {absent}"
        )
    grad_enabled = torch.is_grad_enabled() and not absent

    indexing = GuardFreeIndexing() if absent else contextlib.nullcontext()
    with FakeTensorMode(allow_non_fake_inputs=False), torch.set_grad_enabled(grad_enabled), indexing:

        def fake_copy(leaf: Any) -> Any:
            if not isinstance(leaf, Tensor):
                return leaf
            fake = torch.empty_strided(
                leaf.shape,
                leaf.stride(),
                dtype=leaf.dtype,
                device=target if target is not None else leaf.device,
            )
            return fake.requires_grad_(leaf.requires_grad and grad_enabled)

        fake_args, fake_kwargs = tree_map(fake_copy, (list(args), dict(kwargs or {})))
        named = [
            *((f"args[{i}]", a) for i, a in enumerate(fake_args)),
            *((f"kwargs[{k!r}]", v) for k, v in fake_kwargs.items()),
        ]
        if isinstance(fn, nn.Module):
            state = {name: fake_copy(t) for name, t in (*fn.named_parameters(), *fn.named_buffers())}
            out = torch.func.functional_call(fn, state, tuple(fake_args), fake_kwargs)
            named.extend((f"parameter {name}", t) for name, t in state.items())
        else:
            out = fn(*fake_args, **fake_kwargs)
        if backward:
            _check_fake_backward(out, [(n, t) for n, t in named if isinstance(t, Tensor) and t.requires_grad])
        return tree_map(lambda leaf: TensorSpec.of(leaf) if isinstance(leaf, Tensor) else leaf, out)


def _runtime_present(device: torch.device) -> bool:
    """Whether the runtime of ``device`` is usable (cpu, meta, or ``torch.<type>.is_available()``)."""
    if device.type in ("cpu", "meta"):
        return True
    backend = getattr(torch, device.type, None)
    is_available = getattr(backend, "is_available", None)
    return bool(is_available is not None and is_available())


def _check_fake_backward(out: Any, wrt: list[tuple[str, Tensor]]) -> None:
    terms = [
        leaf.sum()
        for leaf in tree_flatten(out)[0]
        if isinstance(leaf, Tensor) and leaf.is_floating_point() and leaf.requires_grad
    ]
    if not terms:
        raise ValueError("fake_output_shapes: backward=True but no output requires grad")
    if not wrt:
        return
    loss = sum(terms[1:], terms[0])
    grads: Sequence[Tensor | None] = torch.autograd.grad(loss, [t for _, t in wrt], allow_unused=True)
    for (name, tensor), grad in zip(wrt, grads, strict=True):
        if grad is None:
            continue
        expected = (tuple(tensor.shape), tensor.dtype, tensor.device)
        received = (tuple(grad.shape), grad.dtype, grad.device)
        if expected != received:
            raise AssertionError(
                f"fake_output_shapes: gradient of {name} has (shape, dtype, device) {received}; "
                f"expected {expected}"
            )
