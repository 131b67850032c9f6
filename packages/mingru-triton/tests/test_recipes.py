"""Launch recipes (``mingru_triton._recipes``): a body's allocations and launches recorded once per kind of
input and replayed without the body.

On CPU a stand-in launch cache and launcher take the place of CUDA's (the launcher computes in NumPy with
dispatch modes off: no mode sees a kernel's work). The CUDA tests at the end compare the recorded
ops' bits with Triton's own launches.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from kernel_cases import gates, marked, on_cuda, on_interpreter
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

pytest.importorskip("mingru_triton.linear")

from mingru.scans.angle import default_angle_layout
from mingru_triton import _launch, _recipes, affine, angle, gated, linear, log


class _Driver:
    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int) -> int:
        return 0


def _add_launcher(g0: int, g1: int, g2: int, stream: int, fn: Any, packed: Any, *rest: Any) -> None:
    """A stand-in compiled launcher: out = (x + y) * scale + flag[0]; flag[0] += 1 (a buffer the body
    zeroes). Its work is hidden from dispatch modes, as a kernel's is."""
    x, y, out, flag, scale = rest[3:]
    with _disable_current_modes():
        flag_np = flag.numpy()
        out.numpy()[...] = (x.numpy() + y.numpy()) * scale + flag_np[0]
        flag_np[0] += 1


ENTRY = (_add_launcher, "function", "packed", (2,))


@pytest.fixture
def fake_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """CPU tensors served as CUDA ones are: the launch cache on, a driver, direct launches."""
    monkeypatch.setattr(_recipes, "_DEVICES", ("cpu",))
    monkeypatch.setattr(_launch._LAUNCHES, "enabled", True)
    monkeypatch.setattr(_launch._LAUNCHES, "driver", _Driver())
    monkeypatch.setattr(_launch._LAUNCHES, "off", [])
    previous = getattr(_launch._EAGER, "on", False)
    _launch._EAGER.on = True
    try:
        yield
    finally:
        _launch._EAGER.on = previous


def _launch_add(x: Tensor, y: Tensor, out: Tensor, flag: Tensor) -> None:
    recorder = _recipes.recorder()
    if recorder is not None:
        recorder.launch(ENTRY, (1,), (x, y, out, flag))
    _add_launcher(1, 1, 1, 0, "function", "packed", None, None, None, x, y, out, flag, 2)


def _make_site(body_extra: Any = None) -> tuple[Any, list[int]]:
    calls = [0]

    @_recipes.replayed("test add", lambda x, y: x.shape == y.shape and (x.shape, x.dtype))
    def add(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor | None]:
        calls[0] += 1
        out = torch.empty_like(x)
        flag = torch.zeros(1, dtype=torch.float32)
        if body_extra is not None:
            body_extra(x, y, out, flag)
        _launch_add(x, y, out, flag)
        return out, None

    return add, calls


def test_the_third_call_replays_the_recorded_steps(fake_cache: None) -> None:
    add, calls = _make_site()
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    outs = [add(x, y)[0] for _ in range(2)]
    assert calls[0] == 2
    x2, y2 = torch.randn(3, 4), torch.randn(3, 4)
    out, none = add(x2, y2)
    assert calls[0] == 2, "the third call ran the body"
    assert none is None
    # the zeroed flag is a fresh zero buffer at each replay: 0 added, as in the body
    torch.testing.assert_close(out, (x2 + y2) * 2, rtol=0, atol=0)
    assert all(out.data_ptr() != o.data_ptr() for o in outs)
    add(torch.randn(5, 4), torch.randn(5, 4))  # another kind: the body runs
    assert calls[0] == 3


def test_a_body_with_other_ops_is_never_replayed(fake_cache: None) -> None:
    add, calls = _make_site(lambda x, y, out, flag: x.add(1))
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    for _ in range(4):
        add(x, y)
    assert calls[0] == 4
    assert "add" in add.recipes.why


def test_a_launch_of_a_tensor_from_elsewhere_is_not_recorded(fake_cache: None) -> None:
    stray = torch.zeros(3, 4)

    @_recipes.replayed("test stray", lambda x: (x.shape, x.dtype))
    def body(x: Tensor) -> Tensor:
        out = torch.empty_like(x)
        _launch_add(x, stray, out, torch.zeros(1))
        return out

    x = torch.randn(3, 4)
    for _ in range(3):
        body(x)
    assert "neither an input nor a buffer" in body.recipes.why


def test_an_output_that_is_an_input_is_not_recorded(fake_cache: None) -> None:
    @_recipes.replayed("test echo", lambda x: (x.shape, x.dtype))
    def echo(x: Tensor) -> Tensor:
        return x

    x = torch.randn(2)
    for _ in range(3):
        assert echo(x) is x
    assert "not a buffer" in echo.recipes.why


def test_replays_need_contiguous_inputs_and_no_forcing_context(fake_cache: None) -> None:
    add, calls = _make_site()
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    add(x, y), add(x, y)
    count = calls[0]
    xt = torch.randn(3, 4).t()
    add(xt, y)
    assert calls[0] == count + 1
    with _recipes.overriding():
        add(x, y)
    assert calls[0] == count + 2
    with _launch.via_triton():
        add(x, y)
    assert calls[0] == count + 3
    add(x, y)
    assert calls[0] == count + 3


def test_one_tensor_as_two_inputs_is_not_recorded(fake_cache: None) -> None:
    add, calls = _make_site()
    x = torch.randn(3, 4)
    for _ in range(4):
        torch.testing.assert_close(add(x, x)[0], x * 4, rtol=0, atol=0)
    assert calls[0] == 4
    y = torch.randn(3, 4)
    add(x, y), add(x, y)  # distinct inputs of that kind: recorded, then replayed
    assert calls[0] == 5


def test_clear_forgets_every_recipe(fake_cache: None) -> None:
    add, calls = _make_site()
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    for _ in range(3):
        add(x, y)
    assert calls[0] == 2
    _recipes.clear()
    add(x, y)
    assert calls[0] == 3


def test_a_loose_input_may_have_any_layout_and_is_never_allocated_like(fake_cache: None) -> None:
    """An input at a ``loose`` position reaches the recipe in the layout its key holds; buffers of its shape
    are allocated contiguous (never ``empty_like`` of it, which would keep its strides)."""
    calls = [0]

    @_recipes.replayed("test loose", lambda x, y: (x.shape, x.stride(), y.shape), loose=(1,))
    def add(x: Tensor, y: Tensor) -> Tensor:
        calls[0] += 1
        out = torch.empty(y.shape, dtype=y.dtype)
        _launch_add(x, y, out, torch.zeros(1))
        return out

    x = torch.randn(4, 6)
    ys = [torch.randn(6, 4).t() for _ in range(3)]
    outs = [add(x, y) for y in ys]
    assert calls[0] == 2, "the third call ran the body"
    for y, out in zip(ys, outs, strict=True):
        assert out.is_contiguous()
        torch.testing.assert_close(out, (x + y) * 2, rtol=0, atol=0)
    add(x.t().contiguous().t(), ys[0])  # x is not loose: a non-contiguous x runs the body
    assert calls[0] == 3


class _ReusingAllocator(TorchDispatchMode):
    """Below the recorder: every ``zeros(1)`` gets the same memory, as a caching allocator hands a block that
    was just freed out again (the body frees each flag before it asks for the next)."""

    def __init__(self) -> None:
        super().__init__()
        self.block = torch.empty(1)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten.zeros.default and tuple(args[0]) == (1,):
            return self.block.zero_().detach()
        return func(*args, **(kwargs or {}))


def test_a_buffer_allocated_where_a_dead_one_was_is_recorded(fake_cache: None) -> None:
    """A buffer the body allocates at the address and layout of one it dropped is a new buffer: the recipe
    records it (letting the dead one go at that step) and replays the body's bits."""
    calls, addresses = [0], []

    @_recipes.replayed("test reuse", lambda x, y: (x.shape, x.dtype))
    def add_twice(x: Tensor, y: Tensor) -> Tensor:
        calls[0] += 1
        first = torch.empty_like(x)
        flag = torch.zeros(1)
        _launch_add(x, y, first, flag)  # first = (x + y) * 2 + 0, flag = 1
        addresses.append(flag.data_ptr())
        del flag
        flag = torch.zeros(1)  # a fresh zero at the same address
        addresses.append(flag.data_ptr())
        out = torch.empty_like(x)
        _launch_add(first, y, out, flag)  # out = (first + y) * 2 + 0
        return out

    x, y = torch.randn(3, 4), torch.randn(3, 4)
    with _ReusingAllocator():
        add_twice(x, y), add_twice(x, y)
        x2, y2 = torch.randn(3, 4), torch.randn(3, 4)
        out = add_twice(x2, y2)
    assert addresses[2] == addresses[3]
    assert calls[0] == 2, f"the third call ran the body ({add_twice.recipes.why})"
    torch.testing.assert_close(out, ((x2 + y2) * 2 + y2) * 2, rtol=0, atol=0)
    (recipe,) = add_twice.recipes.kinds.values()
    dead = [step[-1] for step in recipe.steps if step[0] == "alloc"]
    assert dead == [None, None, 3, None]  # the second flag takes the first's address: slot 3 let go


def test_device_key_by_cuda_index_else_by_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The input tests' device key: a CUDA tensor's index (fake CUDA tensors here), the device itself for a
    type recipes serve (the CPU stand-ins), None for any other type."""
    with FakeTensorMode():
        first = torch.empty(2, device="cuda:0")
        assert _recipes.device_key(first) == 0
        assert _recipes.on_device(first, 0) and not _recipes.on_device(first, 1)
        # Where CUDA is present, a fake CUDA tensor initialises its real device: cuda:1 needs a second GPU.
        if torch.cuda.device_count() != 1:
            second = torch.empty(2, device="cuda:1")
            assert _recipes.device_key(second) == 1 and not _recipes.on_device(second, 0)
    cpu = torch.empty(2)
    assert not _recipes.on_device(cpu, 0)
    assert _recipes.device_key(cpu) is None and _recipes.device_key(torch.empty(2, device="meta")) is None
    monkeypatch.setattr(_recipes, "_DEVICES", ("cpu",))
    key = _recipes.device_key(cpu)
    assert key == torch.device("cpu") and _recipes.on_device(torch.empty(3), key)
    assert not _recipes.on_device(torch.empty(3, device="meta"), key)


def test_cpu_tensors_run_the_body_without_the_stand_in() -> None:
    add, calls = _make_site()
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    for _ in range(3):
        add(x, y)
    assert calls[0] == 3


def _interpreted_launcher(
    g0: int, g1: int, g2: int, stream: int, function: Any, packed: Any, *rest: Any
) -> None:
    """A stand-in compiled launcher that runs ``function`` = (an interpreted kernel, its constants)."""
    kernel, meta = function
    with _disable_current_modes():
        kernel[(g0, g1, g2)](*rest[3:], **meta)


def _recorded_launch(kernel: Any, grid: tuple[int, ...], *args: Any, **meta: Any) -> None:
    """``launch`` of the kernel modules, noted by an active recorder with :func:`_interpreted_launcher`."""
    recorder = _recipes.recorder()
    if recorder is not None:
        recorder.launch((_interpreted_launcher, (kernel, meta), None, ()), grid, args)
    _interpreted_launcher(*grid, *(1,) * (3 - len(grid)), 0, (kernel, meta), None, None, None, None, *args)


def _angle_inputs(steps: int, layers: int, dtype: torch.dtype, seed: int) -> list[Tensor]:
    """theta, scale, gamma, b, h0, perm, sgn, p2p of an angle scan (B, n, k) = (2, 3, 8)."""
    gen = torch.Generator().manual_seed(seed)
    theta = torch.randn(2, steps, 3, layers, 4, generator=gen).to(dtype)
    scale, gamma = (gates((2, steps, 3), dtype, torch.device("cpu"), generator=gen) for _ in range(2))
    b = torch.randn(2, steps, 3, 8, generator=gen).to(dtype)
    h0 = torch.randn(2, 3, 8, generator=gen).to(dtype)
    return [theta, scale, gamma, b, h0, *default_angle_layout(8, layers)]


@marked(on_interpreter)
@pytest.mark.parametrize(("steps", "layers"), [(7, 1), (130, 1)])  # the sequential and chunked plans
def test_angle_bodies_replay_their_launches(
    fake_cache: None, monkeypatch: pytest.MonkeyPatch, steps: int, layers: int
) -> None:
    """The angle forward and adjoint bodies do nothing but allocate and launch: recorded at the second call
    of a kind, replayed at the third with the bits of the first (the body; kernels interpreted, on CPU)."""
    monkeypatch.setattr(angle, "launch", _recorded_launch)
    _recipes.clear()
    inputs = _angle_inputs(steps, layers, torch.float32, seed=steps + layers)
    theta, scale, gamma, b, h0, perm, sgn, p2p = inputs
    grad = torch.randn(b.shape, generator=torch.Generator().manual_seed(1))
    forward, backward = angle._BODIES[1, 1]
    results = []
    for _ in range(3):
        h = forward(*inputs)
        results.append((h, *backward(theta, scale, gamma, h0, h, grad, perm, sgn, p2p)))
    names = ("h", "dtheta", "dscale", "dgamma", "db", "dh0")
    _check_replays({"forward": forward, "backward": backward}, names, results)


@marked(on_interpreter)
def test_angle_common_case_holds_only_for_valid_inputs(fake_cache: None) -> None:
    """The one-pass input test of the angle ops: a key for valid inputs, False for every kind of wrong one
    (the detailed checks then name it)."""
    inputs = _angle_inputs(5, 2, torch.float32, seed=3)
    key = angle._common_case(*inputs)
    assert key == (torch.Size((2, 5, 3, 8)), torch.float32, 2, torch.int64, torch.float32, torch.int64)
    theta, scale, gamma, b, h0, perm, sgn, p2p = inputs
    wrong = {
        "theta's shape": (theta[..., :3], 0),
        "scale's shape": (scale[:, :4], 1),
        "gamma's dtype": (gamma.double(), 2),
        "b's rank": (b[0], 3),
        "k odd": (torch.randn(2, 5, 3, 7), 3),
        "h0's shape": (h0[:1], 4),
        "perm's dtype": (perm.float(), 5),
        "sgn's dtype": (sgn.long(), 6),
        "p2p's shape": (p2p[:1], 7),
        "a subclass": (b.as_subclass(_Subclass), 3),
        "another device": (h0.to("meta"), 4),
        "perm not a tensor": (perm.tolist(), 5),
    }
    for name, (value, index) in wrong.items():
        changed = list(inputs)
        changed[index] = value
        assert not angle._common_case(*changed), name
    assert not angle._common_case(*_angle_inputs(0, 2, torch.float32, seed=3)), "empty"
    assert not angle._common_case(*_angle_inputs(5, 0, torch.float32, seed=3)), "no rotation layer"


class _Subclass(Tensor):
    pass


def _affine_inputs(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> list[Tensor]:
    """A (B, T, n, k, k) near 0.45 I, Bm (B, T, n, k, v), H0 (B, n, k, v), and two output grads (like A,
    like Bm) of a matrix affine scan."""
    batch, steps, heads, k, v = shape
    gen = torch.Generator().manual_seed(steps + k)
    A = torch.randn(batch, steps, heads, k, k, generator=gen) * (0.45 / k**0.5) + 0.45 * torch.eye(k)
    Bm, g_b = (torch.randn(shape, generator=gen) for _ in range(2))
    H0 = torch.randn(batch, heads, k, v, generator=gen)
    g_a = torch.randn(A.shape, generator=gen)
    return [x.to(device, dtype) for x in (A, Bm, H0, g_a, g_b)]


def _affine_calls(inputs: list[Tensor]) -> tuple[Tensor, ...]:
    """Every affine body once, eagerly as an op's body runs: the recurrence and its adjoint, the scan and its
    adjoint."""
    A, Bm, H0, g_a, g_b = inputs
    run = _launch._run_eagerly
    H = run(affine._recurrence_fwd, (A, Bm, H0))
    d_rec = run(affine._recurrence_bwd, (A, H0, H, g_b))
    Abar, Bbar = run(affine._scan_fwd, (A, Bm))
    return (H, *d_rec, Abar, Bbar, *run(affine._scan_bwd, (A, Abar, Bbar, g_a, g_b)))


_AFFINE_BODIES = ("_recurrence_fwd", "_recurrence_bwd", "_scan_fwd", "_scan_bwd")
_AFFINE_NAMES = ("H", "dA", "dB", "dH0", "Abar", "Bbar", "scan dA", "scan dB")


@marked(on_interpreter)
@pytest.mark.parametrize("steps", [7, 9])  # the sequential and chunked plans (chunks of 4 steps)
def test_affine_bodies_replay_their_launches(
    fake_cache: None, monkeypatch: pytest.MonkeyPatch, steps: int
) -> None:
    """The affine bodies do nothing but allocate and launch: recorded at the second call of a kind, replayed
    at the third with the bits of the first (the body; kernels interpreted, on CPU)."""
    monkeypatch.setattr(affine, "launch", _recorded_launch)
    monkeypatch.setattr(affine, "MIN_CHUNK", 4)
    _recipes.clear()
    inputs = _affine_inputs((1, steps, 3, 3, 2), torch.float32, torch.device("cpu"))
    assert affine._strategy(3, steps, affine.num_sms(inputs[0].device), 4)[0] == (
        "sequential" if steps == 7 else "chunked"
    )
    results = [_affine_calls(inputs) for _ in range(3)]
    _check_replays({name: getattr(affine, name) for name in _AFFINE_BODIES}, _AFFINE_NAMES, results)


@marked(on_interpreter)
def test_affine_case_holds_only_for_valid_inputs(fake_cache: None) -> None:
    """The one-pass input test of the affine ops: a key for valid inputs, False for every kind of wrong one
    (the detailed checks then name it)."""
    A, Bm, H0, g_a, g_b = _affine_inputs((2, 5, 3, 4, 3), torch.float32, torch.device("cpu"))
    assert affine._common_case(A, Bm, (g_a,), (g_b,), H0) == (torch.Size((2, 5, 3, 4, 4)), 3, torch.float32)
    wrong = {
        "A not square": (A[..., :3], Bm, (), (), None),
        "Bm's steps": (A, Bm[:, :4], (), (), None),
        "Bm's dtype": (A, Bm.double(), (), (), None),
        "k past the envelope": (torch.randn(1, 2, 1, 33, 33), torch.randn(1, 2, 1, 33, 1), (), (), None),
        "v past the envelope": (A, torch.randn(2, 5, 3, 4, 65), (), (), None),
        "empty": (A[:, :0], Bm[:, :0], (), (), None),
        "a grad like A of another shape": (A, Bm, (g_a[:1],), (), None),
        "a grad like Bm of another dtype": (A, Bm, (), (g_b.double(),), None),
        "a None grad": (A, Bm, (None,), (), None),
        "H0's shape": (A, Bm, (), (), H0[:1]),
        "H0 on another device": (A, Bm, (), (), H0.to("meta")),
        "a subclass": (A.as_subclass(_Subclass), Bm, (), (), None),
        "A not a tensor": (A.tolist(), Bm, (), (), None),
    }
    for name, args in wrong.items():
        assert not affine._common_case(*args), name


def _gated_inputs(kind: int, steps: int, dtype: torch.dtype, device: torch.device) -> list[Tensor]:
    """pre (3, T, G 8), h0 (3, 8), a gradient of the states as a time slice of a longer tensor with
    16-byte aligned rows, and d final, of recurrence ``kind``."""
    gen = torch.Generator().manual_seed(10 * kind + steps)
    rows, hidden = 3, 8
    pre = torch.randn(rows, steps, gated.branches(kind) * hidden, generator=gen).to(device, dtype)
    state = torch.float64 if dtype == torch.float64 else torch.float32
    h0 = torch.randn(rows, hidden, generator=gen).to(device, state)
    longer = torch.randn(rows, steps + 4, hidden, generator=gen).to(device, dtype)
    d_final = torch.randn(rows, hidden, generator=gen).to(device, state)
    return [pre, h0, longer[:, 2 : 2 + steps], d_final]


@marked(on_interpreter)
@pytest.mark.parametrize("kind", [0, 3])  # MinGRU log, MinLSTM log
def test_gated_bodies_replay_their_launches(
    fake_cache: None, monkeypatch: pytest.MonkeyPatch, kind: int
) -> None:
    """The fused gates' forward, adjoint op and by-hand adjoint (a time slice of the gradient in pre's
    dtype, d final) record at the second call of a kind and replay at the third with the bits of the
    first; the slice reaches the recipe as it is."""
    monkeypatch.setattr(gated, "launch", _recorded_launch)
    _recipes.clear()
    pre, h0, grad_slice, d_final = _gated_inputs(kind, 37, torch.float32, torch.device("cpu"))
    assert not grad_slice.is_contiguous() and grad_slice.data_ptr() % 16 == 0
    grad = grad_slice.contiguous()
    forward, backward, by_hand = gated._BODIES[kind]
    results = []
    for _ in range(3):
        h = forward(pre, h0)
        results.append(
            (h, *backward(pre, h0, h, grad), *gated.adjoint(kind, pre, h0, h, grad_slice, d_final))
        )
    for body in (forward, backward, by_hand):
        assert _replays(body.recipes) == 1, body.recipes.why
    for later in results[1:]:
        for name, got, want in zip(("h", "d pre", "d h0", "d pre", "d h0"), later, results[0], strict=True):
            assert torch.equal(got, want), name
    summed = grad.clone()
    summed[:, -1] += d_final
    for got, want in zip(results[2][3:], backward(pre, h0, results[0][0], summed), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_gated_common_case_holds_only_for_valid_non_empty_inputs(fake_cache: None) -> None:
    """The fused gates' one-pass input test (also ``GATED_IMPLS``'s envelope): true for valid inputs, false
    for an empty batch, a wrong h0 or state dtype, or an unknown kind."""
    pre, h0, grad_slice, _ = _gated_inputs(0, 5, torch.float32, torch.device("cpu"))
    assert gated._common_case(pre, h0, 0, {"grad_h": grad_slice})
    assert not gated._common_case(pre[:0], h0[:0], 0, {}), "empty batch"
    assert not gated._common_case(pre, h0.double(), 0, {}), "h0 dtype"
    assert not gated._common_case(pre, h0, 0, {"h": grad_slice.double()}), "state dtype"
    assert not gated._common_case(pre, h0, len(gated.KINDS), {}), "kind"
    assert not gated._common_case(pre, h0, 3, {}), "MinLSTM takes pre (B, T, 3 H)"


@marked(on_interpreter)
def test_gated_adjoint_copies_a_gradient_without_contiguous_rows(
    fake_cache: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gradient whose (T, H) rows are not contiguous is copied by the body, which then never records
    (a copy is not an allocation); the results keep their values."""
    monkeypatch.setattr(gated, "launch", _recorded_launch)
    _recipes.clear()
    pre, h0, _, d_final = _gated_inputs(1, 9, torch.float32, torch.device("cpu"))
    grad = torch.randn(3, 8, 9).transpose(1, 2)
    h = gated._BODIES[1][0](pre, h0)
    first = gated.adjoint(1, pre, h0, h, grad, d_final)
    for _ in range(2):
        for got, want in zip(gated.adjoint(1, pre, h0, h, grad, d_final), first, strict=True):
            assert torch.equal(got, want)
    recipes = gated._BODIES[1][2].recipes
    assert _replays(recipes) == 0 and "not an allocation" in recipes.why


# ------------------------------------------------------------------------------------------------ CUDA


def _replays(recipes: _recipes.Recipes) -> int:
    return sum(type(kind) is _recipes._Recipe for kind in recipes.kinds.values())


def _check_replays(bodies: dict[str, Any], names: tuple[str, ...], results: list[tuple[Tensor, ...]]) -> None:
    """Each body holds one recipe, and every call after the first gave the first call's bits."""
    for label, body in bodies.items():
        assert _replays(body.recipes) == 1, f"{label}: {body.recipes.why}"
    for later in results[1:]:
        for name, got, want in zip(names, later, results[0], strict=True):
            assert torch.equal(got, want), name


def _as_tuple(x: Any) -> tuple[Any, ...]:
    return x if isinstance(x, tuple) else (x,)


@marked(on_cuda)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(8, 1024, 1024), (1, 4096, 256), (3, 37, 5)])
def test_recorded_ops_give_the_bits_of_triton_launches(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    _recipes.clear()
    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    rows, _, width = shape
    a = gates(shape, dtype, device, generator=gen)
    b, g = (torch.randn(shape, generator=gen).to(device, dtype) for _ in range(2))
    h0 = torch.randn(rows, width, generator=gen).to(device, dtype)
    lc = torch.log(a.float().abs()).to(dtype)
    lv = torch.cat([h0.abs().log()[:, None], b], dim=1)
    calls: list[tuple[str, _recipes.Recipes, Any, tuple[Any, ...]]] = [
        ("linear fwd", linear._recurrence_fwd.recipes, linear._recurrence_fwd, (a, b, h0)),
        ("linear bwd", linear._recurrence_bwd.recipes, linear._recurrence_bwd, (a, h0, b, g)),
        ("scan fwd", linear._scan_fwd.recipes, linear._scan_fwd, (a, b)),
        ("scan bwd", linear._scan_bwd.recipes, linear._scan_bwd, (a, a.clone(), b, g, g.clone())),
        ("log fwd", log._recurrence_fwd.recipes, log._recurrence_fwd, (lc, b, h0)),
        ("log bwd", log._recurrence_bwd.recipes, log._recurrence_bwd, (lc, b, h0, b.clone(), g)),
        ("values fwd", log._values_fwd.recipes, log._values_fwd, (lc, lv)),
        ("values bwd", log._values_bwd.recipes, log._values_bwd, (lc, lv, b, g)),
    ]
    for name, recipes, site, inputs in calls:  # distinct tensors: one tensor as two inputs is not recorded
        with _launch.via_triton():
            expected = _launch._run_eagerly(site, inputs)
        before = _replays(recipes)
        got = [_launch._run_eagerly(site, inputs) for _ in range(3)]
        assert _replays(recipes) == before + 1, f"{name}: {recipes.why}"
        for result in got:
            for want, have in zip(_as_tuple(expected), _as_tuple(result), strict=True):
                assert (want is None and have is None) or torch.equal(want, have), name


@marked(on_cuda)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("steps", "layers"), [(4096, 1), (300, 2), (37, 1), (2048, 4)])
def test_recorded_angle_bodies_give_the_bits_of_triton_launches(
    steps: int, layers: int, dtype: torch.dtype
) -> None:
    _recipes.clear()
    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(steps)
    theta = torch.randn(8, steps, 16, layers, 4, generator=gen).to(device, dtype)
    scale, gamma = (gates((8, steps, 16), dtype, device, generator=gen) for _ in range(2))
    b, grad = (torch.randn(8, steps, 16, 8, generator=gen).to(device, dtype) for _ in range(2))
    h0 = torch.randn(8, 16, 8, generator=gen).to(device, dtype)
    perm, sgn, p2p = (t.to(device) for t in default_angle_layout(8, layers))
    forward, backward = angle._BODIES[1, 1]
    with _launch.via_triton():
        h_want = _launch._run_eagerly(forward, (theta, scale, gamma, b, h0, perm, sgn, p2p))
        want = (
            h_want,
            *_launch._run_eagerly(backward, (theta, scale, gamma, h0, h_want, grad, perm, sgn, p2p)),
        )
    for _ in range(3):
        h = _launch._run_eagerly(forward, (theta, scale, gamma, b, h0, perm, sgn, p2p))
        got = (h, *_launch._run_eagerly(backward, (theta, scale, gamma, h0, h, grad, perm, sgn, p2p)))
        for name, have, expected in zip(
            ("h", "dtheta", "dscale", "dgamma", "db", "dh0"), got, want, strict=True
        ):
            assert torch.equal(have, expected), name
    for body in (forward, backward):
        assert _replays(body.recipes) == 1, body.recipes.why


def _gated_calls(kind: int, inputs: list[Tensor]) -> tuple[Tensor, ...]:
    """h, the adjoint op's (d pre, d h0) and the by-hand adjoint's of recurrence ``kind``, each through its
    recorded body (eagerly, as the layers call them)."""
    pre, h0, grad_slice, d_final = inputs
    forward, backward, _ = gated._BODIES[kind]
    h = _launch._run_eagerly(forward, (pre, h0))
    d_op = _launch._run_eagerly(backward, (pre, h0, h, grad_slice.to(h0.dtype).contiguous()))
    return (h, *d_op, *gated.adjoint(kind, pre, h0, h, grad_slice, d_final))


@marked(on_cuda)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("steps", [4096, 37])
def test_recorded_gated_bodies_give_the_bits_of_triton_launches(steps: int, dtype: torch.dtype) -> None:
    _recipes.clear()
    names = ("h", "d pre", "d h0", "d pre by hand", "d h0 by hand")
    for kind, kind_name in enumerate(gated.KIND_NAMES):
        inputs = _gated_inputs(kind, steps, dtype, torch.device("cuda"))
        with _launch.via_triton():
            want = _gated_calls(kind, inputs)
        for _ in range(3):
            for name, have, expected in zip(names, _gated_calls(kind, inputs), want, strict=True):
                assert torch.equal(have, expected), f"{kind_name}: {name}"
        for body in gated._BODIES[kind]:
            assert _replays(body.recipes) == 1, f"{kind_name}: {body.recipes.why}"


@marked(on_cuda)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(4, 4096, 16, 2, 2), (2, 300, 3, 4, 3), (1, 37, 2, 16, 16)])
def test_recorded_affine_bodies_give_the_bits_of_triton_launches(
    shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    _recipes.clear()
    inputs = _affine_inputs(shape, dtype, torch.device("cuda"))
    with _launch.via_triton():
        want = _affine_calls(inputs)
    for _ in range(3):
        for name, have, expected in zip(_AFFINE_NAMES, _affine_calls(inputs), want, strict=True):
            assert torch.equal(have, expected), name
    for name in _AFFINE_BODIES:
        body = getattr(affine, name)
        assert _replays(body.recipes) == 1, f"{name}: {body.recipes.why}"
