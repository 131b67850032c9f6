"""The fused MinGRU/MinLSTM kernels (gates and scan in one walk) against the layers' unfused eager path:
states, d pre and d h0 for every kind, odd sizes, T = 1, non-contiguous inputs, half types, saturated gates,
gradcheck in float64; their plans, errors and the choice of path."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import HALF_TYPES, assert_close, kernel_device, marked, on_cuda, on_interpreter

from mingru.layers import MinGRU, MinLSTM
from mingru_triton import gated
from mingru_triton.impls import GATED_IMPLS

KIND_LAYERS = {
    "gru-log": (MinGRU, {"mode": "log"}),
    "gru-linear": (MinGRU, {"mode": "linear"}),
    "gru-negative": (MinGRU, {"mode": "linear", "negative_gates": True}),
    "lstm-log": (MinLSTM, {"mode": "log"}),
    "lstm-linear": (MinLSTM, {"mode": "linear"}),
}
KINDS = list(gated.KINDS)


def _reference(kind: str, pre: torch.Tensor, h0: torch.Tensor, monkeypatch) -> torch.Tensor:
    """The layer's unfused path (gates in the state dtype, then the eager recurrence)."""
    monkeypatch.setenv("MINGRU_SCAN", "eager")
    cls, kwargs = KIND_LAYERS[kind]
    layer = cls(h0.shape[-1], **kwargs)
    assert layer.gated_kind == kind
    return layer._unfused(pre, h0)


def _inputs(kind: str, batch: int, steps: int, hidden: int, dtype: torch.dtype, scale: float = 2.0, seed=0):
    generator = torch.Generator().manual_seed(seed)
    g = 3 if kind.startswith("lstm") else 2
    pre = torch.randn(batch, steps, g * hidden, generator=generator, dtype=torch.float64) * scale
    h0 = torch.randn(batch, hidden, generator=generator, dtype=torch.float64)
    device = kernel_device()
    state = torch.promote_types(dtype, torch.float32)
    return pre.to(device=device, dtype=dtype), h0.to(device=device, dtype=state)


def _grads(fn, pre, h0, weight):
    pre = pre.detach().requires_grad_()
    h0 = h0.detach().requires_grad_()
    h = fn(pre, h0)
    d_pre, d_h0 = torch.autograd.grad((h * weight).sum(), [pre, h0])
    return h.detach(), d_pre, d_h0


def _check_kind(kind, batch, steps, hidden, dtype, monkeypatch, scale=2.0):
    pre, h0 = _inputs(kind, batch, steps, hidden, dtype, scale)
    code = KINDS.index(kind)
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(batch, steps, hidden, generator=generator, dtype=torch.float64)
    weight = weight.to(device=pre.device, dtype=h0.dtype)
    got = _grads(lambda p, s: gated.gated_recurrence_fwd(p, s, code), pre, h0, weight)
    wide = (pre.double(), h0.double(), weight.double())
    want = _grads(lambda p, s: _reference(kind, p, s, monkeypatch), *wide)
    assert got[0].dtype == h0.dtype and got[1].dtype == pre.dtype and got[2].dtype == h0.dtype
    # The states are accumulated in float32 from exact conversions of pre: float32's tolerance, whatever
    # the type of pre; d pre is rounded once to pre's type.
    types = (h0.dtype, pre.dtype, h0.dtype)
    for what, out, ref, tol in zip(("h", "d pre", "d h0"), got, want, types, strict=True):
        assert torch.isfinite(out).all(), f"{kind}: {what} is not finite"
        assert_close(out, ref, tol, steps, what=f"{kind} {tuple(pre.shape)} {dtype}: {what}")


@marked(on_interpreter)
@pytest.mark.parametrize("shape", [(2, 1, 3), (2, 13, 5), (3, 37, 17)], ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_fused_kernel_equals_the_unfused_path_in_float64(kind, shape, monkeypatch):
    _check_kind(kind, *shape, torch.float64, monkeypatch)


@marked(on_interpreter)
@pytest.mark.parametrize("dtype", [torch.float32, *HALF_TYPES], ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_fused_kernel_in_float32_and_half_types(kind, dtype, monkeypatch):
    _check_kind(kind, 2, 21, 6, dtype, monkeypatch)


@marked(on_interpreter)
@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # the interpreter's numpy, exp(180)
@pytest.mark.parametrize("kind", KINDS)
def test_saturated_gates_give_finite_exact_results(kind, monkeypatch):
    """Logits of +-60 (z rounds to 0 or 1, a to 0 or 1 in float32): no NaN, no division by a."""
    _check_kind(kind, 2, 9, 4, torch.float32, monkeypatch, scale=60.0)


@marked(on_interpreter)
@pytest.mark.parametrize("kind", KINDS)
def test_gradcheck_in_float64(kind):
    pre, h0 = _inputs(kind, 1, 4, 2, torch.float64)
    code = KINDS.index(kind)
    pre.requires_grad_()
    h0.requires_grad_()
    assert torch.autograd.gradcheck(lambda p, s: gated.gated_recurrence_fwd(p, s, code), (pre, h0))
    assert torch.autograd.gradcheck(lambda p, s: gated.recurrence(code, p, s), (pre, h0))


@marked(on_interpreter)
def test_tiles_and_non_contiguous_inputs(monkeypatch):
    """Several tiles per row and several channel blocks (a forced plan), pre a slice of a wider tensor."""
    wide, h0 = _inputs("lstm-log", 2, 23, 24, torch.float32)
    pre = wide[..., :39]  # (2, 23, 39): G H = 39, H = 13, rows 72 elements apart
    assert not pre.is_contiguous()
    h0 = h0[:, :13]
    code = KINDS.index("lstm-log")
    with gated.force_plan(gated.GatedPlan(8, 4, 1, 2)):
        got = _grads(lambda p, s: gated.gated_recurrence_fwd(p, s, code), pre, h0, 1.0)
    want = _grads(lambda p, s: _reference("lstm-log", p, s, monkeypatch), pre.double(), h0.double(), 1.0)
    for what, out, ref in zip(("h", "d pre", "d h0"), got, want, strict=True):
        assert_close(out, ref, torch.float32, 23, what=what)


@marked(on_interpreter)
def test_errors_name_the_argument():
    pre, h0 = _inputs("gru-log", 2, 5, 3, torch.float32)
    with pytest.raises(ValueError, match=r"takes pre \(B, T, 2 H\)"):
        gated.gated_recurrence_fwd(pre[..., :5], h0, 0)
    with pytest.raises(ValueError, match=r"takes pre \(B, T, 3 H\)"):
        gated.gated_recurrence_fwd(pre[..., :4], h0, 3)
    with pytest.raises(ValueError, match=r"h0 \(2, 3\) in torch.float32, got \(2, 3\) in torch.float64"):
        gated.gated_recurrence_fwd(pre, h0.double(), 0)
    with pytest.raises(ValueError, match="kind must be an int in"):
        gated.gated_recurrence_fwd(pre, h0, 5)
    with pytest.raises(ValueError, match=r"grad_h must have shape"):
        gated.gated_recurrence_bwd(pre, h0, pre[..., :3].contiguous(), pre[..., :2].contiguous(), 0)
    bad = gated.GatedPlan(12, 4, 1, 2)
    with pytest.raises(ValueError, match="must be a power of two"), gated.force_plan(bad):
        pass


def test_plan_widths_and_the_few_chains_rule():
    plan = gated.gated_plan
    assert plan(backward=False) == gated.GatedPlan(16, 64, 4, 3)
    assert plan(backward=True) == gated.GatedPlan(16, 64, 4, 3)
    assert plan(backward=True, lstm=True) == gated.GatedPlan(32, 32, 4, 3)
    assert plan(backward=False, cpu=True).block_t == 16
    few = gated.leaves_to_unfused
    assert not few(8, 4096, 1024)  # 512 programs
    assert few(1, 65536, 256)  # 16 programs: the unfused path spreads T
    assert few(1, 16384, 512)  # 32 programs
    assert not few(2, 4096, 512)  # 64 programs: the walk was 1.6x faster
    assert not few(1, 512, 256)  # short T: the walk is short too


@marked(on_interpreter)
def test_impls_decline_few_chains_with_none_and_run_otherwise():
    pre, h0 = _inputs("gru-log", 1, 2048, 8, torch.float32)
    assert GATED_IMPLS["gru-log"](pre, h0) is None
    pre, h0 = _inputs("gru-log", 2, 7, 8, torch.float32)
    assert GATED_IMPLS["gru-log"](pre, h0).shape == (2, 7, 8)


@marked(on_interpreter)
@pytest.mark.parametrize("kind", ["gru-log", "lstm-linear"])
def test_layers_take_the_fused_kernel(kind, monkeypatch):
    """Under MINGRU_SCAN=triton the layer's states come from the fused op (the unfused path is not run)."""
    monkeypatch.setenv("MINGRU_SCAN", "triton")
    cls, kwargs = KIND_LAYERS[kind]
    layer = cls(6, **kwargs)
    calls = []
    monkeypatch.setattr(layer, "_unfused", lambda *args: calls.append(args))
    y, final = layer(torch.randn(2, 5, 6))
    assert calls == [] and y.shape == (2, 5, 6) and final.shape == (2, 6)


@marked(on_cuda)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_fused_kernel_equals_the_unfused_path_on_cuda(kind, dtype, monkeypatch):
    _check_kind(kind, 3, 2000, 300, dtype, monkeypatch)
    _check_kind(kind, 8, 320, 1024, dtype, monkeypatch)


@marked(on_interpreter)
def test_layer_under_autocast_hands_the_bfloat16_projection_to_the_kernel(monkeypatch):
    """Under autocast the projection arrives in bfloat16: the kernel takes it as it is (float32 states), and
    the layer equals its unfused eager path under the same autocast."""
    import mingru_triton

    seen = []
    fused = mingru_triton.GATED_IMPLS["gru-log"]

    def recorded(pre, h0):
        seen.append(pre.dtype)
        return fused(pre, h0)

    monkeypatch.setitem(mingru_triton.GATED_IMPLS, "gru-log", recorded)
    torch.manual_seed(0)
    layer = MinGRU(6)
    x = torch.randn(2, 9, 6)
    results = {}
    for mode in ("triton", "eager"):
        monkeypatch.setenv("MINGRU_SCAN", mode)
        leaf = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y, final = layer(leaf)
        grads = torch.autograd.grad(y.sum() + final.square().sum(), [leaf, layer.proj_in.weight])
        results[mode] = (y, final, *grads)
    assert seen == [torch.bfloat16]
    assert results["triton"][1].dtype == torch.float32
    names = ("y", "final", "d x", "d W")
    for what, got, want in zip(names, results["triton"], results["eager"], strict=True):
        tol = 1e-5 if what in ("y", "final") else 2e-2  # gradients pass through bfloat16 d pre
        torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=lambda m, w=what: f"{w}: {m}")


# -- the adjoint without autograd (the layers' recomputed chunks) -----------------------------------------


def _adjoint_case(
    kind: str, dtype: torch.dtype, batch: int, steps: int, hidden: int, grad_in_pre_dtype: bool
):
    """Inputs of :func:`gated.adjoint`: grad_h a time slice of a longer gradient (rows apart by more than
    T H), in pre's dtype or the state dtype, and d_final; with the sum the op's adjoint takes."""
    pre, h0 = _inputs(kind, batch, steps, hidden, dtype)
    code = KINDS.index(kind)
    h = gated.gated_recurrence_fwd(pre, h0, code)
    generator = torch.Generator().manual_seed(2)
    longer = torch.randn(batch, steps + 5, hidden, generator=generator, dtype=torch.float64)
    grad_h = longer.to(device=pre.device, dtype=pre.dtype if grad_in_pre_dtype else h0.dtype)[
        :, 3 : 3 + steps
    ]
    d_final = torch.randn(batch, hidden, generator=generator, dtype=torch.float64).to(pre.device, h0.dtype)
    summed = grad_h.to(h0.dtype, copy=True)
    summed[:, -1] += d_final
    return code, pre, h0, h, grad_h, d_final, summed


@marked(on_interpreter)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_adjoint_with_d_final_and_a_sliced_gradient_equals_the_op(kind, dtype):
    """``adjoint`` on grad h (a time slice, in pre's dtype) plus d final equals the op's adjoint on their
    sum in the state dtype: the same walk, so float64 to 1e-12 and the others to one rounding of d pre."""
    for grad_in_pre_dtype in (True, False):
        code, pre, h0, h, grad_h, d_final, summed = _adjoint_case(kind, dtype, 2, 13, 5, grad_in_pre_dtype)
        assert not grad_h.is_contiguous()
        got = gated.adjoint(code, pre, h0, h, grad_h, d_final)
        want = gated.gated_recurrence_bwd(pre, h0, h, summed, code)
        for what, out, ref in zip(("d pre", "d h0"), got, want, strict=True):
            assert out.dtype == ref.dtype and out.shape == ref.shape, what
            tol = 1e-12 if dtype == torch.float64 else (1e-6 if dtype == torch.float32 else 1e-2)
            torch.testing.assert_close(out, ref, rtol=tol, atol=tol, msg=lambda m, w=what: f"{kind} {w}: {m}")
    # without d_final it is the op's adjoint of grad h alone
    got = gated.adjoint(code, pre, h0, h, grad_h, None)
    want = gated.gated_recurrence_bwd(pre, h0, h, grad_h.to(h0.dtype).contiguous(), code)
    for out, ref in zip(got, want, strict=True):
        torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)


@marked(on_interpreter)
def test_adjoint_over_several_tiles_carries_d_final_from_the_last_step_only():
    """Several tiles per row (a forced plan): d final enters at t = T - 1 and reaches earlier steps only
    through the walk, as in the float64 reference of the summed gradient."""
    code, pre, h0, h, grad_h, d_final, summed = _adjoint_case("gru-log", torch.float64, 2, 23, 13, False)
    with gated.force_plan(gated.GatedPlan(8, 4, 1, 2)):
        got = gated.adjoint(code, pre, h0, h, grad_h, d_final)
        want = gated.gated_recurrence_bwd(pre, h0, h, summed, code)
    for out, ref in zip(got, want, strict=True):
        torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


@marked(on_interpreter)
def test_adjoint_errors_name_the_argument():
    code, pre, h0, h, grad_h, d_final, _ = _adjoint_case("gru-log", torch.float32, 2, 5, 3, False)
    with pytest.raises(ValueError, match=r"grad_h must be in the state dtype torch.float32 or pre's dtype"):
        gated.adjoint(code, pre, h0, h, grad_h.double(), d_final)
    with pytest.raises(ValueError, match=r"grad_h must have shape"):
        gated.adjoint(code, pre, h0, h, grad_h[:, :4], d_final)
    with pytest.raises(ValueError, match=r"d_final must have shape"):
        gated.adjoint(code, pre, h0, h, grad_h, d_final[:1])
    with pytest.raises(ValueError, match=r"d_final must be in the state dtype torch.float32"):
        gated.adjoint(code, pre, h0, h, grad_h, d_final.double())


def test_adjoint_off_the_eager_path_sums_the_gradient_for_the_op(monkeypatch):
    """Traced or under a dispatch mode, ``adjoint`` hands the op its gradient summed in the state dtype
    (grad h cast, d final added at the last step) instead of launching the kernel itself."""
    seen = []
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # CPU tensors pass the device check; nothing launches
    monkeypatch.setattr(gated, "eager_fast_path", lambda *tensors: False)
    monkeypatch.setattr(gated, "gated_recurrence_bwd", lambda *args: seen.append(args) or ("d pre", "d h0"))
    pre = torch.randn(2, 7, 6, dtype=torch.bfloat16)
    h0, h = torch.randn(2, 3), torch.randn(2, 7, 3)
    grad_h = torch.randn(2, 9, 3, dtype=torch.bfloat16)[:, 1:8]
    d_final = torch.randn(2, 3)
    assert gated.adjoint(0, pre, h0, h, grad_h, d_final) == ("d pre", "d h0")
    ((p, s, states, summed, kind),) = seen
    assert p is pre and s is h0 and states is h and kind == 0
    want = grad_h.float()
    want[:, -1] += d_final
    assert summed.dtype == torch.float32 and torch.equal(summed, want)


@marked(on_cuda)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_adjoint_on_cuda_equals_the_op_and_names_bad_arguments(kind, dtype):
    """On CUDA (where one cheap test stands in for the checks) the adjoint of a sliced gradient plus d final
    equals the op on their sum, and a gradient of another dtype or a d final of another shape is named."""
    for grad_in_pre_dtype in (True, False):
        code, pre, h0, h, grad_h, d_final, summed = _adjoint_case(kind, dtype, 3, 300, 40, grad_in_pre_dtype)
        got = gated.adjoint(code, pre, h0, h, grad_h, d_final)
        want = gated.gated_recurrence_bwd(pre, h0, h, summed, code)
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        for out, ref in zip(got, want, strict=True):
            torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
    with pytest.raises(ValueError, match=r"grad_h must be in the state dtype"):
        gated.adjoint(code, pre, h0, h, grad_h.double(), d_final)
    with pytest.raises(ValueError, match=r"d_final must have shape"):
        gated.adjoint(code, pre, h0, h, grad_h, d_final[:2])
