"""Python tensor indexing rewritten as aten ops, for fake tensors of a device whose runtime is absent.

``x[i]`` and ``x[i] = v`` set a device guard before they dispatch, and that guard fails for a fake CUDA
tensor on a machine without CUDA. The same indexing written with ``select``, ``slice``, ``unsqueeze``,
``index`` and ``index_put_`` needs no guard, so :class:`GuardFreeIndexing` rewrites it that way.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode


class GuardFreeIndexing(TorchFunctionMode):
    """Within this mode, ``Tensor.__getitem__`` / ``__setitem__`` run as the equivalent aten ops.

    Supported indices: ints, slices (positive steps), ``None``, ``Ellipsis``, integer tensors and
    sequences of ints, in any combination (advanced indices follow NumPy's placement rules, as
    ``aten.index`` implements them). Boolean masks raise ``NotImplementedError``: their result shape
    depends on the data.
    """

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        if func is Tensor.__getitem__:
            return index_tensor(args[0], args[1])
        if func is Tensor.__setitem__:
            assign_index(args[0], args[1], args[2])
            return None
        return func(*args, **(kwargs or {}))


def index_tensor(x: Tensor, index: Any) -> Tensor:
    """``x[index]`` without a device guard."""
    view, advanced = _apply_basic(x, index)
    return torch.ops.aten.index.Tensor(view, advanced) if advanced else view


def assign_index(x: Tensor, index: Any, value: Any) -> None:
    """``x[index] = value`` without a device guard."""
    view, advanced = _apply_basic(x, index)
    source = value if isinstance(value, Tensor) else torch.full((), value, dtype=x.dtype, device=x.device)
    if advanced:
        torch.ops.aten.index_put_.default(view, advanced, source)
    else:
        view.copy_(source)


def _dims_used(item: Any) -> int:
    return 0 if item is None or item is Ellipsis else 1


def _apply_basic(x: Tensor, index: Any) -> tuple[Tensor, list[Tensor | None]]:
    """Apply the int, slice, None and Ellipsis parts of ``index`` as views; collect the tensor parts.

    Returns the view and, when ``index`` holds tensors, the index list for ``aten.index`` (None for the
    dimensions they leave alone); an empty list otherwise.
    """
    items = index if isinstance(index, tuple) else (index,)
    if sum(item is Ellipsis for item in items) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    used = sum(_dims_used(item) for item in items)
    if used > x.dim():
        raise IndexError(f"too many indices for tensor of dimension {x.dim()}: got {used}")
    ellipsis_dims = x.dim() - used
    advanced: dict[int, Tensor] = {}
    dim = 0
    for item in items:
        if item is None:
            x = x.unsqueeze(dim)
            dim += 1
        elif item is Ellipsis:
            dim += ellipsis_dims
        elif isinstance(item, slice):
            step = 1 if item.step is None else operator.index(item.step)
            x = torch.ops.aten.slice.Tensor(x, dim, item.start, item.stop, step)
            dim += 1
        elif isinstance(item, Tensor) or (isinstance(item, Sequence) and not isinstance(item, str)):
            tensor = torch.as_tensor(item)
            if tensor.dtype in (torch.bool, torch.uint8):
                raise NotImplementedError("boolean mask indexing depends on the data; it has no fake shape")
            advanced[dim] = tensor
            dim += 1
        elif isinstance(item, bool):
            raise NotImplementedError(f"indexing with a Python bool ({item}) is not supported")
        else:
            x = x.select(dim, operator.index(item))
    if not advanced:
        return x, []
    return x, [advanced.get(d) for d in range(max(advanced) + 1)]
