"""Plumbing shared by every kernel family: one launch helper, dtype rules and cheap input checks.

Every ``torch.library.triton_op`` body here is ``.contiguous()`` + ``empty_like``/``zeros_like`` + one
:func:`launch`. Under ``torch.compile`` and fake tensors the launch goes through ``wrap_triton`` so the op
traces into one graph node; real CPU tensors under ``TRITON_INTERPRET=1`` call the kernel directly, since
torch releases before 2.13 refuse interpreted kernels inside ``wrap_triton``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake
from torch.library import wrap_triton

from mingru.dispatch import ScanFallback, interpret_requested

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
DEFAULT_SMS = 132
"""The SM count the shape heuristics assume off CUDA (interpreter, fake CUDA tensors): an H200."""


def _direct(args: Sequence[Any]) -> bool:
    if not interpret_requested():
        return False
    for arg in args:
        if isinstance(arg, Tensor):
            return arg.device.type == "cpu" and not is_fake(arg)
    return False


Grid = tuple[int, ...] | Callable[..., tuple[int, ...]]


def launch(kernel: Any, grid: Grid, *args: Any, **meta: Any) -> None:
    """Launch a ``@triton.jit`` ``kernel`` on ``grid``: through ``wrap_triton`` (traceable), or directly
    for real CPU tensors under the Triton interpreter."""
    if _direct(args):
        kernel[grid](*args, **meta)
    else:
        wrap_triton(kernel)[grid](*args, **meta)


def cdiv(x: int, y: int) -> int:
    """ceil(x / y) for ints (a plain function: ``triton.cdiv`` costs microseconds per call on the host)."""
    return -(-x // y)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1), like ``triton.next_power_of_2`` but host-cheap."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def is_fp64(x: Tensor) -> int:
    """1 when ``x`` is float64 (the kernel then accumulates in float64), else 0 (float32 accumulation)."""
    return int(x.dtype == torch.float64)


def ensure(condition: bool, message: str) -> None:
    """Raise ``ScanFallback(message)`` unless ``condition``: the envelope check of the SCAN_IMPLS wrappers."""
    if not condition:
        raise ScanFallback(message)


def on_kernel_device(x: Tensor) -> bool:
    """Whether a kernel can take ``x``: a CUDA tensor, or a CPU tensor under ``TRITON_INTERPRET=1``."""
    return x.device.type == "cuda" or (x.device.type == "cpu" and interpret_requested())


@functools.cache
def _cuda_sms(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (cached per device), or :data:`DEFAULT_SMS` off CUDA."""
    if device.type == "cuda" and torch.cuda.is_available():
        return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())
    return DEFAULT_SMS


def grad_or_zeros(grad: Tensor | None, like: Tensor) -> Tensor:
    """An incoming output gradient, or zeros shaped like ``like`` for an output the loss did not use."""
    return torch.zeros_like(like) if grad is None else grad
