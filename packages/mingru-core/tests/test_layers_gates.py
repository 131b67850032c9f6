"""The log-space gate map of MinGRU and MinLSTM (``log_gates``): the plain formulas' values, their
derivatives, and only the two inputs saved for the backward (the memory of a training step)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor
from torch.nn import functional as F

from mingru.layers import MinGRU
from mingru.layers._common import log_g, log_gates


def plain_log(k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    return -F.softplus(k), -F.softplus(-k) + log_g(v)


def _inputs(dtype: torch.dtype, shape: tuple[int, ...] = (3, 17, 5)) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(shape, generator=gen, dtype=dtype) * 4
    v = torch.randn(shape, generator=gen, dtype=dtype) * 3
    v[v.abs() < 1e-3] = 0.5  # away from the kink of log g at 0
    return k, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_values_are_the_plain_formulas_bits(dtype: torch.dtype) -> None:
    k, v = _inputs(dtype)
    for got, want in zip(log_gates(k, v), plain_log(k, v), strict=True):
        assert torch.equal(got, want)


def test_gradients_match_autograd_of_the_plain_formulas() -> None:
    k, v = (x.requires_grad_() for x in _inputs(torch.float64))
    grads = [torch.randn_like(k), torch.randn_like(k)]
    got = torch.autograd.grad(log_gates(k, v), (k, v), grads)
    want = torch.autograd.grad(plain_log(k, v), (k, v), grads)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


def test_gradcheck_and_gradgradcheck() -> None:
    k, v = (x.requires_grad_() for x in _inputs(torch.float64, (2, 3, 4)))
    assert torch.autograd.gradcheck(log_gates, (k, v))
    assert torch.autograd.gradgradcheck(log_gates, (k, v))


def test_log_g_derivative_at_zero_is_the_right_one() -> None:
    """At v = 0 exactly, d log g / dv is 1 / 0.5 (the x >= 0 branch); autograd of the plain formula gives 0
    there (relu's derivative at 0)."""
    k = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    v = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    (d_v,) = torch.autograd.grad(log_gates(k, v)[1], v)
    assert d_v.item() == 2.0


def test_only_the_inputs_are_saved() -> None:
    k, v = (x.requires_grad_() for x in _inputs(torch.float32))

    def saved_bytes(f: Callable[..., tuple[Tensor, Tensor]]) -> tuple[int, set[int]]:
        seen: dict[int, int] = {}

        def pack(t: Tensor) -> Tensor:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            f(k, v)
        return sum(seen.values()), set(seen)

    got, storages = saved_bytes(log_gates)
    assert storages == {k.untyped_storage().data_ptr(), v.untyped_storage().data_ptr()}
    assert got == 2 * k.nbytes
    plain_bytes, _ = saved_bytes(plain_log)
    assert got < plain_bytes


def test_functorch_grad_and_vmap() -> None:
    k, v = _inputs(torch.float64)
    got = torch.func.grad(lambda k_: log_gates(k_, v)[1].sum())(k)
    want = torch.func.grad(lambda k_: plain_log(k_, v)[1].sum())(k)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    batched = torch.vmap(lambda k_, v_: log_gates(k_, v_)[1])(k, v)
    assert torch.equal(batched, plain_log(k, v)[1])


def test_a_mingru_training_step_saves_less_than_with_the_plain_formulas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Saved for the backward of one MinGRU step (CPU, reference recurrence): with the gate map the
    log-mode layer keeps at least four (B, T, hidden) tensors fewer than with the plain formulas."""
    torch.manual_seed(0)
    layer = MinGRU(16)
    x = torch.randn(2, 33, 16, requires_grad=True)

    def saved() -> int:
        seen: dict[int, int] = {}

        def pack(t: Tensor) -> Tensor:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            layer(x)
        return sum(seen.values())

    ours = saved()
    monkeypatch.setattr(MinGRU, "_log_coefficients", lambda self, pre: plain_log(*pre.chunk(2, dim=-1)))
    assert saved() - ours >= 4 * 2 * 33 * 16 * 4
