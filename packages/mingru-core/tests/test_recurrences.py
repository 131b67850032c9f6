"""The recurrences with an initial state: exact for any sign of h0, chunked equals whole, state gradients."""

from __future__ import annotations

import pytest
import torch

from mingru import affine_recurrence, diag_recurrence, linear_recurrence, log_recurrence

F64 = torch.float64


def _loop(a, b, h0):
    hs, h = [], h0
    for t in range(a.shape[1]):
        h = a[:, t] * h + b[:, t]
        hs.append(h)
    return torch.stack(hs, 1)


@pytest.mark.parametrize("h0_kind", ["none", "positive", "zero", "negative", "mixed"])
def test_log_recurrence_is_exact_and_nan_free_for_any_h0(h0_kind):
    g = torch.Generator().manual_seed(0)
    log_coeffs = -torch.rand(2, 11, 4, dtype=F64, generator=g)
    log_coeffs[1, 3] = float("-inf")
    log_b = torch.randn(2, 11, 4, dtype=F64, generator=g)
    log_b[0, :, 1] = float("-inf")
    h0 = {
        "none": None,
        "positive": torch.rand(2, 4, dtype=F64, generator=g) + 0.1,
        "zero": torch.zeros(2, 4, dtype=F64),
        "negative": -torch.rand(2, 4, dtype=F64, generator=g) - 0.1,
        "mixed": torch.tensor([[1.0, -2.0, 0.0, 0.5], [-0.5, 0.0, 3.0, -1.0]], dtype=F64),
    }[h0_kind]
    params = [log_coeffs.requires_grad_(), log_b.requires_grad_()] + (
        [] if h0 is None else [h0.requires_grad_()]
    )
    h = log_recurrence(log_coeffs, log_b, h0)
    start = torch.zeros(2, 4, dtype=F64) if h0 is None else h0
    torch.testing.assert_close(h, _loop(log_coeffs.exp(), log_b.exp(), start), rtol=1e-10, atol=1e-12)
    grads = torch.autograd.grad(h.sum(), params)
    assert all(torch.isfinite(gr).all() for gr in grads)
    if h0 is not None:
        clean = [t.detach().clone().requires_grad_() for t in params]
        clean[0] = torch.where(torch.isinf(clean[0]), -50.0, clean[0]).detach().requires_grad_()
        clean[1] = torch.where(torch.isinf(clean[1]), -50.0, clean[1]).detach().requires_grad_()
        expected = torch.autograd.grad(_loop(clean[0].exp(), clean[1].exp(), clean[2]).sum(), clean)
        torch.testing.assert_close(grads[2], expected[2], rtol=1e-10, atol=1e-12)


def test_log_recurrence_gradcheck_with_signed_state():
    log_coeffs = (-torch.rand(1, 5, 3, dtype=F64)).requires_grad_()
    log_b = torch.randn(1, 5, 3, dtype=F64, requires_grad=True)
    h0 = torch.tensor([[0.7, -0.4, 0.2]], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(log_recurrence, (log_coeffs, log_b, h0))


def _chunked(fn, first, second, split, state_of):
    left = fn(*(x[:, :split] for x in first), second)
    right = fn(*(x[:, split:] for x in first), state_of(left))
    return torch.cat((left, right), 1)


@pytest.mark.parametrize("split", [1, 4, 12], ids=lambda s: f"split{s}")
def test_chunked_equals_whole_for_every_recurrence(split):
    g = torch.Generator().manual_seed(1)
    a = torch.empty(2, 13, 3, dtype=F64).uniform_(-1, 1, generator=g)
    b = torch.randn(2, 13, 3, dtype=F64, generator=g)
    h0 = torch.randn(2, 3, dtype=F64, generator=g)
    last = lambda h: h[:, -1]  # noqa: E731
    torch.testing.assert_close(
        _chunked(linear_recurrence, (a, b), h0, split, last), linear_recurrence(a, b, h0)
    )
    log_a, log_b = -a.abs(), b
    torch.testing.assert_close(
        _chunked(log_recurrence, (log_a, log_b), h0, split, last), log_recurrence(log_a, log_b, h0)
    )
    A = torch.randn(2, 13, 2, 3, 3, dtype=F64, generator=g) / 2
    Bm = torch.randn(2, 13, 2, 3, 4, dtype=F64, generator=g)
    H0 = torch.randn(2, 2, 3, 4, dtype=F64, generator=g)
    torch.testing.assert_close(
        _chunked(affine_recurrence, (A, Bm), H0, split, last), affine_recurrence(A, Bm, H0)
    )
    d = torch.rand(2, 13, 2, 3, dtype=F64, generator=g)
    torch.testing.assert_close(
        _chunked(diag_recurrence, (d, Bm), H0, split, last), diag_recurrence(d, Bm, H0)
    )


def test_state_gradients_flow_in_and_out():
    a = torch.rand(1, 6, 2, dtype=F64, requires_grad=True)
    b = torch.randn(1, 6, 2, dtype=F64, requires_grad=True)
    h0 = torch.randn(1, 2, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *x: linear_recurrence(*x)[:, -1], (a, b, h0))
    A = (torch.randn(1, 4, 1, 2, 2, dtype=F64) / 2).requires_grad_()
    Bm = torch.randn(1, 4, 1, 2, 3, dtype=F64, requires_grad=True)
    H0 = torch.randn(1, 1, 2, 3, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(affine_recurrence, (A, Bm, H0))
    d = torch.rand(1, 4, 1, 2, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(diag_recurrence, (d, Bm, H0))


def test_state_on_the_wrong_shape_is_named():
    a = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match=r"h0 must have shape \(B, D\) = \(2, 4\), got \(3, 4\)"):
        linear_recurrence(a, a, torch.zeros(3, 4))
    with pytest.raises(
        ValueError, match=r"H0 must have shape \(B, n, k, v\) = \(1, 1, 2, 3\), got \(1, 1, 3, 2\)"
    ):
        diag_recurrence(torch.zeros(1, 4, 1, 2), torch.zeros(1, 4, 1, 2, 3), torch.zeros(1, 1, 3, 2))


def test_safe_log_under_torch_func_transforms():
    """The log of the initial state: log(x) for x > 0, -inf elsewhere; gradient 1/x or 0, also inside
    torch.func.grad and vmap (its autograd Function keeps forward and setup_context apart)."""
    from mingru.scans.log import safe_log

    x = torch.tensor([2.0, 0.5, 0.0, -3.0], dtype=torch.float64)
    grad = torch.func.grad(lambda t: safe_log(t).clamp(min=-10).sum())(x)
    torch.testing.assert_close(grad, torch.tensor([0.5, 2.0, 0.0, 0.0], dtype=torch.float64))
    batched = torch.func.vmap(safe_log)(x.view(2, 2))
    torch.testing.assert_close(batched, safe_log(x).view(2, 2))
    assert torch.isneginf(batched[1]).all()
