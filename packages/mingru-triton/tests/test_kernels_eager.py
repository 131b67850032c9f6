"""The eager paths of the recurrence ops (``<family>.recurrence``, the layers') and of the tuple scans
(``<family>.scan``, the dispatch's): the ops' own bodies in a plain ``torch.autograd.Function`` where that
is safe, the ``torch.library`` op everywhere else.

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
from kernel_cases import gates, marked, on_cuda, on_interpreter
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensorMode

pytest.importorskip("mingru_triton.linear")

from mingru_triton import _launch, _recipes, affine, angle, diag, linear, log


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
        """A call that records no graph runs the body alone (no Function node) with the op's bits."""
        module, op, make = FAMILIES[name]
        inputs = make(torch.Generator().manual_seed(1))
        want = op(*inputs)
        leaves = [x.clone().requires_grad_() for x in inputs]
        for args in (inputs, leaves):
            with torch.no_grad():
                got = module.recurrence(*args)
            assert torch.equal(got, want) and got.grad_fn is None and not got.requires_grad
            with torch.inference_mode():
                assert torch.equal(module.recurrence(*args), want)
        got = module.recurrence(*inputs)
        assert torch.equal(got, want) and got.grad_fn is None

    def test_rejects_what_the_op_rejects(self, name: str) -> None:
        module, op, make = FAMILIES[name]
        first, second, state = make(torch.Generator().manual_seed(2))
        bad_state = state[:1]
        with pytest.raises(ValueError) as from_op:
            op(first, second, bad_state)
        with pytest.raises(ValueError) as from_path:
            module.recurrence(first, second, bad_state)
        assert str(from_path.value) == str(from_op.value)


SCANS: dict[str, tuple[Any, Callable[..., Any], Callable[[torch.Generator], tuple[Tensor, ...]]]] = {
    "AffineScan": (affine, affine.affine_scan_fwd, _affine_inputs),
    "LinearScan": (linear, linear.linear_scan_fwd, _linear_inputs),
    "DiagScan": (diag, diag.diag_scan_fwd, _diag_inputs),
}


@marked(on_interpreter)
@pytest.mark.parametrize("used", [(True, True), (True, False), (False, True)], ids=["both", "1st", "2nd"])
@pytest.mark.parametrize("name", list(SCANS))
def test_scan_runs_eagerly_with_the_ops_bits(name: str, used: tuple[bool, bool]) -> None:
    """The scans' eager paths (two outputs, what ``SCAN_IMPLS`` runs): their own Function node, the op's bits
    forward and backward with either output unused (its gradient reaches the adjoint body as None for the
    affine scan, as zeros for the linear and diagonal ones, as with each op's autograd), the body alone
    without grad, and the op's errors."""
    module, op, make = SCANS[name]
    first, second, _ = make(torch.Generator().manual_seed(3))
    gen = torch.Generator().manual_seed(4)
    weights = [torch.randn(out.shape, generator=gen, dtype=torch.float64) for out in op(first, second)]
    results = {}
    for label, fn in (("op", op), ("eager", module.scan)):
        leaves = [x.clone().requires_grad_() for x in (first, second)]
        outs = fn(*leaves)
        picked = [(out, w) for out, w, keep in zip(outs, weights, used, strict=True) if keep]
        grads = torch.autograd.grad([o for o, _ in picked], leaves, [w for _, w in picked])
        results[label] = (type(outs[0].grad_fn).__name__, [o.detach() for o in outs], grads)
    assert results["eager"][0] == f"{name}Backward" != results["op"][0]
    eager, want = results["eager"], results["op"]
    for got, expected in zip([*eager[1], *eager[2]], [*want[1], *want[2]], strict=True):
        assert torch.equal(got, expected)
    with torch.no_grad():
        outs = module.scan(*(x.clone().requires_grad_() for x in (first, second)))
    assert all(o.grad_fn is None for o in outs) and torch.equal(outs[1], want[1][1])
    with pytest.raises(ValueError) as from_op:
        op(first, second[:, :5])
    with pytest.raises(ValueError) as from_path:
        module.scan(first, second[:, :5])
    assert str(from_path.value) == str(from_op.value)


def test_eager_path_passes_an_unused_outputs_gradient_as_none_or_zeros() -> None:
    """A tuple op's Function gives its adjoint body None for an output not used (zeros of its shape with
    ``zero_unused``) and a tensor for one used; a single output's adjoint gets its tensor."""
    seen: list[tuple[Tensor | None, ...]] = []

    def backward(x: Tensor, *grads: Tensor | None) -> tuple[Tensor]:
        seen.append(grads)
        return (sum((g for g in grads if g is not None), torch.zeros_like(x)),)

    pair = _launch.eager_path("Pair", lambda x: (x * 2, x * 3), lambda x: (x * 2, x * 3), backward,
                              lambda inputs, out: (inputs[0],))  # fmt: skip
    single = _launch.eager_path(
        "Single", lambda x: x * 2, lambda x: x * 2, backward, lambda inputs, out: inputs
    )
    x = torch.ones(3, requires_grad=True)
    first, second = pair(x)
    assert type(first.grad_fn).__name__ == "PairBackward"
    (grad,) = torch.autograd.grad(second.sum(), x)
    assert (
        seen[-1][0] is None and torch.equal(seen[-1][1], torch.ones(3)) and torch.equal(grad, torch.ones(3))
    )
    torch.autograd.grad(single(x).sum(), x)
    assert len(seen[-1]) == 1 and torch.equal(seen[-1][0], torch.ones(3))

    def pair_body(x: Tensor) -> tuple[Tensor, Tensor]:
        return x * 2, x * 3

    zeroed = _launch.eager_path(
        "Zeroed", pair_body, pair_body, backward, lambda inputs, out: (inputs[0],), zero_unused=True
    )
    first, _ = zeroed(x)
    torch.autograd.grad(first.sum(), x)
    assert torch.equal(seen[-1][0], torch.ones(3)) and torch.equal(seen[-1][1], torch.zeros(3))


def _plain() -> tuple[Tensor, Tensor]:
    return torch.zeros(2, 3), torch.nn.Parameter(torch.zeros(3))


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


def test_launch_calls_the_kernel_directly_where_wrap_triton_only_passes_it_on() -> None:
    spy = _SpyKernel()
    _launch._run_eagerly(lambda: _launch.launch(spy, (3,), 7, FLAG=1), ())
    assert spy.calls == [((3,), (7,), {"FLAG": 1})]


class _StubDriver:
    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int) -> int:
        return 0


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fresh launch cache whose Triton driver is a stub (no CUDA needed to compute signatures)."""
    fresh = _launch._Launches()
    fresh.driver = _StubDriver()
    fresh.enabled = True
    monkeypatch.setattr(_launch, "_LAUNCHES", fresh)
    return fresh


def _jit_kernel() -> Any:
    import triton

    kernel = linear._pipelined_kernel
    if type(kernel) is not triton.JITFunction:
        pytest.skip("the kernels are interpreted (TRITON_INTERPRET=1): no direct launches")
    return kernel


def test_launch_signature_separates_what_triton_specialises_on(launches: Any) -> None:
    """Two launches share a compiled kernel only where Triton would: same dtypes, tensor alignment, int
    classes (1, multiple of 16, 32/64-bit), None-ness, keyword values; other int values share it."""
    kernel = _jit_kernel()
    x = torch.zeros(64)
    meta = {"BLOCK": 16, "num_warps": 4}

    def key(*args: Any, grid: Any = (4,), **kw: Any) -> Any:
        return launches.key(kernel, grid, args, kw or meta)

    base = key(x, None, 32, 7)
    assert base is not None
    assert key(torch.ones(64), None, 48, 9) == base  # other values of the same kinds
    different = {
        "dtype": key(x.double(), None, 32, 7),
        "alignment": key(x[1:], None, 32, 7),
        "None-ness": key(x, x, 32, 7),
        "int == 1": key(x, None, 1, 7),
        "int % 16": key(x, None, 33, 7),
        "64-bit int": key(x, None, 2**31 + 16, 7),
        "unsigned int": key(x, None, 2**63 + 16, 7),
        "keyword value": key(x, None, 32, 7, BLOCK=32, num_warps=4),
        "keyword name": key(x, None, 32, 7, OTHER=16, num_warps=4),
        "grid rank": key(x, None, 32, 7, grid=(4, 1)),
    }
    for name, other in different.items():
        assert other is not None and other != base, name
    assert key(x, None, 32, 1.5) != base and key(x, None, 32, 1.5) == key(x, None, 32, 2.5)
    assert key(x, None, 32, True) != key(x, None, 32, 1.5)


def test_triton_launches_what_a_signature_cannot_hold(launches: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import triton

    kernel = _jit_kernel()
    x = torch.zeros(8)
    assert launches.key(kernel, lambda meta: (1,), (x,), {}) is None  # a grid function
    assert launches.key(_SpyKernel(), (1,), (x,), {}) is None  # not a @triton.jit kernel
    assert launches.key(kernel, (1,), (x, object()), {}) is None  # an argument of another kind
    hooks = triton.knobs.runtime
    hook = getattr(hooks.launch_enter_hook, "add", None)
    if hook is not None:  # a profiler's launch hook: Triton launches every call
        seen = lambda *args: None  # noqa: E731
        hook(seen)
        try:
            assert launches.key(kernel, (1,), (x,), {}) is None
        finally:
            hooks.launch_enter_hook.remove(seen)
    assert launches.key(kernel, (1,), (x,), {}) is not None
    monkeypatch.setattr(launches, "driver", None)
    assert launches.key(kernel, (1,), (x,), {}) is None  # no launch through Triton has run yet


def test_launch_cache_keeps_the_arguments_after_the_positional_ones(launches: Any) -> None:
    """What a cached launch appends to the positional arguments: the keyword arguments and the defaults, in
    the kernel's parameter order; a compiled result without a launcher is not kept."""
    kernel = _jit_kernel()

    class Compiled:
        run, function, packed_metadata = "launcher", "function", "metadata"

    names = [param.name for param in kernel.params]
    given = len(names) - 3
    meta = {name: index for index, name in enumerate(names[given:])}
    launches.remember(("k",), kernel, Compiled(), given, {**meta, "num_warps": 4})
    assert launches.kernels[("k",)] == ("launcher", "function", "metadata", (0, 1, 2))
    launches.remember(("tensor keyword",), kernel, Compiled(), given, {**meta, names[-1]: torch.zeros(1)})
    launches.remember(("no launcher",), kernel, object(), given, meta)
    assert list(launches.kernels) == [("k",)]


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
        flag_sets = ((False, False, False, False), (True, False, False, False), (True, True, True, False))
        for single, pipelined, backward, split in (*flag_sets, (True, False, False, True)):
            args = (rows, length, dj, v, itemsize, 132, 256, single, pipelined, backward, split)
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


def test_unused_pointers_are_passed_as_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """The forward of the recurrence reads a, b, h0 and writes h: the other pointers of the generic kernel
    are None, so the launch neither inspects nor specialises on them."""
    spy = _SpyKernel()
    monkeypatch.setattr(linear, "_scan_kernel", spy)
    a, b, h0 = torch.rand(2, 37, 5), torch.rand(2, 37, 5), torch.rand(2, 5)
    with linear.force_strategy("sequential"):
        _, h = _launch._run_eagerly(linear.scan_forward, (a, b, h0, 1, False))
    ((_, args, _),) = spy.calls
    names = ("coef", "u", "ux", "init", "hcarry", "xcarry", "hout", "xout", "pout", "prevh", "prevx",
             "prev0", "da", "dinit")  # fmt: skip
    given = {name: arg for name, arg in zip(names, args, strict=False)}
    assert given["coef"] is a and given["u"] is b and given["init"] is h0 and given["hout"] is h
    assert all(given[name] is None for name in names if name not in ("coef", "u", "init", "hout"))


# ---------------------------------------------------------------------------------- direct launches (CUDA)


def _cuda_calls(dtype: torch.dtype) -> list[tuple[str, Callable[[], list[Tensor]]]]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (3, 700, 96)
    a = torch.rand(shape, device="cuda", generator=gen).to(dtype) * 0.5 + 0.5
    b = torch.randn(shape, device="cuda", generator=gen).to(dtype)
    lc = -torch.rand(shape, device="cuda", generator=gen).to(dtype)
    h0 = torch.randn(3, 96, device="cuda", generator=gen).to(dtype)
    grad = torch.randn(shape, device="cuda", generator=gen).to(dtype)

    def both(fn: Callable[..., Tensor], *inputs: Tensor) -> Callable[[], list[Tensor]]:
        def run() -> list[Tensor]:
            leaves = [x.clone().requires_grad_() for x in inputs]
            out = fn(*leaves)
            return [out.detach(), *torch.autograd.grad(out, leaves, grad)]

        return run

    return [
        ("linear", both(linear.recurrence, a, b, h0)),
        ("log", both(log.recurrence, lc, b, h0)),
        ("scan", lambda: list(linear.linear_scan_fwd(a, b))),
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
class TestDirectLaunch:
    pytestmark = on_cuda

    def test_same_bits_as_triton_launches(self, dtype: torch.dtype) -> None:
        """Cached launches and replayed recipes give the bits of Triton's own launches, and the cache is
        used."""
        for name, run in _cuda_calls(dtype):
            with _launch.via_triton():
                want = run()
            # the first fills the launch cache, the second launches from it and records each body's
            # recipe, the others replay it
            for got in [run() for _ in range(4)]:
                for g, w in zip(got, want, strict=True):
                    assert torch.equal(g, w), name
        assert _launch._LAUNCHES.kernels

    def test_launches_skip_tritons_run(self, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
        """With an empty cache each launch of a call goes through Triton once; later calls not at all, unless
        within via_triton."""
        fresh = _launch._Launches()
        fresh.first_launch()
        monkeypatch.setattr(_launch, "_LAUNCHES", fresh)
        _recipes.clear()  # recipes recorded by other tests would launch without the fresh cache
        kernels = {linear._pipelined_kernel, linear._scan_kernel, linear._lookback_kernel}
        counts: dict[Any, int] = {}
        for kernel in kernels:
            run = kernel.run

            def counted(*args: Any, _run: Any = run, _kernel: Any = kernel, **kw: Any) -> Any:
                counts[_kernel] = counts.get(_kernel, 0) + 1
                return _run(*args, **kw)

            monkeypatch.setattr(kernel, "run", counted)
        _, run = _cuda_calls(dtype)[0]
        run()
        before = dict(counts)
        for _ in range(3):
            run()
        assert before and counts == before, (before, counts)
        with _launch.via_triton():
            run()
        assert counts == {kernel: 2 * count for kernel, count in before.items()}

    def test_misaligned_inputs_get_their_own_kernel(self, dtype: torch.dtype) -> None:
        """An input one element past an aligned address (a view at offset 1) must not take the kernel compiled
        for aligned pointers; its result matches the same call on an aligned copy."""
        gen = torch.Generator(device="cuda").manual_seed(3)
        width = 96
        flat = torch.rand(2 * 300 * width + 1, device="cuda", generator=gen).to(dtype) * 0.5 + 0.5
        a = flat[1:].view(2, 300, width)
        assert a.data_ptr() % 16 != 0
        b = torch.randn(2, 300, width, device="cuda", generator=gen).to(dtype)
        h0 = torch.randn(2, width, device="cuda", generator=gen).to(dtype)
        want = linear.recurrence(a.clone(), b, h0)
        got = linear.recurrence(a, b, h0)
        assert torch.equal(got, want)
