"""The layers' eager path of the recurrence ops (``<family>.recurrence``): the ops' own bodies in a plain
``torch.autograd.Function`` where that is safe, the ``torch.library`` op everywhere else.

The interpreter tests check that the eager path runs (its ``grad_fn``) and gives the op's bits, forward and
backward; the others check when it must not run (tracing, dispatch modes, functorch, subclasses) and that
the launch helper calls a kernel directly exactly where ``wrap_triton`` would only pass the call on. The last
ones cover the other host-side shortcuts: the common-case input test that lets the bodies skip their
detailed checks, the memoised plans, and None for the pointers a launch does not use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from kernel_cases import gates, on_interpreter
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensorMode

pytest.importorskip("mingru_triton.linear")

from mingru_triton import _launch, affine, angle, diag, linear, log

needs_switch = pytest.mark.skipif(
    _launch._set_wrap_enabled is None, reason="this torch has no set_wrap_triton_enabled: the op always runs"
)


def _linear_inputs(gen: torch.Generator) -> tuple[Tensor, ...]:
    a = gates((2, 37, 5), torch.float64, torch.device("cpu"), generator=gen)
    b = torch.randn(2, 37, 5, generator=gen, dtype=torch.float64)
    return a, b, torch.randn(2, 5, generator=gen, dtype=torch.float64)


def _log_inputs(gen: torch.Generator) -> tuple[Tensor, ...]:
    lc = -torch.rand(2, 37, 5, generator=gen, dtype=torch.float64) * 2
    lb = torch.randn(2, 37, 5, generator=gen, dtype=torch.float64)
    return lc, lb, torch.randn(2, 5, generator=gen, dtype=torch.float64)


def _diag_inputs(gen: torch.Generator) -> tuple[Tensor, ...]:
    a = gates((2, 37, 3, 2), torch.float64, torch.device("cpu"), generator=gen)
    Bm = torch.randn(2, 37, 3, 2, 4, generator=gen, dtype=torch.float64)
    return a, Bm, torch.randn(2, 3, 2, 4, generator=gen, dtype=torch.float64)


def _affine_inputs(gen: torch.Generator) -> tuple[Tensor, ...]:
    A = torch.randn(2, 37, 3, 2, 2, generator=gen, dtype=torch.float64) * 0.5
    Bm = torch.randn(2, 37, 3, 2, 3, generator=gen, dtype=torch.float64)
    return A, Bm, torch.randn(2, 3, 2, 3, generator=gen, dtype=torch.float64)


FAMILIES: dict[str, tuple[Any, Callable[..., Tensor], Callable[[torch.Generator], tuple[Tensor, ...]]]] = {
    "LinearRecurrence": (linear, linear.linear_recurrence_fwd, _linear_inputs),
    "LogRecurrence": (log, log.log_recurrence_fwd, _log_inputs),
    "DiagRecurrence": (diag, diag.diag_recurrence_fwd, _diag_inputs),
    "AffineRecurrence": (affine, affine.affine_recurrence_fwd, _affine_inputs),
}


def _forward_backward(fn: Callable[..., Tensor], inputs: tuple[Tensor, ...]) -> tuple[Any, list[Tensor]]:
    leaves = [x.clone().requires_grad_() for x in inputs]
    out = fn(*leaves)
    grad = torch.linspace(-1.0, 1.0, out.numel(), dtype=out.dtype).reshape(out.shape)
    return out.grad_fn, [out.detach(), *torch.autograd.grad(out, leaves, grad)]


@needs_switch
@pytest.mark.parametrize("name", list(FAMILIES))
class TestEagerPath:
    pytestmark = on_interpreter

    def test_runs_eagerly_with_the_ops_bits(self, name: str) -> None:
        module, op, make = FAMILIES[name]
        inputs = make(torch.Generator().manual_seed(0))
        op_node, op_results = _forward_backward(op, inputs)
        node, results = _forward_backward(module.recurrence, inputs)
        assert type(node).__name__ == f"{name}Backward", type(node).__name__
        assert type(op_node).__name__ != type(node).__name__
        for got, want in zip(results, op_results, strict=True):
            assert torch.equal(got, want)

    def test_without_grad_and_in_inference_mode(self, name: str) -> None:
        module, op, make = FAMILIES[name]
        inputs = make(torch.Generator().manual_seed(1))
        want = op(*inputs)
        with torch.no_grad():
            assert torch.equal(module.recurrence(*inputs), want)
        with torch.inference_mode():
            assert torch.equal(module.recurrence(*inputs), want)

    def test_rejects_what_the_op_rejects(self, name: str) -> None:
        module, op, make = FAMILIES[name]
        first, second, state = make(torch.Generator().manual_seed(2))
        bad_state = state[:1]
        with pytest.raises(ValueError) as from_op:
            op(first, second, bad_state)
        with pytest.raises(ValueError) as from_path:
            module.recurrence(first, second, bad_state)
        assert str(from_path.value) == str(from_op.value)


def _plain() -> tuple[Tensor, Tensor]:
    return torch.zeros(2, 3), torch.nn.Parameter(torch.zeros(3))


@needs_switch
def test_fast_path_takes_plain_tensors_and_parameters() -> None:
    assert _launch.eager_fast_path(*_plain())


def test_fast_path_is_off_while_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not _launch.eager_fast_path(*_plain())


def test_fast_path_is_off_under_a_dispatch_mode() -> None:
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.zeros(2, 3))
        assert not _launch.eager_fast_path(fake)
        assert not _launch.eager_fast_path(torch.zeros(2, 3))


def test_fast_path_is_off_for_subclasses_and_inside_functorch() -> None:
    class Marked(Tensor):
        pass

    assert not _launch.eager_fast_path(torch.zeros(2).as_subclass(Marked))
    seen: list[bool] = []

    def probe(x: Tensor) -> Tensor:
        seen.append(_launch.eager_fast_path(x))
        return (x * x).sum()

    torch.func.grad(probe)(torch.ones(3))
    assert seen == [False]


@pytest.mark.parametrize(
    ("shape", "strategy"), [((2, 4096, 256), "lookback"), ((8, 4096, 1024), "pipelined")]
)
def test_fake_cuda_inputs_take_the_op(shape: tuple[int, int, int], strategy: str) -> None:
    """Under fake tensors the path is the op; its launch goes through ``wrap_triton`` and launches nothing
    (forward and adjoint, on the single-pass kernel and on the pipelined walk)."""
    with FakeTensorMode():
        a = torch.empty(shape, device="cuda")
        h0 = torch.empty(shape[0], shape[2], device="cuda")
        for backward in (False, True):
            assert linear._plan_for(a, 1, True, True, backward).strategy == strategy
        h = linear.recurrence(a, torch.empty_like(a), h0)
        assert h.shape == a.shape and h.device.type == "cuda"
        grads = linear.linear_recurrence_bwd(a, h0, h, torch.empty_like(h))
        assert [g.shape for g in grads] == [a.shape, a.shape, h0.shape]


def _symbolic_int(env: Any, name: str, hint: int) -> Any:
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic

    source = ConstantSource(name)
    symbol = env.create_symbol(hint, source, dynamic_dim=DimDynamic.DYNAMIC)
    return env.create_symintnode(symbol, hint=hint, source=source)


@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
def test_pipelined_walk_fixes_the_channel_count_only_when_concrete(
    symbolic: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The walk's one-warp forward gets D as a compile-time constant (FIXED_DJ) when D is an int; a
    symbolic D (tracing with dynamic shapes) stays a run-time argument (FIXED_DJ = 0). The four-warp
    backward never fixes it."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    fixed: list[tuple[int, int]] = []

    def spy(kernel: Any, grid: Any, *args: Any, **meta: Any) -> None:
        if kernel is linear._pipelined_kernel:
            fixed.append((meta["FIXED_DJ"], meta["num_warps"]))

    monkeypatch.setattr(linear, "launch", spy)
    env = ShapeEnv()
    width: Any = _symbolic_int(env, "D", 1024) if symbolic else 1024
    with FakeTensorMode(shape_env=env):
        a = torch.empty(8, 4096, width, device="cuda")
        h0 = torch.empty(8, width, device="cuda")
        linear.scan_forward(a, a, h0, 1, False)
        linear.scan_backward(a, a, None, a, h0, None, 1, True)
    assert fixed == [(0 if symbolic else 1024, 1), (0, 4)]


def test_sqrt_chunk_is_max_of_base_and_isqrt() -> None:
    import math

    for steps in (*range(0, 5000, 7), 4224, 4225, 16384, 10**6):
        assert _launch.sqrt_chunk(steps, 64) == max(64, math.isqrt(steps))
        assert _launch.sqrt_chunk(steps, 128) == max(128, math.isqrt(steps))


@pytest.mark.parametrize("family", ["angle", "affine"])
def test_chunk_plans_keep_a_symbolic_length(family: str) -> None:
    """Under torch.compile(dynamic=True) the matrix and angle plans see a symbolic T; at T = 40 they guard
    on ranges of T (below the isqrt range of the chunk length), never on its value, so one graph serves
    every such length. (isqrt of a symbolic T fixed T: the angle layer recompiled for each length.)"""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    steps = _symbolic_int(env, "T", 40)
    if family == "angle":
        strategy, chunk = angle._strategy(8, steps, 2, 4, 1, torch.device("cpu"))
    else:
        strategy, chunk = affine._strategy(16, steps)
    assert strategy == "sequential"
    assert isinstance(chunk, torch.SymInt) and not env.replacements, env.replacements
    assert all(g.expr.free_symbols and "Eq" not in str(g.expr) for g in env.guards), env.guards


class _SpyKernel:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return lambda *args, **meta: self.calls.append((grid, args, meta))


@needs_switch
def test_launch_calls_the_kernel_directly_where_wrap_triton_only_passes_it_on() -> None:
    spy = _SpyKernel()
    with _launch._eager_launches():
        _launch.launch(spy, (3,), 7, FLAG=1)
    assert spy.calls == [((3,), (7,), {"FLAG": 1})]


def test_launch_goes_through_wrap_triton_otherwise() -> None:
    """Outside an eagerly run body ``wrap_triton`` takes the call; it accepts only ``@triton.jit`` kernels."""
    spy = _SpyKernel()
    with pytest.raises(RuntimeError, match="triton"):
        _launch.launch(spy, (3,), 7, FLAG=1)
    assert spy.calls == []


# ------------------------------------------------------------------------------------- host-side shortcuts


def test_common_case_holds_only_for_matching_plain_tensors() -> None:
    a, b, h0 = torch.zeros(2, 5, 3), torch.zeros(2, 5, 3), torch.zeros(2, 3)
    assert _launch.common_case(a, (b,), h0, device_type="cpu")
    assert _launch.common_case(torch.nn.Parameter(a), (b,), None, device_type="cpu")
    assert not _launch.common_case(a, (b,), h0)  # CPU tensors: the detailed checks run (interpreter)
    misses = {
        "dtype": (a, (b.double(),), h0),
        "shape": (a, (torch.zeros(2, 6, 3),), h0),
        "state shape": (a, (b,), torch.zeros(3, 2)),
        "state dtype": (a, (b,), h0.half()),
        "integer": (a.int(), (b.int(),), None),
        "rank": (a[0], (b[0],), None),
        "empty T": (a[:, :0], (b[:, :0],), None),
        "not a tensor": (a, ([0.0],), None),
    }
    for name, (first, same, state) in misses.items():
        assert not _launch.common_case(first, same, state, device_type="cpu"), name  # type: ignore[arg-type]
    with FakeTensorMode():
        fake = torch.empty(2, 5, 3, device="cuda")
        assert not _launch.common_case(fake, (fake,))  # a subclass: the detailed checks run


@pytest.mark.parametrize("itemsize", [2, 4, 8])
def test_linear_plans_are_memoised_with_the_forced_strategy_in_the_key(itemsize: int) -> None:
    sizes = [(8, 1024, 1024, 1), (1, 65536, 256, 1), (8, 4096, 1024, 1), (2, 600, 12, 4), (3, 37, 5, 1)]
    for rows, length, dj, v in sizes:
        for single, pipelined, backward in ((False, False, False), (True, False, False), (True, True, True)):
            args = (rows, length, dj, v, itemsize, 132, 256, single, pipelined, backward)
            assert linear.scan_plan(*args) == linear._make_plan(*args, None)
            with linear.force_strategy("chunked", chunk=64):
                forced = linear.scan_plan(*args)
            assert forced == linear._make_plan(*args, ("chunked", 64, None))
            assert forced.strategy == ("chunked" if length > 64 else "sequential")
            assert linear.scan_plan(*args) == linear._make_plan(*args, None)


def test_log_plans_are_memoised_with_the_forced_strategy_in_the_key() -> None:
    for batch, steps, width in [(8, 1024, 1024), (1, 65536, 256), (1, 8192, 2048), (2, 37, 5)]:
        assert log._plan(batch, steps, width) == log._make_plan(batch, steps, width, 132, 256, 4, None)
        for name in ("sequential", "chunked"):
            with log.force_strategy(name):
                forced = log._plan(batch, steps, width)
            assert forced == log._make_plan(batch, steps, width, 132, 256, 4, name)
            assert forced.strategy == name or steps <= 256  # one tile: a single chunk runs sequentially
        assert log._plan(batch, steps, width) == log._make_plan(batch, steps, width, 132, 256, 4, None)


@needs_switch
def test_unused_pointers_are_passed_as_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """The forward of the recurrence reads a, b, h0 and writes h: the other pointers of the generic kernel
    are None, so the launch neither inspects nor specialises on them."""
    spy = _SpyKernel()
    monkeypatch.setattr(linear, "_scan_kernel", spy)
    a, b, h0 = torch.rand(2, 37, 5), torch.rand(2, 37, 5), torch.rand(2, 5)
    with _launch._eager_launches(), linear.force_strategy("sequential"):
        _, h = linear.scan_forward(a, b, h0, 1, False)
    ((_, args, _),) = spy.calls
    names = ("coef", "u", "ux", "init", "hcarry", "xcarry", "hout", "xout", "pout", "prevh", "prevx",
             "prev0", "da", "dinit")  # fmt: skip
    given = {name: arg for name, arg in zip(names, args, strict=False)}
    assert given["coef"] is a and given["u"] is b and given["init"] is h0 and given["hout"] is h
    assert all(given[name] is None for name in names if name not in ("coef", "u", "init", "hout"))
