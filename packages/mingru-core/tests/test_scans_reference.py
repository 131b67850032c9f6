"""Each eager reference against a plain float64 loop over many shapes, plus gradcheck and dtype behaviour."""

from __future__ import annotations

import pytest
import torch
from scan_loops import affine_loop, angle_loop, diag_loop, linear_loop, log_loop, rotate_loop

from mingru.scans import (
    affine_scan_ref,
    angle_scan_ref,
    angle_transition_ref,
    apply_rotation_layers,
    default_angle_layout,
    diag_scan_ref,
    linear_scan_ref,
    parallel_scan_log_ref,
)

F64 = torch.float64
SHAPES_BTD = [(1, 1, 1), (2, 1, 3), (3, 7, 5), (2, 33, 4), (1, 64, 3), (2, 100, 2), (1, 1000, 3)]
SHAPES_HEADS = [(1, 1, 1, 1, 1), (2, 1, 2, 3, 2), (2, 7, 3, 4, 5), (1, 33, 2, 3, 1), (1, 130, 1, 2, 3)]


def btd_id(shape):
    return "B{}-T{}-D{}".format(*shape)


def heads_id(shape):
    return "B{}-T{}-n{}-k{}-v{}".format(*shape)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("shape", SHAPES_BTD, ids=btd_id)
def test_linear_matches_loop(shape):
    g = _gen()
    a = torch.empty(shape, dtype=F64).uniform_(-1.1, 1.1, generator=g)
    b = torch.randn(shape, dtype=F64, generator=g)
    A, Bc = linear_scan_ref(a, b)
    A_loop, Bc_loop = linear_loop(a, b)
    torch.testing.assert_close(A, A_loop, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(Bc, Bc_loop, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("shape", SHAPES_BTD, ids=btd_id)
def test_log_matches_loop(shape):
    g = _gen(1)
    batch, steps, width = shape
    log_coeffs = -torch.rand(shape, dtype=F64, generator=g)
    log_values = torch.randn(batch, steps + 1, width, dtype=F64, generator=g)
    torch.testing.assert_close(
        parallel_scan_log_ref(log_coeffs, log_values),
        log_loop(log_coeffs, log_values),
        rtol=1e-10,
        atol=1e-12,
    )


@pytest.mark.parametrize("shape", SHAPES_HEADS, ids=heads_id)
def test_affine_matches_loop(shape):
    g = _gen(2)
    batch, steps, heads, k, v = shape
    A = torch.randn(batch, steps, heads, k, k, dtype=F64, generator=g) / k**0.5
    Bm = torch.randn(batch, steps, heads, k, v, dtype=F64, generator=g)
    Abar, Bbar = affine_scan_ref(A, Bm)
    Abar_loop, Bbar_loop = affine_loop(A, Bm)
    torch.testing.assert_close(Abar, Abar_loop, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(Bbar, Bbar_loop, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("shape", SHAPES_HEADS, ids=heads_id)
def test_diag_matches_loop(shape):
    g = _gen(3)
    batch, steps, heads, k, v = shape
    a = torch.empty(batch, steps, heads, k, dtype=F64).uniform_(-1, 1, generator=g)
    Bm = torch.randn(batch, steps, heads, k, v, dtype=F64, generator=g)
    abar, Bbar = diag_scan_ref(a, Bm)
    abar_loop, Bbar_loop = diag_loop(a, Bm)
    torch.testing.assert_close(abar, abar_loop, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(Bbar, Bbar_loop, rtol=1e-10, atol=1e-12)


def _angle_inputs(batch, steps, heads, layers, k, *, reflect=False, seed=4, dtype=F64):
    g = _gen(seed)
    perm, sgn, p2p = default_angle_layout(k, layers, reflect=reflect)
    return (
        torch.randn(batch, steps, heads, layers, k // 2, dtype=dtype, generator=g),
        torch.rand(batch, steps, heads, dtype=dtype, generator=g) * 2 - 1,
        torch.rand(batch, steps, heads, dtype=dtype, generator=g),
        torch.randn(batch, steps, heads, k, dtype=dtype, generator=g),
        torch.randn(batch, heads, k, dtype=dtype, generator=g),
        perm,
        sgn,
        p2p,
    )


ANGLE_CASES = [
    (1, 1, 1, 1, 2, False),
    (2, 5, 3, 2, 4, True),
    (1, 9, 2, 3, 6, False),
    (2, 17, 1, 3, 8, True),
    (1, 40, 2, 1, 2, False),
]


@pytest.mark.parametrize("case", ANGLE_CASES, ids=lambda c: "B{}-T{}-n{}-R{}-k{}-reflect{}".format(*c))
@pytest.mark.parametrize(
    "flags", [(1, 1), (1, 0), (0, 1), (0, 0)], ids=lambda f: "scale{}-decay{}".format(*f)
)
def test_angle_matches_loop(case, flags):
    inputs = _angle_inputs(*case[:5], reflect=case[5])
    has_scale, has_decay = flags
    h = angle_scan_ref(*inputs, has_scale=has_scale, has_decay=has_decay)
    torch.testing.assert_close(h, angle_loop(*inputs, has_scale, has_decay), rtol=1e-10, atol=1e-12)


def test_rotation_layers_are_orthogonal_and_match_the_coordinate_loop():
    theta, *_, perm, sgn, p2p = _angle_inputs(2, 3, 2, 3, 6, reflect=True)
    x = torch.randn(2, 3, 2, 6, dtype=F64)
    torch.testing.assert_close(
        apply_rotation_layers(x, theta, perm, sgn, p2p), rotate_loop(x, theta, perm, sgn, p2p)
    )
    L = angle_transition_ref(theta, perm, sgn, p2p)
    eye = torch.eye(6, dtype=F64).expand_as(L)
    torch.testing.assert_close(L @ L.transpose(-1, -2), eye, rtol=0, atol=1e-12)
    assert torch.allclose(torch.linalg.det(L), torch.tensor(-1.0, dtype=F64) ** 3)


@pytest.mark.parametrize("steps", [1, 6], ids=lambda t: f"T{t}")
def test_gradcheck_every_reference(steps):
    g = _gen(5)
    a = torch.empty(2, steps, 3, dtype=F64).uniform_(-1, 1, generator=g).requires_grad_()
    b = torch.randn(2, steps, 3, dtype=F64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(linear_scan_ref, (a, b))
    log_coeffs = (-torch.rand(2, steps, 3, dtype=F64, generator=g)).requires_grad_()
    log_values = torch.randn(2, steps + 1, 3, dtype=F64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(parallel_scan_log_ref, (log_coeffs, log_values))
    A = (torch.randn(1, steps, 2, 3, 3, dtype=F64, generator=g) / 2).requires_grad_()
    Bm = torch.randn(1, steps, 2, 3, 2, dtype=F64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(affine_scan_ref, (A, Bm))
    d = torch.empty(1, steps, 2, 3, dtype=F64).uniform_(-1, 1, generator=g).requires_grad_()
    assert torch.autograd.gradcheck(diag_scan_ref, (d, Bm))
    theta, scale, gamma, bv, h0, perm, sgn, p2p = _angle_inputs(1, steps, 2, 2, 4, reflect=True)
    tensors = [t.requires_grad_() for t in (theta, scale, gamma, bv, h0)]

    def angle(*ts):
        return angle_scan_ref(*ts, perm, sgn, p2p, has_scale=True, has_decay=True)

    assert torch.autograd.gradcheck(angle, tensors)


def test_gradcheck_with_only_one_output_used():
    a = torch.rand(1, 5, 2, dtype=F64, requires_grad=True)
    b = torch.randn(1, 5, 2, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, y: linear_scan_ref(x, y)[0], (a, b))
    assert torch.autograd.gradcheck(lambda x, y: linear_scan_ref(x, y)[1], (a, b))
    A = torch.randn(1, 5, 1, 2, 2, dtype=F64, requires_grad=True)
    Bm = torch.randn(1, 5, 1, 2, 3, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, y: affine_scan_ref(x, y)[0], (A, Bm))
    assert torch.autograd.gradcheck(lambda x, y: affine_scan_ref(x, y)[1], (A, Bm))


def test_log_scan_with_minus_inf_is_nan_free_forward_and_backward():
    log_coeffs = -torch.rand(2, 6, 3, dtype=F64)
    log_coeffs[0, 2, :] = float("-inf")
    log_values = torch.randn(2, 7, 3, dtype=F64)
    log_values[:, 0, 0] = float("-inf")
    log_values[1, :, 1] = float("-inf")
    log_values[0, 3:, 2] = float("-inf")
    log_coeffs.requires_grad_()
    log_values.requires_grad_()
    h = parallel_scan_log_ref(log_coeffs, log_values)
    torch.testing.assert_close(h, log_loop(log_coeffs.detach(), log_values.detach()), rtol=1e-10, atol=1e-12)
    assert torch.all(h[1, :, 1] == 0)
    h.sum().backward()
    assert torch.isfinite(log_coeffs.grad).all()
    assert torch.isfinite(log_values.grad).all()
    assert torch.all(log_values.grad[1, :, 1] == 0)
    assert torch.all(log_coeffs.grad[0, 2] == 0)


def test_log_scan_gradient_matches_autograd_of_the_loop():
    log_coeffs = (-torch.rand(2, 9, 3, dtype=F64)).requires_grad_()
    log_values = torch.randn(2, 10, 3, dtype=F64, requires_grad=True)
    weight = torch.randn(2, 9, 3, dtype=F64)
    (parallel_scan_log_ref(log_coeffs, log_values) * weight).sum().backward()
    ours = (log_coeffs.grad, log_values.grad)
    log_coeffs.grad = log_values.grad = None
    (log_loop(log_coeffs, log_values) * weight).sum().backward()
    torch.testing.assert_close(ours, (log_coeffs.grad, log_values.grad), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_half_and_single_inputs_accumulate_in_float32(dtype):
    g = _gen(6)
    a = torch.empty(2, 300, 4).uniform_(0.5, 1.0, generator=g).to(dtype)
    b = torch.randn(2, 300, 4, generator=g).to(dtype)
    A, Bc = linear_scan_ref(a, b)
    assert A.dtype == Bc.dtype == dtype
    A64, Bc64 = linear_loop(a.double(), b.double())
    # the result must be the float64 answer rounded once to dtype (up to the fp32 accumulation error)
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(Bc.double(), Bc64, rtol=eps, atol=eps * Bc64.abs().max().item())
    torch.testing.assert_close(A.double(), A64, rtol=eps, atol=1e-6)


def test_non_contiguous_inputs():
    a = torch.rand(3, 4, 8, dtype=F64).transpose(1, 2)
    b = torch.randn(4, 3, 8, dtype=F64).permute(1, 2, 0)
    assert not a.is_contiguous() and not b.is_contiguous()
    torch.testing.assert_close(linear_scan_ref(a, b), linear_loop(a, b))
    A = torch.randn(1, 3, 2, 5, 5, dtype=F64).transpose(-1, -2)[:, :, :, :3, :3]
    Bm = torch.randn(1, 3, 2, 4, 3, dtype=F64).transpose(-1, -2)
    torch.testing.assert_close(affine_scan_ref(A, Bm), affine_loop(A, Bm))


def _reference_op_samples(steps: int, dtype: torch.dtype) -> list[tuple[str, tuple[torch.Tensor, ...]]]:
    g = _gen(3)

    def rand(*shape: int, lo: float = -1.0, hi: float = 1.0) -> torch.Tensor:
        return torch.empty(shape, dtype=F64).uniform_(lo, hi, generator=g).to(dtype).requires_grad_()

    return [
        ("linear_scan_fwd", (rand(2, steps, 3), rand(2, steps, 3))),
        ("parallel_scan_log_fwd", (rand(2, steps, 3, lo=-2.0, hi=0.0), rand(2, steps + 1, 3))),
        ("affine_scan_fwd", (rand(2, steps, 2, 3, 3, lo=-0.5, hi=0.5), rand(2, steps, 2, 3, 4))),
        ("diag_scan_fwd", (rand(2, steps, 2, 3), rand(2, steps, 2, 3, 4))),
    ]


@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("steps", [1, 5])
def test_reference_ops_pass_opcheck(steps: int, dtype: torch.dtype) -> None:
    """The references are the custom ops torch.ops.mingru_ref.*: schema, fake kernel, autograd registration
    and tracing agree with the real kernel (T = 1 checks that no output aliases an input)."""
    for name, args in _reference_op_samples(steps, dtype):
        op = getattr(torch.ops.mingru_ref, name).default
        torch.library.opcheck(op, args)
        outs = op(*args)
        outs = outs if isinstance(outs, tuple) else (outs,)
        grads = tuple(torch.ones_like(out) for out in outs)
        backward = getattr(torch.ops.mingru_ref, name.replace("_fwd", "_bwd")).default
        saved = (args[0], *outs) if name != "parallel_scan_log_fwd" else (*args, *outs)
        torch.library.opcheck(backward, (*(x.detach() for x in saved), *grads))
