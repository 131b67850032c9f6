"""Plumbing shared by every kernel family: one launch helper, dtype rules and cheap input checks.

Every ``torch.library.triton_op`` body here is ``.contiguous()`` + ``empty_like``/``zeros_like`` + one
:func:`launch`. Under ``torch.compile`` and fake tensors the launch goes through ``wrap_triton`` so the op
traces into one graph node. Where ``wrap_triton`` would only pass the call on (an op body running eagerly
on real tensors), the kernel is called directly, which saves building the wrapper on every launch (about
40 us on an H200 host), and a kernel Triton has compiled for the same argument kinds is launched from a
cache (:func:`launch`). Real CPU tensors under ``TRITON_INTERPRET=1`` call the kernel directly too, since
torch releases before 2.13 refuse interpreted kernels inside ``wrap_triton``. Op bodies that run nothing but
allocations and such cached launches are replayed from recipes per kind of input
(:mod:`mingru_triton._recipes`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import triton
from torch import Tensor
from torch._library import triton as torch_triton
from torch._subclasses.fake_tensor import is_fake
from torch.autograd.function import once_differentiable
from torch.library import wrap_triton

from mingru.dispatch import ScanFallback, interpret_requested
from mingru_triton import _recipes

# False while a triton_op body runs eagerly on real tensors (wrap_triton then calls the kernel itself). A
# torch without it always goes through wrap_triton inside the ops.
_wrap_enabled: Callable[[], bool] = getattr(torch_triton, "is_wrap_triton_enabled", lambda: True)

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
DEFAULT_SMS = 132
"""The SM count the shape heuristics assume off CUDA (interpreter, fake CUDA tensors): an H200."""


def _direct(args: Sequence[Any]) -> bool:
    """Whether ``args`` are real CPU tensors under the Triton interpreter (its kernels take them directly)."""
    for arg in args:
        if isinstance(arg, Tensor):
            return arg.device.type == "cpu" and not is_fake(arg) and interpret_requested()
    return False


Grid = tuple[int, ...] | Callable[..., tuple[int, ...]]

_EAGER = threading.local()
"""``on`` is True while this thread runs an op's body eagerly (:func:`_run_eagerly`)."""


_SPARSE: list[int] = []


@contextlib.contextmanager
def sparse_final_states(every: int) -> Iterator[None]:
    """Within the block the single-pass (decoupled look-back) kernels publish a tile's final state only on
    every ``every``-th tile of a chain (tests: the interpreter runs tiles in order, so only then does a
    look-back combine the summaries of the tiles in between)."""
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    _SPARSE.append(every)
    try:
        with _recipes.overriding():
            yield
    finally:
        _SPARSE.pop()


def sparse_every() -> int:
    """The SPARSE constant of a single-pass launch: 1 outside :func:`sparse_final_states`."""
    return _SPARSE[-1] if _SPARSE else 1


def direct_launches() -> bool:
    """Whether :func:`launch` calls CUDA kernels directly here (an op body running eagerly), not through
    ``wrap_triton``."""
    return getattr(_EAGER, "on", False) or not _wrap_enabled()


def launch(kernel: Any, grid: Grid, *args: Any, **meta: Any) -> None:
    """Launch a ``@triton.jit`` ``kernel`` on ``grid``: through ``wrap_triton`` while tracing, directly when
    ``wrap_triton`` would pass the call on unchanged or for real CPU tensors under the Triton interpreter.
    A direct CUDA launch whose argument kinds Triton has compiled before skips Triton's own launch path
    (:class:`_Launches`)."""
    if direct_launches() or _direct(args):
        _LAUNCHES.launch(kernel, grid, args, meta)  # interpreted kernels: Triton's own call
    else:
        wrap_triton(kernel)[grid](*args, **meta)


def _simple(value: object) -> bool:
    return value is None or type(value) in (int, bool, float, str)


class _Launches:
    """Compiled kernels by launch signature, launched without Triton's per-call binding.

    Triton's ``kernel[grid](...)`` binds and specialises every argument, builds the cache key and the launch
    metadata at each call (21 us for the k = 1 walk's 38 arguments on an H200 host, against 9 us for the
    compiled kernel's own launcher). The signature here holds everything Triton specialises on, and more:
    each tensor's dtype and 16-byte alignment; each int's value class (1, a multiple of 16, 32-bit, 64-bit
    signed or unsigned); None, floats and bools by type; the keyword arguments (constexprs and options) by
    name and value; the CUDA device and Triton's debug and instrumentation settings. The first launch of a
    signature goes through Triton (which compiles if it must) and keeps the compiled kernel Triton chose;
    later launches call that kernel's launcher with the same arguments in the same order. Triton launches
    the call itself when a launch hook or pre-run hook is set (profilers), for a grid given as a function,
    an argument of another kind, a Triton release whose launch path was not checked (``SUPPORTED``), and
    within :func:`via_triton`. Triton's check that the module globals a kernel reads have not changed since
    it compiled runs at the first launch of each signature only (the kernels here read none that change).
    """

    SUPPORTED = ((3, 4), (3, 9))
    """The Triton releases (first, last) launched from the cache: ``JITFunction.run`` of 3.4, 3.6 and 3.9
    launches a compiled kernel as :meth:`launch` does (the releases between are taken to match)."""

    def __init__(self) -> None:
        self.kernels: dict[tuple[Any, ...], tuple[Any, Any, Any, tuple[Any, ...]]] = {}
        self.off: list[None] = []
        release = tuple(int(part) for part in triton.__version__.split(".")[:2])
        self.enabled = self.SUPPORTED[0] <= release <= self.SUPPORTED[1]
        self.driver: Any = None

    def launch(self, kernel: Any, grid: Any, args: tuple[Any, ...], meta: dict[str, Any]) -> None:
        key = self.key(kernel, grid, args, meta) if self.enabled and not self.off else None
        if key is None:
            recorder = _recipes.recorder()
            if recorder is not None:
                recorder.fail("a launch through Triton")
            kernel[grid](*args, **meta)
            if self.driver is None and self.enabled and type(kernel) is triton.JITFunction:
                self.first_launch()
            return
        entry = self.kernels.get(key)
        recorder = _recipes.recorder()
        if entry is None:
            self.remember(key, kernel, kernel[grid](*args, **meta), len(args), meta)
            if recorder is not None:
                entry = self.kernels.get(key)
                if entry is None:
                    recorder.fail("a launch Triton's launcher cannot repeat")
                else:
                    recorder.launch(entry, grid, args)
            return
        if recorder is not None:
            recorder.launch(entry, grid, args)
        launcher, function, packed, tail = entry
        size, stream = len(grid), self.driver.get_current_stream(key[1])
        launcher(
            grid[0], grid[1] if size > 1 else 1, grid[2] if size > 2 else 1, stream, function, packed, None,
            None, None, *args, *tail,
        )  # fmt: skip

    def replayable(self) -> bool:
        """Whether launches may skip Triton now: the cache is on, a launch through Triton has made its driver
        active, and no launch hook is set."""
        return self.enabled and not self.off and self.driver is not None and _no_hooks()

    def key(
        self, kernel: Any, grid: Any, args: tuple[Any, ...], meta: dict[str, Any]
    ) -> tuple[Any, ...] | None:
        """The launch signature, or None where Triton must launch the call itself."""
        if type(grid) is not tuple or type(kernel) is not triton.JITFunction or kernel.pre_run_hooks:
            return None
        if not _no_hooks():
            return None
        kinds: list[Any] = []
        add = kinds.append
        for arg in args:
            kind = type(arg)
            if kind is Tensor or kind is torch.nn.Parameter:
                add(arg.dtype)
                add(arg.data_ptr() % 16 == 0)
            elif kind is int:
                add(1 if arg == 1 else (arg % 16 == 0, -(2**31) <= arg < 2**31, arg < 2**63))
            elif arg is None or kind is float or kind is bool:
                add(kind)
            else:
                return None
        if self.driver is None:
            return None  # no launch through Triton yet: its driver is not active
        device = self.driver.get_current_device()
        knobs = triton.knobs
        settings = (knobs.runtime.debug, getattr(knobs.compilation, "instrumentation_mode", None))
        return (kernel, device, len(grid), tuple(kinds), tuple(meta), tuple(meta.values()), settings)

    def remember(
        self, key: tuple[Any, ...], kernel: Any, compiled: Any, given: int, meta: dict[str, Any]
    ) -> None:
        """Keep ``compiled`` (what Triton launched) for ``key`` with the arguments after the ``given``
        positional ones (constexprs and defaults, in the kernel's order)."""
        if not all(_simple(value) for value in meta.values()):
            return
        if not all(hasattr(compiled, name) for name in ("run", "function", "packed_metadata")):
            return
        tail = []
        for param in kernel.params[given:]:
            if param.name in meta:
                tail.append(meta[param.name])
            elif param.has_default:
                tail.append(param.default)
            else:
                return
        self.kernels[key] = (compiled.run, compiled.function, compiled.packed_metadata, tuple(tail))

    def first_launch(self) -> None:
        """Take Triton's active driver (after a launch through Triton has made it active)."""
        from triton.runtime import driver

        self.driver = driver.active


def _idle(hook: Any) -> bool:
    """Whether a Triton launch hook does nothing: None, or an empty hook chain."""
    return hook is None or getattr(hook, "calls", None) == []


def _no_hooks() -> bool:
    """Whether Triton has no launch hook and no stage-inspection hook set (profilers and tools set them)."""
    runtime = triton.knobs.runtime
    if not (_idle(runtime.launch_enter_hook) and _idle(runtime.launch_exit_hook)):
        return False
    return getattr(runtime, "add_stages_inspection_hook", None) is None


_LAUNCHES = _Launches()


@contextlib.contextmanager
def via_triton() -> Iterator[None]:
    """Within the block every direct launch goes through Triton's own ``kernel[grid](...)`` (tests compare
    the two launches' bits, benchmarks time them)."""
    _LAUNCHES.off.append(None)
    try:
        with _recipes.overriding():
            yield
    finally:
        _LAUNCHES.off.pop()


_PLAIN = (Tensor, torch.nn.Parameter)


def eager_fast_path(*tensors: Tensor) -> bool:
    """Whether a call may run an op's bodies eagerly, skipping the ``torch.library`` dispatch and its
    autograd wrapper (0.1-0.3 ms of host time per forward+backward on an H200 host). Not while
    ``torch.compile`` traces, under a dispatch mode (fake tensors, ``make_fx``, ``FlopCounterMode``), inside a
    functorch transform, or for tensor subclasses: those calls keep the op."""
    if torch.compiler.is_compiling():
        return False
    if torch._C._len_torch_dispatch_stack() > 0 or torch._C._are_functorch_transforms_active():
        return False
    return all(type(t) in _PLAIN for t in tensors)


def _run_eagerly(body: Callable[..., Any], inputs: tuple[Any, ...]) -> Any:
    """``body(*inputs)`` with direct launches, as an op's body runs eagerly (:func:`launch` calls kernels
    directly within it)."""
    previous = getattr(_EAGER, "on", False)
    _EAGER.on = True
    try:
        return body(*inputs)
    finally:
        _EAGER.on = previous


def eager_path(
    name: str,
    op: Callable[..., Any],
    forward: Callable[..., Any],
    backward: Callable[..., tuple[Tensor | None, ...]],
    saved: Callable[[tuple[Tensor, ...], Any], tuple[Tensor, ...]],
    zero_unused: bool = False,
) -> Callable[..., Any]:
    """``op`` (a ``triton_op`` of tensors with one output, or a tuple of outputs) with a cheaper eager path:
    where :func:`eager_fast_path` allows, the ``torch.autograd.Function`` ``name`` runs ``forward(*inputs)``
    (the op's body), saves ``saved(inputs, output)`` and runs ``backward(*saved, *grads)`` (its adjoint op's
    body), one grad per output: an unused output of a tuple gives None, or zeros of its shape with
    ``zero_unused`` (as the op's own autograd passes it on or fills it in), the single output of the others
    a tensor. A call that records no graph (grad mode off, or no input requiring grad) runs ``forward``
    alone; elsewhere ``op`` itself. Same kernels, so the same bits and errors; no double backward (as the
    op)."""

    def run_forward(ctx: Any, *inputs: Tensor) -> Any:
        out = _run_eagerly(forward, inputs)
        if type(out) is tuple and not zero_unused:
            ctx.set_materialize_grads(False)
        ctx.save_for_backward(*saved(inputs, out))
        return out

    @once_differentiable
    def run_backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        return _run_eagerly(backward, (*ctx.saved_tensors, *grads))

    methods = {"forward": staticmethod(run_forward), "backward": staticmethod(run_backward)}
    function: type[torch.autograd.Function] = type(name, (torch.autograd.Function,), methods)

    def call(*inputs: Tensor) -> Any:
        if not eager_fast_path(*inputs):
            return op(*inputs)
        if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
            return function.apply(*inputs)
        return _run_eagerly(forward, inputs)

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
        with _recipes.overriding():
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


_recipes.bind(sys.modules[__name__])
