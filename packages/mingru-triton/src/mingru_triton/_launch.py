"""Plumbing shared by every kernel family: one launch helper, dtype rules and cheap input checks.

Every ``torch.library.triton_op`` body here is ``.contiguous()`` + ``empty_like``/``zeros_like`` + one
:func:`launch`. Under ``torch.compile`` and fake tensors the launch goes through ``wrap_triton`` so the op
traces into one graph node. Where ``wrap_triton`` would only pass the call on (an op body running eagerly
on real tensors), the kernel is called directly, which saves building the wrapper on every launch (about
40 us on an H200 host). Real CPU tensors under ``TRITON_INTERPRET=1`` call the kernel directly too, since
torch releases before 2.13 refuse interpreted kernels inside ``wrap_triton``.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor
from torch._library import triton as torch_triton
from torch._subclasses.fake_tensor import is_fake
from torch.autograd.function import once_differentiable
from torch.library import wrap_triton

from mingru.dispatch import ScanFallback, interpret_requested

# False while a triton_op body runs eagerly on real tensors (wrap_triton then calls the kernel itself). A
# torch without these always goes through wrap_triton and the ops.
_wrap_enabled: Callable[[], bool] = getattr(torch_triton, "is_wrap_triton_enabled", lambda: True)
_set_wrap_enabled: Callable[[bool], contextlib.AbstractContextManager[None]] | None = getattr(
    torch_triton, "set_wrap_triton_enabled", None
)


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
    """Launch a ``@triton.jit`` ``kernel`` on ``grid``: through ``wrap_triton`` while tracing, directly when
    ``wrap_triton`` would pass the call on unchanged or for real CPU tensors under the Triton interpreter."""
    if not _wrap_enabled() or _direct(args):
        kernel[grid](*args, **meta)
    else:
        wrap_triton(kernel)[grid](*args, **meta)


_PLAIN = (Tensor, torch.nn.Parameter)


def eager_fast_path(*tensors: Tensor) -> bool:
    """Whether a call may run an op's bodies in a plain ``torch.autograd.Function``, skipping the
    ``torch.library`` dispatch and its autograd wrapper (0.1-0.3 ms of host time per forward+backward on an
    H200 host). Not while ``torch.compile`` traces, under a dispatch mode (fake tensors, ``make_fx``,
    ``FlopCounterMode``), inside a functorch transform, or for tensor subclasses: those calls keep the op."""
    if _set_wrap_enabled is None or torch.compiler.is_compiling():
        return False
    if torch._C._len_torch_dispatch_stack() > 0 or torch._C._are_functorch_transforms_active():
        return False
    return all(type(t) in _PLAIN for t in tensors)


@contextlib.contextmanager
def _eager_launches() -> Iterator[None]:
    """Within the block :func:`launch` calls kernels directly, as inside an eagerly run op body."""
    assert _set_wrap_enabled is not None
    with _set_wrap_enabled(False):
        yield


def eager_path(
    name: str,
    op: Callable[..., Tensor],
    forward: Callable[..., Tensor],
    backward: Callable[..., tuple[Tensor, ...]],
    saved: Callable[[tuple[Tensor, ...], Tensor], tuple[Tensor, ...]],
) -> Callable[..., Tensor]:
    """``op`` (a ``triton_op`` of tensors with one output) with a cheaper eager path: where
    :func:`eager_fast_path` allows, the ``torch.autograd.Function`` ``name`` runs ``forward(*inputs)`` (the
    op's body), saves ``saved(inputs, output)`` and runs ``backward(*saved, grad)`` (its adjoint op's body);
    elsewhere ``op`` itself. Same kernels, so the same bits and errors; no double backward (as the op)."""

    def run_forward(ctx: Any, *inputs: Tensor) -> Tensor:
        with _eager_launches():
            out = forward(*inputs)
        ctx.save_for_backward(*saved(inputs, out))
        return out

    @once_differentiable
    def run_backward(ctx: Any, grad: Tensor) -> tuple[Tensor, ...]:
        with _eager_launches():
            return backward(*ctx.saved_tensors, grad)

    methods = {"forward": staticmethod(run_forward), "backward": staticmethod(run_backward)}
    function: type[torch.autograd.Function] = type(name, (torch.autograd.Function,), methods)

    def call(*inputs: Tensor) -> Tensor:
        if eager_fast_path(*inputs):
            return function.apply(*inputs)
        return op(*inputs)

    return call


def cdiv(x: int, y: int) -> int:
    """ceil(x / y) for ints (a plain function: ``triton.cdiv`` costs microseconds per call on the host)."""
    return -(-x // y)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1), like ``triton.next_power_of_2`` but host-cheap."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def sqrt_chunk(steps: int, base: int) -> int:
    """max(base, isqrt(steps)), the chunk length of the chunked matrix and angle scans. isqrt of a symbolic
    size (``torch.compile(dynamic=True)``) would fix T to its first value; T < (base + 1)^2 is tested first
    instead, a range guard, so one graph serves every such T."""
    if steps < (base + 1) * (base + 1):
        return base
    return math.isqrt(steps)


def is_fp64(x: Tensor) -> int:
    """1 when ``x`` is float64 (the kernel then accumulates in float64), else 0 (float32 accumulation)."""
    return int(x.dtype == torch.float64)


_PLAIN_MATH: list[None] = []


@contextlib.contextmanager
def plain_math() -> Iterator[None]:
    """Within the block the kernels launch with FAST = 0: Triton's own exp and division (tests compare the
    two paths' bits, benchmarks time them)."""
    _PLAIN_MATH.append(None)
    try:
        yield
    finally:
        _PLAIN_MATH.pop()


def fast_math(x: Tensor) -> int:
    """The kernels' FAST flag for inputs like ``x``: 1 where the single-instruction exp and reciprocal of
    :mod:`mingru_triton._math` may run (compiled kernels, float32 accumulation), 0 for float64, under the
    Triton interpreter (no inline assembly there) and within :func:`plain_math`."""
    return int(x.dtype != torch.float64 and not interpret_requested() and not _PLAIN_MATH)


def common_case(
    first: Tensor, same: Sequence[Tensor] = (), state: Tensor | None = None, device_type: str = "cuda"
) -> bool:
    """Whether the inputs are of the common, valid kind: ``first`` a floating tensor (B, T, D) with T >= 1
    on a ``device_type`` device, each of ``same`` a tensor of its shape, dtype and device, and ``state``
    (unless None) a (B, D) tensor of its dtype and device; plain tensors or parameters only. Callers skip
    their detailed checks when it holds: those run only to name what is wrong (and for CPU tensors under
    the interpreter), and cost several microseconds of host time per call."""
    if type(first) not in _PLAIN or first.dtype not in FLOAT_DTYPES or first.dim() != 3:
        return False
    shape, dtype, device = first.shape, first.dtype, first.device
    if device.type != device_type or shape[1] < 1:
        return False
    for x in same:
        if type(x) not in _PLAIN or x.shape != shape or x.dtype != dtype or x.device != device:
            return False
    return state is None or (
        type(state) in _PLAIN
        and state.shape == (shape[0], shape[2])
        and state.dtype == dtype
        and state.device == device
    )


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


_cuda_available = functools.cache(torch.cuda.is_available)


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (cached per device), or :data:`DEFAULT_SMS` off CUDA (fake
    CUDA tensors on a machine without one)."""
    if device.type == "cuda" and _cuda_available():
        return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())
    return DEFAULT_SMS


def grad_or_zeros(grad: Tensor | None, like: Tensor) -> Tensor:
    """An incoming output gradient, or zeros shaped like ``like`` for an output the loss did not use."""
    return torch.zeros_like(like) if grad is None else grad
