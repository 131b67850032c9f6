"""A generic inclusive scan of affine maps along dim 1 (time), used by every eager reference.

Element t holds an affine map x -> coef_t * x + val_t ("*" is the family's product: elementwise, broadcast
diagonal or matrix). The forward scan returns the composition of maps 1..t at every t; the reverse scan
returns the composition of maps t..T. Hillis-Steele doubling: ceil(log2 T) vectorised steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

Compose = Callable[[Tensor, Tensor], Tensor]
Push = Callable[[Tensor, Tensor, Tensor], Tensor]
PairForward = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]
PairBackward = Callable[[Tensor, Tensor, Tensor, Any, Any], tuple[Tensor, Tensor]]


def scan_maps(
    coef: Tensor, val: Tensor, compose: Compose, push: Push, *, reverse: bool = False
) -> tuple[Tensor, Tensor]:
    """Inclusive scan of the maps (coef_t, val_t) along dim 1.

    ``compose(outer, inner)`` gives the coefficient of ``outer after inner``; ``push(outer, inner_val,
    outer_val)`` gives its value. Forward: the result at t is map_t after ... after map_1, so its value is the
    h_0 = 0 solution of h_t = coef_t * h_{t-1} + val_t. Reverse: the result at t is map_t after ... after
    map_T, the solution of x_t = coef_t * x_{t+1} + val_t with x_{T+1} = 0. Returns (coef_scan, val_scan).
    """
    length = coef.shape[1]
    shift = 1
    while shift < length:
        if reverse:
            outer_c, inner_c = coef[:, :-shift], coef[:, shift:]
            outer_v, inner_v = val[:, :-shift], val[:, shift:]
            coef = torch.cat((compose(outer_c, inner_c), coef[:, -shift:]), dim=1)
            val = torch.cat((push(outer_c, inner_v, outer_v), val[:, -shift:]), dim=1)
        else:
            outer_c, inner_c = coef[:, shift:], coef[:, :-shift]
            outer_v, inner_v = val[:, shift:], val[:, :-shift]
            coef = torch.cat((coef[:, :shift], compose(outer_c, inner_c)), dim=1)
            val = torch.cat((val[:, :shift], push(outer_c, inner_v, outer_v)), dim=1)
        shift *= 2
    return coef, val


def shift_in(x: Tensor, first: Tensor) -> Tensor:
    """x delayed by one step along dim 1: [first, x_1, ..., x_{T-1}] (``first`` has a time dim of 1)."""
    return torch.cat((first, x[:, :-1]), dim=1)


def shift_out(x: Tensor) -> Tensor:
    """x advanced by one step along dim 1 with zeros at the end: [x_2, ..., x_T, 0]."""
    return torch.cat((x[:, 1:], torch.zeros_like(x[:, :1])), dim=1)


def mul(outer: Tensor, inner: Tensor) -> Tensor:
    """Compose elementwise (diagonal) coefficients."""
    return outer * inner


def add(outer: Tensor, inner: Tensor) -> Tensor:
    """Compose log-space coefficients."""
    return outer + inner


def mul_add(outer: Tensor, inner_val: Tensor, outer_val: Tensor) -> Tensor:
    """Elementwise map: outer * inner_val + outer_val."""
    return torch.addcmul(outer_val, outer, inner_val)


def row_mul_add(outer: Tensor, inner_val: Tensor, outer_val: Tensor) -> Tensor:
    """Diagonal map on a matrix state: diag(outer) @ inner_val + outer_val."""
    return torch.addcmul(outer_val, outer.unsqueeze(-1), inner_val)


def matmul_add(outer: Tensor, inner_val: Tensor, outer_val: Tensor) -> Tensor:
    """Matrix map: outer @ inner_val + outer_val."""
    return torch.matmul(outer, inner_val) + outer_val


def log_mul_add(outer: Tensor, inner_val: Tensor, outer_val: Tensor) -> Tensor:
    """Log-space map: log(exp(outer + inner_val) + exp(outer_val))."""
    return torch.logaddexp(outer + inner_val, outer_val)


def fresh(out: Tensor, *inputs: Tensor | None) -> Tensor:
    """``out`` as a contiguous tensor sharing no memory with ``inputs``: a custom op may not return an alias
    of an input (the T = 1 scan returns its input unchanged), and its fake returns contiguous outputs."""
    out = out.contiguous()
    storage = out.untyped_storage().data_ptr()
    if any(x is not None and x.untyped_storage().data_ptr() == storage for x in inputs):
        out = out.clone()
    return out


def _like(x: Tensor) -> Tensor:
    return x.new_empty(x.shape)


def pair_scan_op(family: str, forward: PairForward, backward: PairBackward) -> Callable[..., Any]:
    """The differentiable reference of a pair scan (x, y) -> (X, Y) with X like x and Y like y, whose adjoint
    reads (x, X, Y, gX, gY) -> (dx like x, dy like Y); a grad that autograd leaves out arrives as None.

    ``forward`` and ``backward`` become the custom ops ``mingru_ref::{family}_scan_fwd`` and ``_bwd``, the
    first with autograd wired to the second. torch.compile sees each as one node whatever T is, so one graph
    serves every length (traced inline, the ceil(log2 T) doubling steps would give a graph per power-of-two
    range of T). The backward stores only x, X and Y.
    """

    def fwd_impl(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        X, Y = forward(x, y)
        return fresh(X, x, y), fresh(Y, x, y)

    def bwd_impl(
        x: Tensor, X: Tensor, Y: Tensor, gX: Tensor | None, gY: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        dx, dy = backward(x, X, Y, gX, gY)
        return fresh(dx, x, X, Y, gX, gY), fresh(dy, x, X, Y, gX, gY)

    fwd_op = torch.library.custom_op(
        f"mingru_ref::{family}_scan_fwd", mutates_args=(), schema="(Tensor x, Tensor y) -> (Tensor, Tensor)"
    )(fwd_impl)
    bwd_op = torch.library.custom_op(
        f"mingru_ref::{family}_scan_bwd",
        mutates_args=(),
        schema="(Tensor x, Tensor X, Tensor Y, Tensor? gX, Tensor? gY) -> (Tensor, Tensor)",
    )(bwd_impl)
    fwd_op.register_fake(lambda x, y: (_like(x), _like(y)))
    bwd_op.register_fake(lambda x, X, Y, gX, gY: (_like(x), _like(Y)))

    def setup_context(ctx: Any, inputs: tuple[Tensor, Tensor], output: tuple[Tensor, Tensor]) -> None:
        ctx.save_for_backward(inputs[0], *output)
        ctx.set_materialize_grads(False)

    def grads(ctx: Any, gX: Tensor | None, gY: Tensor | None) -> tuple[Tensor, Tensor]:
        x, X, Y = ctx.saved_tensors
        return bwd_op(x, X, Y, gX, gY)

    fwd_op.register_autograd(grads, setup_context=setup_context)
    return fwd_op
