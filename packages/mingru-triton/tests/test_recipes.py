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
from kernel_cases import gates, marked, on_cuda
from torch import Tensor
from torch.utils._python_dispatch import _disable_current_modes

pytest.importorskip("mingru_triton.linear")

from mingru_triton import _launch, _recipes, linear, log


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


def test_cpu_tensors_run_the_body_without_the_stand_in() -> None:
    add, calls = _make_site()
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    for _ in range(3):
        add(x, y)
    assert calls[0] == 3


# ------------------------------------------------------------------------------------------------ CUDA


def _replays(recipes: _recipes.Recipes) -> int:
    return sum(type(kind) is _recipes._Recipe for kind in recipes.kinds.values())


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
