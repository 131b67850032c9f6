"""Launch recipes: an op body's launches replayed without its Python, per call site and kind of input.

An eager op body (checks, plan, flags, buffers, one or a few launches) costs 15-60 us of host time per call
on an H200 host, more than the GPU time of a short scan. A :class:`Recipes` of a call site records what the
body does for one kind of input: each buffer it allocates (shape, dtype, zeroed or not) and each launch,
with the compiled kernel's launcher and its arguments, where a tensor argument is one of the body's inputs
or buffers. Later calls with inputs of that kind replay those steps: the same kernels with the same
arguments, so the same bits, for a few microseconds of host time.

A body is recorded under a dispatch mode and kept only when all it runs is known: allocations (``empty``,
``zeros`` and their ``_like`` / ``new_`` forms), ``zero_``, ``detach`` of its own tensors, and direct
launches from the launch cache (:class:`mingru_triton._launch._Launches`) whose tensor arguments are its
inputs or buffers, its outputs being buffers. Anything else (a view, a copy, a launch through Triton) keeps
that kind of input on the body for good. A buffer whose memory an allocation of the body gets again is dead
by then (the caching allocator hands a freed block out at once); the replay lets it go at that step too. The
first call of each kind runs the body alone (it may compile); the second records.

A replay runs where the body would launch directly (an eager op body, no ``torch.compile`` tracing) on CUDA
tensors, each input 16-byte aligned and contiguous (or of a layout the key holds), on the recorded current
device, with no Triton launch hook set and no forcing context of this package active (:func:`overriding`);
elsewhere the body runs. The kind of input is the call site's key (shapes, dtypes) plus the devices;
whatever else a body's launches depend on (module constants, heuristics) is taken as fixed: :func:`clear`
forgets every recipe.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

_ACTIVE = threading.local()
"""``recorder``: the :class:`_Recorder` of the body this thread records, if any."""

_OVERRIDES = [0]
"""How many forcing contexts of this package are active (plans, strategies, plain math, direct Triton
launches): no recipe is recorded or replayed while any is."""

_ALL: list[Recipes] = []

_BOUND: list[Any] = [None]
"""The module :mod:`mingru_triton._launch` (its launch cache ``_LAUNCHES`` and ``direct_launches``), bound
by it through :func:`bind` (it imports this module)."""


def bind(launch_module: Any) -> None:
    _BOUND[0] = launch_module


_DEVICES = ("cuda",)
"""Device types recipes serve (the launch cache's)."""

MAX_KINDS = 256
"""Recipes kept per call site; past it the site forgets them all and starts again."""

_aten = torch.ops.aten
_EMPTY = {_aten.empty.memory_format, _aten.empty_like.default, _aten.new_empty.default}
_ZEROS = {_aten.zeros.default, _aten.zeros_like.default, _aten.new_zeros.default}


@contextlib.contextmanager
def overriding() -> Iterator[None]:
    """Mark a forcing context (a plan, a strategy, plain math, launches through Triton) as active: recipes
    are neither recorded nor replayed within it."""
    _OVERRIDES[0] += 1
    try:
        yield
    finally:
        _OVERRIDES[0] -= 1


def clear() -> None:
    """Forget every recorded recipe (after changing a module constant or heuristic the bodies read)."""
    for recipes in _ALL:
        recipes.kinds.clear()


class _Unrecordable(Exception):
    pass


def _ident(t: Tensor) -> tuple[Any, ...]:
    """What identifies a tensor of a body by value: its address and layout. (Python identity does not: a
    tensor a dispatch mode keeps a reference to reaches the body as a new alias of it.)"""
    return (t.data_ptr(), t.dtype, t.shape, t.stride())


class _Recorder(TorchDispatchMode):
    """Notes a body's allocations (as dispatched ops) and launches (from the launch cache). It keeps no
    reference to what the body allocates (the body would then get aliases of its buffers)."""

    def __init__(self, inputs: Sequence[Tensor]) -> None:
        super().__init__()
        self.inputs = len(inputs)
        self.slot: dict[tuple[Any, ...], int] = {_ident(t): i for i, t in enumerate(inputs)}
        self.like = {(t.shape, t.dtype): i for i, t in reversed(list(enumerate(inputs))) if t.is_contiguous()}
        """A contiguous input of each (shape, dtype): buffers of its kind are allocated like it (cheaper)."""
        self.count = len(inputs)
        self.steps: list[tuple[Any, ...]] = []
        self.failure: str | None = None
        self.device = inputs[0].device

    def fail(self, why: str) -> None:
        if self.failure is None:
            self.failure = why

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func in _EMPTY or func in _ZEROS:
            ident = _ident(out)
            # a buffer of the body at this address and layout is dead (the allocator handed its memory out
            # again): the replay drops it here too, and the address names the new buffer from now on
            dead = self.slot.get(ident)
            if out.device != self.device or not out.is_contiguous() or out.numel() == 0:
                self.fail(f"{func} made a tensor the recipe cannot allocate")
            elif dead is not None and dead < self.inputs:
                self.fail(f"{func} made a tensor at the address of an input")
            else:
                like = self.like.get((out.shape, out.dtype))
                self.steps.append(("alloc", tuple(out.shape), out.dtype, func in _ZEROS, like, dead))
                self.slot[ident] = self.count
                self.count += 1
        elif func is _aten.zero_.default or (func is _aten.fill_.Scalar and args[1] == 0):
            index = self.slot.get(_ident(args[0]))
            if index is None:
                self.fail(f"{func} of a tensor that is neither an input nor a buffer")
            else:
                self.steps.append(("zero", index))
        elif func is not _aten.detach.default or _ident(out) not in self.slot:
            self.fail(f"{func} is not an allocation")
        return out

    def launch(self, entry: tuple[Any, ...], grid: tuple[int, ...], args: Sequence[Any]) -> None:
        """Note a direct launch of the cached ``entry`` (launcher, function, packed metadata, tail)."""
        template = list(args)
        places = []
        for position, arg in enumerate(args):
            if isinstance(arg, Tensor):
                index = self.slot.get(_ident(arg))
                if index is None or arg.data_ptr() % 16:
                    self.fail("a launch took a tensor that is neither an input nor a buffer, or unaligned")
                    return
                places.append((position, index))
                template[position] = None
        size = len(grid)
        grid3 = (grid[0], grid[1] if size > 1 else 1, grid[2] if size > 2 else 1)
        self.steps.append(("launch", *entry, grid3, tuple(template), tuple(places)))

    def outputs(self, result: Any) -> Any:
        """The body's result as slot indices (None kept), or raise :class:`_Unrecordable`."""
        if isinstance(result, Tensor):
            index = self.slot.get(_ident(result))
            if index is None or index < self.inputs:
                raise _Unrecordable("an output is not a buffer of the body")
            return index
        if isinstance(result, tuple):
            return tuple(None if r is None else self.outputs(r) for r in result)
        raise _Unrecordable(f"the body returned a {type(result).__name__}")


class _Recipe:
    """The steps of one recorded body: allocations, zero fills and launches, replayed in order."""

    def __init__(self, steps: list[tuple[Any, ...]], out: Any, device: torch.device) -> None:
        self.steps = steps
        self.out = out
        self.device = device

    def replay(self, inputs: Sequence[Tensor], stream: int) -> Any:
        slots: list[Any] = list(inputs)
        device = self.device
        for step in self.steps:
            kind = step[0]
            if kind == "launch":
                _, launcher, function, packed, tail, grid, template, places = step
                args = list(template)
                for position, index in places:
                    args[position] = slots[index]
                launcher(grid[0], grid[1], grid[2], stream, function, packed, None, None, None, *args, *tail)
            elif kind == "alloc":
                _, shape, dtype, zero, like, dead = step
                if dead is not None:
                    slots[dead] = None  # freed where the body freed it, before this allocation
                if like is not None:
                    slots.append(torch.zeros_like(slots[like]) if zero else torch.empty_like(slots[like]))
                else:
                    make = torch.zeros if zero else torch.empty
                    slots.append(make(shape, dtype=dtype, device=device))
            else:
                slots[step[1]].zero_()
        return self.pick(slots, self.out)

    def pick(self, slots: list[Tensor], out: Any) -> Any:
        if isinstance(out, int):
            return slots[out]
        return tuple(None if o is None else self.pick(slots, o) for o in out)


_SEEN = object()
"""A kind's entry after its first call (the next call records)."""
_BODY = object()
"""A kind's entry when its body cannot be recorded (it always runs)."""


class Recipes:
    """The recipes of one call site, by kind of input: ``recipes.run(body, inputs, key)`` returns
    ``body(*inputs)``, by replay where a recipe of ``key`` (and the inputs' device) exists and the replay's
    conditions hold (module docstring). ``key`` must hold everything about the inputs the body's steps
    depend on besides the device (shapes, dtypes; the caller has checked the inputs are valid). The inputs
    at the positions ``loose`` may have any layout: ``key`` then holds their strides too (a body that
    copies one to make it contiguous is not recorded; one that launches on it as it is, is)."""

    def __init__(self, name: str, loose: tuple[int, ...] = ()) -> None:
        self.name = name
        self.loose = loose
        self.kinds: dict[Any, Any] = {}
        _ALL.append(self)

    def run(self, body: Callable[..., Any], inputs: tuple[Tensor, ...], key: Any) -> Any:
        bound = _BOUND[0]
        launches = bound._LAUNCHES
        device = inputs[0].device
        if device.type not in _DEVICES or _OVERRIDES[0] or not bound.direct_launches():
            return body(*inputs)
        if not launches.replayable():
            return body(*inputs)
        loose = self.loose
        for position, x in enumerate(inputs):
            if x.data_ptr() % 16 or not (x.is_contiguous() or position in loose):
                return body(*inputs)
        current = launches.driver.get_current_device()
        kind = (key, current, device.index)
        recipe = self.kinds.get(kind)
        if type(recipe) is _Recipe:
            return recipe.replay(inputs, launches.driver.get_current_stream(current))
        if recipe is _BODY:
            return body(*inputs)
        if recipe is None:
            if len(self.kinds) >= MAX_KINDS:
                self.kinds.clear()
            self.kinds[kind] = _SEEN
            return body(*inputs)
        return self.record(body, inputs, kind)

    def record(self, body: Callable[..., Any], inputs: tuple[Tensor, ...], kind: Any) -> Any:
        if len({_ident(x) for x in inputs}) < len(inputs):
            return body(*inputs)  # one tensor as two inputs: their slots would be one (a later call records)
        recorder = _Recorder(inputs)
        _ACTIVE.recorder = recorder
        try:
            with recorder:
                result = body(*inputs)
        finally:
            _ACTIVE.recorder = None
        try:
            if recorder.failure is not None:
                raise _Unrecordable(recorder.failure)
            out = recorder.outputs(result)
        except _Unrecordable as why:
            self.kinds[kind] = _BODY
            self.why = str(why)
            return result
        self.kinds[kind] = _Recipe(recorder.steps, out, recorder.device)
        return result

    why = ""
    """Why the last body this site tried to record could not be (for tests and debugging)."""


def device_key(x: Tensor) -> Any:
    """A cheap key of ``x``'s device for input tests (:func:`on_device`), or None where recipes do not serve
    its type: a CUDA tensor's index (a ``torch.device`` per tensor costs more), else the device itself (the
    tests' CPU stand-ins)."""
    if x.is_cuda:
        return x.get_device()
    device = x.device
    return device if device.type in _DEVICES else None


def on_device(x: Tensor, key: Any) -> bool:
    """Whether ``x`` is on the device of :func:`device_key` ``key`` (not None)."""
    if type(key) is int:
        return x.is_cuda and x.get_device() == key
    return x.device == key


def recorder() -> _Recorder | None:
    """The recorder of the body this thread records, if any (the launch cache notes its launches there)."""
    return getattr(_ACTIVE, "recorder", None)


def replayed(
    name: str, kind: Callable[..., Any], loose: tuple[int, ...] = ()
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate an op body ``body(*inputs)`` (tensors in, a tensor or a tuple of tensors and None out) with
    the recipes of its call site: ``kind(*inputs)`` is the key of a valid, common input (shapes, dtype, and
    the strides of the inputs at the positions ``loose``: :class:`Recipes`), or something false where the
    body must run (its checks then name what is wrong)."""

    def wrap(body: Callable[..., Any]) -> Callable[..., Any]:
        recipes = Recipes(name, loose)

        @functools.wraps(body)
        def call(*inputs: Tensor) -> Any:
            key = kind(*inputs)
            if not key:
                return body(*inputs)
            return recipes.run(body, inputs, key)

        call.recipes = recipes  # type: ignore[attr-defined]
        return call

    return wrap
