"""MINGRU_SCAN: one test (or more) per row of the dispatch table, with a stand-in plugin module."""

from __future__ import annotations

import types
import warnings

import pytest
import torch

from mingru import ScanFallback, dispatch, explain_scan, linear_scan, scan_mode, triton_scans
from mingru.min_gru import _dispatch_scan, angle_scan, linear_recurrence
from mingru.scans import default_angle_layout, linear_scan_ref


class Recorder:
    """A stand-in kernel: records its calls and returns a recognisable result (or declines)."""

    def __init__(self, decline: str | None = None):
        self.calls: list[dict] = []
        self.decline = decline

    def __call__(self, *args, **kwargs):
        self.calls.append(kwargs)
        if self.decline is not None:
            raise ScanFallback(self.decline)
        return tuple(torch.full_like(args[0], 7.0) for _ in range(2))


def _plugin(available=True, impls=None, angle=None) -> types.ModuleType:
    module = types.ModuleType("fake_mingru_triton")
    module.available = lambda: available
    module.SCAN_IMPLS = dict(impls or {})
    module.ScanFallback = ScanFallback
    if angle is not None:
        module.angle_scan_impl = angle
    return module


@pytest.fixture(autouse=True)
def clean_dispatch(monkeypatch):
    monkeypatch.delenv("MINGRU_SCAN", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(dispatch, "_WARNED", set())
    monkeypatch.setattr(triton_scans, "_BACKEND", None)


def _use(monkeypatch, plugin, *, mode=None, interpret=False):
    monkeypatch.setattr(triton_scans, "_BACKEND", plugin)
    if mode is not None:
        monkeypatch.setenv("MINGRU_SCAN", mode)
    if interpret:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def _ab():
    return torch.rand(2, 5, 3), torch.randn(2, 5, 3)


def _is_reference(result, a, b):
    return all(torch.equal(x, y) for x, y in zip(result, linear_scan_ref(a, b), strict=True))


@pytest.mark.parametrize("mode", [None, "", "auto", " AUTO "], ids=["unset", "empty", "auto", "spaced-upper"])
def test_auto_uses_reference_silently_on_cpu(monkeypatch, mode):
    kernel = Recorder()
    _use(monkeypatch, _plugin(impls={"linear": kernel}), mode=mode)
    a, b = _ab()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = linear_scan(a, b)
    assert _is_reference(out, a, b)
    assert kernel.calls == []
    assert scan_mode() == "auto"


def test_auto_runs_the_kernel_where_it_can(monkeypatch):
    kernel = Recorder()
    _use(monkeypatch, _plugin(impls={"linear": kernel}), interpret=True)
    a, b = _ab()
    A, _ = linear_scan(a, b)
    assert len(kernel.calls) == 1
    assert torch.all(A == 7.0)
    assert explain_scan("linear", a, b).impl == "triton"


def test_auto_warns_once_per_op_and_reason_on_scan_fallback(monkeypatch):
    kernel = Recorder(decline="k = 300 is outside the kernel envelope")
    _use(monkeypatch, _plugin(impls={"linear": kernel}), interpret=True)
    a, b = _ab()
    with pytest.warns(RuntimeWarning, match=r"'linear' scan runs its eager reference: k = 300 is outside"):
        out = linear_scan(a, b)
    assert _is_reference(out, a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _is_reference(linear_scan(a, b), a, b)
    assert len(kernel.calls) == 2
    kernel.decline = "another reason"
    with pytest.warns(RuntimeWarning, match="another reason"):
        linear_scan(a, b)


@pytest.mark.parametrize(
    ("plugin", "reason"),
    [
        (_plugin(available="CUDA not available"), "CUDA not available"),
        (_plugin(impls={}), "no Triton kernel is registered for the 'linear' scan"),
    ],
    ids=["unavailable", "op-missing"],
)
def test_auto_warns_once_when_a_wanted_kernel_cannot_run(monkeypatch, plugin, reason):
    _use(monkeypatch, plugin, interpret=True)
    a, b = _ab()
    with pytest.warns(RuntimeWarning, match=reason):
        out = linear_scan(a, b)
    assert _is_reference(out, a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        linear_scan(a, b)
    choice = explain_scan("linear", a, b)
    assert (choice.impl, choice.reason, choice.fallback) == ("eager", reason, True)


def test_auto_on_cuda_tensors_is_a_fallback_while_no_kernel_can_run():
    status = triton_scans.load_backend().available()
    if status is True and "linear" in triton_scans.SCAN_IMPLS:
        pytest.skip("a Triton kernel for 'linear' can run here: the kernel tests cover this path")
    choice = dispatch._choose("linear", "cuda", "auto")
    expected = status if isinstance(status, str) else "no Triton kernel is registered for the 'linear' scan"
    assert (choice.impl, choice.reason, choice.fallback) == ("eager", expected, True)


@pytest.mark.parametrize(
    ("plugin", "interpret", "reason"),
    [
        (
            _plugin(impls={"linear": Recorder()}),
            False,
            r"the tensors are on cpu; the Triton kernels need CUDA",
        ),
        (_plugin(available="CUDA not available"), True, r"CUDA not available"),
        (_plugin(impls={}), True, r"no Triton kernel is registered for the 'linear' scan"),
        (None, True, r"mingru-triton is not installed; pip install 'mingru-core\[triton\]'"),
    ],
    ids=["cpu-tensors", "unavailable", "op-missing", "not-installed"],
)
def test_triton_mode_raises_instead_of_downgrading(monkeypatch, plugin, interpret, reason):
    if plugin is None:
        plugin = triton_scans._stub(triton_scans.NOT_INSTALLED)
    _use(monkeypatch, plugin, mode="triton", interpret=interpret)
    with pytest.raises(
        RuntimeError, match=r"MINGRU_SCAN=triton: the 'linear' scan cannot run its Triton kernel: " + reason
    ):
        linear_scan(*_ab())


def test_triton_mode_turns_scan_fallback_into_an_error(monkeypatch):
    _use(
        monkeypatch,
        _plugin(impls={"linear": Recorder(decline="v = 513 > 256")}),
        mode="triton",
        interpret=True,
    )
    with pytest.raises(
        RuntimeError, match=r"the Triton 'linear' scan declined the call: v = 513 > 256"
    ) as info:
        linear_scan(*_ab())
    assert isinstance(info.value.__cause__, ScanFallback)


def test_triton_mode_runs_the_kernel(monkeypatch):
    kernel = Recorder()
    _use(monkeypatch, _plugin(impls={"linear": kernel}), mode="triton", interpret=True)
    _, Bc = linear_scan(*_ab())
    assert len(kernel.calls) == 1 and torch.all(Bc == 7.0)


def test_eager_mode_never_calls_the_kernel(monkeypatch):
    kernel = Recorder()
    _use(monkeypatch, _plugin(impls={"linear": kernel}), mode="eager", interpret=True)
    a, b = _ab()
    assert _is_reference(linear_scan(a, b), a, b)
    assert kernel.calls == []
    choice = explain_scan("linear", a, b)
    assert (choice.impl, choice.reason, choice.fallback) == ("eager", "MINGRU_SCAN=eager", False)


@pytest.mark.parametrize("value", ["cuda", "fast", "1", "eagerly"])
def test_unknown_mode_is_a_value_error_listing_the_valid_values(monkeypatch, value):
    monkeypatch.setenv("MINGRU_SCAN", value)
    with pytest.raises(
        ValueError,
        match=rf"MINGRU_SCAN must be one of auto, triton, eager \(unset means auto\), got '{value}'",
    ):
        linear_scan(*_ab())


def test_angle_dispatch_passes_int_flags_to_angle_scan_impl(monkeypatch):
    seen = []

    def angle_scan_impl(*args, has_scale, has_decay):
        seen.append((has_scale, has_decay))
        return torch.zeros_like(args[3])

    _use(monkeypatch, _plugin(angle=angle_scan_impl), interpret=True)
    perm, sgn, p2p = default_angle_layout(4, 1)
    args = (torch.zeros(1, 2, 1, 1, 2), torch.ones(1, 2, 1), torch.ones(1, 2, 1), torch.ones(1, 2, 1, 4))
    h = angle_scan(*args, torch.zeros(1, 1, 4), perm, sgn, p2p, has_scale=True, has_decay=False)
    assert seen == [(1, 0)] and type(seen[0][0]) is int
    assert torch.all(h == 0)


def test_angle_without_angle_scan_impl_falls_back(monkeypatch):
    _use(monkeypatch, _plugin(impls={"linear": Recorder()}), mode="triton", interpret=True)
    perm, sgn, p2p = default_angle_layout(4, 1)
    args = (torch.zeros(1, 2, 1, 1, 2), torch.ones(1, 2, 1), torch.ones(1, 2, 1), torch.ones(1, 2, 1, 4))
    with pytest.raises(RuntimeError, match="no Triton kernel is registered for the 'angle' scan"):
        angle_scan(*args, torch.zeros(1, 1, 4), perm, sgn, p2p, has_scale=True, has_decay=True)


def test_inputs_are_checked_before_any_choice(monkeypatch):
    _use(monkeypatch, _plugin(impls={"linear": Recorder()}), mode="triton")
    with pytest.raises(ValueError, match=r"b must have shape like a"):
        linear_scan(torch.zeros(1, 2, 3), torch.zeros(1, 2, 4))


def test_unknown_op_names():
    with pytest.raises(
        ValueError, match=r"op must be one of 'log', 'linear', 'affine', 'diag', 'angle', got 'rnn'"
    ):
        explain_scan("rnn", torch.zeros(1, 1, 1))
    with pytest.raises(ValueError, match=r"op must be one of 'log', 'linear', 'affine', 'diag', got 'angle'"):
        _dispatch_scan("angle", torch.zeros(1, 1, 1))


def test_trace_time_constants_carry_the_marker_torch_compile_reads():
    reference = torch.compiler.assume_constant_result(lambda: 0)
    marker = next(name for name in vars(reference) if "constant" in name)
    assert getattr(dispatch._backend_status, marker) is True
    assert getattr(dispatch._warn_once, marker) is True


# -- the recurrences (the layers' path): the fused kernel of RECURRENCE_IMPLS, else the composed scan --------


class StateKernel:
    """A stand-in fused kernel: records (coeffs, values, h0), returns a constant (or declines)."""

    def __init__(self, decline: str | None = None):
        self.calls: list[tuple] = []
        self.decline = decline

    def __call__(self, coeffs, values, h0):
        self.calls.append((coeffs, values, h0))
        if self.decline is not None:
            raise ScanFallback(self.decline)
        return torch.full_like(values, 5.0)


def _recurrence_plugin(scan=None, fused=None):
    plugin = _plugin(impls={"linear": scan or Recorder()})
    if fused is not None:
        plugin.RECURRENCE_IMPLS = {"linear": fused}
    return plugin


def test_recurrence_runs_the_fused_kernel_with_a_zero_state_for_none(monkeypatch):
    fused = StateKernel()
    _use(monkeypatch, _recurrence_plugin(fused=fused), interpret=True)
    a, b = _ab()
    assert torch.equal(linear_recurrence(a, b), torch.full_like(b, 5.0))
    ((_, _, h0),) = fused.calls
    assert torch.equal(h0, torch.zeros(2, 3))
    h0 = torch.randn(2, 3)
    linear_recurrence(a, b, h0)
    assert torch.equal(fused.calls[-1][2], h0)


def test_recurrence_without_a_fused_kernel_composes_the_dispatched_scan(monkeypatch):
    scan = Recorder()
    _use(monkeypatch, _recurrence_plugin(scan=scan), interpret=True)
    a, b = _ab()
    h0 = torch.randn(2, 3)
    expected = torch.full_like(b, 7.0) + torch.full_like(a, 7.0) * h0.unsqueeze(1)
    torch.testing.assert_close(linear_recurrence(a, b, h0), expected)
    assert len(scan.calls) == 1


def test_recurrence_fallback_warns_once_under_auto_and_matches_the_reference(monkeypatch):
    fused, scan = StateKernel(decline="too wide"), Recorder()
    _use(monkeypatch, _recurrence_plugin(scan=scan, fused=fused), interpret=True)
    a, b = _ab()
    h0 = torch.randn(2, 3)
    A, Bc = linear_scan_ref(a, b)
    with pytest.warns(RuntimeWarning, match="'linear' scan runs its eager reference: too wide"):
        out = linear_recurrence(a, b, h0)
    torch.testing.assert_close(out, Bc + A * h0.unsqueeze(1))
    assert scan.calls == [], "after a fused-kernel fallback the reference runs, not the scan kernel"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        linear_recurrence(a, b, h0)


def test_recurrence_fallback_is_an_error_under_triton(monkeypatch):
    _use(
        monkeypatch, _recurrence_plugin(fused=StateKernel(decline="too wide")), mode="triton", interpret=True
    )
    a, b = _ab()
    with pytest.raises(
        RuntimeError, match="MINGRU_SCAN=triton: the Triton 'linear' recurrence declined the call: too wide"
    ):
        linear_recurrence(a, b)


def test_recurrence_under_eager_never_calls_a_kernel(monkeypatch):
    fused, scan = StateKernel(), Recorder()
    _use(monkeypatch, _recurrence_plugin(scan=scan, fused=fused), mode="eager", interpret=True)
    a, b = _ab()
    h0 = torch.randn(2, 3)
    A, Bc = linear_scan_ref(a, b)
    torch.testing.assert_close(linear_recurrence(a, b, h0), Bc + A * h0.unsqueeze(1))
    assert fused.calls == [] and scan.calls == []


# -- MinGRU / MinLSTM: the fused-gates kernel of GATED_IMPLS, else the unfused path --------------------------


class GatedKernel:
    """A stand-in fused-gates kernel: records (pre, h0), returns states of 3.0 (or None, or declines)."""

    def __init__(self, decline: str | None = None, returns_none: bool = False):
        self.calls: list[tuple] = []
        self.decline = decline
        self.returns_none = returns_none

    def __call__(self, pre, h0):
        self.calls.append((pre, h0))
        if self.decline is not None:
            raise ScanFallback(self.decline)
        if self.returns_none:
            return None
        return torch.full((*pre.shape[:2], h0.shape[-1]), 3.0, dtype=h0.dtype)


def _gated_layer_call(monkeypatch, kernel, *, mode=None, lstm=False, dtype=torch.float32):
    from mingru.layers import MinGRU, MinLSTM

    plugin = _plugin(impls={"log": Recorder(), "linear": Recorder()})
    plugin.GATED_IMPLS = {"lstm-log" if lstm else "gru-log": kernel}
    _use(monkeypatch, plugin, mode=mode, interpret=True)
    layer = (MinLSTM if lstm else MinGRU)(4).to(dtype)
    unfused = []

    def run_unfused(pre, h0):  # states of 1.0: the fake plugin's scan kernels are not the layer's
        unfused.append(pre)
        return torch.ones(*pre.shape[:2], 4)

    monkeypatch.setattr(layer, "_unfused", run_unfused)
    return layer, unfused


@pytest.mark.parametrize("lstm", [False, True], ids=["gru", "lstm"])
def test_layers_run_the_fused_gates_kernel_with_a_zero_state_for_none(monkeypatch, lstm):
    kernel = GatedKernel()
    layer, unfused = _gated_layer_call(monkeypatch, kernel, lstm=lstm, dtype=torch.bfloat16)
    x = torch.randn(2, 5, 4, dtype=torch.bfloat16)
    _, final = layer(x)
    ((pre, h0),) = kernel.calls
    assert pre.shape == (2, 5, (3 if lstm else 2) * 4) and pre.dtype == torch.bfloat16  # the projection as is
    assert torch.equal(h0, torch.zeros(2, 4)) and h0.dtype == torch.float32  # the state dtype
    assert unfused == [] and torch.equal(final, torch.full((2, 4), 3.0))
    state = torch.randn(2, 4)
    layer(x, state)
    assert torch.equal(kernel.calls[-1][1], state)


def test_a_fused_kernel_returning_none_leaves_the_unfused_path(monkeypatch):
    kernel = GatedKernel(returns_none=True)
    layer, unfused = _gated_layer_call(monkeypatch, kernel, mode="triton")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a size choice, not a fallback: no warning
        _, final = layer(torch.randn(2, 5, 4))
    assert len(kernel.calls) == 1 and len(unfused) == 1 and torch.equal(final, torch.ones(2, 4))


def test_a_declining_fused_kernel_warns_once_under_auto_and_raises_under_triton(monkeypatch):
    kernel = GatedKernel(decline="too odd")
    layer, unfused = _gated_layer_call(monkeypatch, kernel)
    x = torch.randn(2, 5, 4)
    warning = r"the fused gru-log recurrence declined, its gates and scan run unfused: too odd"
    with pytest.warns(RuntimeWarning, match=warning):
        _, final = layer(x)
    assert len(unfused) == 1 and torch.equal(final, torch.ones(2, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        layer(x)  # once per (kind, reason)
    monkeypatch.setenv("MINGRU_SCAN", "triton")
    with pytest.raises(RuntimeError, match="'log' fused gru-log recurrence declined the call: too odd"):
        layer(x)


@pytest.mark.parametrize("mode", ["eager", None])
def test_fused_gates_kernel_is_skipped_by_eager_and_by_cpu_without_the_interpreter(monkeypatch, mode):
    kernel = GatedKernel()
    layer, unfused = _gated_layer_call(monkeypatch, kernel, mode=mode)
    if mode is None:
        monkeypatch.delenv("TRITON_INTERPRET")
    layer(torch.randn(2, 5, 4))
    assert kernel.calls == [] and len(unfused) == 1


class GatedAdjoint:
    """A stand-in for ``GATED_ADJOINTS[kind]``: records its inputs, returns d pre of ones and d h0 of 2.0."""

    def __init__(self):
        self.calls: list[tuple] = []

    def __call__(self, pre, h0, h, grad_h, d_final):
        self.calls.append((pre.shape, h.shape, grad_h.clone(), d_final.clone()))
        return torch.ones_like(pre), torch.full_like(h0, 2.0)


def test_recompute_chunks_take_the_plugins_adjoint_without_autograd(monkeypatch):
    """With ``GATED_ADJOINTS`` beside ``GATED_IMPLS`` a recomputed chunk's recurrence gradient is the
    adjoint's: called once per chunk from the last, with d_y's slice in x's dtype and the carried d final
    (the final state's gradient, then each later chunk's d h0); d x = d pre W_in per chunk, d h0 the first
    chunk's."""
    kernel, adjoint = GatedKernel(), GatedAdjoint()
    layer, unfused = _gated_layer_call(monkeypatch, kernel, mode="triton", dtype=torch.float64)
    triton_scans._BACKEND.GATED_ADJOINTS = {"gru-log": adjoint}
    layer.recompute, layer.chunk_len = True, 2
    x = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    y, final = layer(x, h0)
    d_x, d_h0, d_w = torch.autograd.grad(y.sum() + 3.0 * final.sum(), [x, h0, layer.proj_in.weight])
    assert [shape for shape, *_ in adjoint.calls] == [(2, 1, 8), (2, 2, 8), (2, 2, 8)]  # last chunk first
    assert all(h_shape == (2, pre[1], 4) for pre, h_shape, *_ in adjoint.calls)
    for _, _, grad_h, _ in adjoint.calls:
        assert grad_h.dtype == torch.float64 and torch.equal(grad_h, torch.ones_like(grad_h))
    carried = [d_final for *_, d_final in adjoint.calls]
    assert torch.equal(carried[0], torch.full((2, 4), 3.0, dtype=torch.float64))
    assert all(torch.equal(c, torch.full((2, 4), 2.0, dtype=torch.float64)) for c in carried[1:])
    w_in = layer.proj_in.weight
    torch.testing.assert_close(d_x, torch.ones(2, 5, 8, dtype=torch.float64) @ w_in)
    torch.testing.assert_close(d_h0, torch.full((2, 4), 2.0, dtype=torch.float64))
    torch.testing.assert_close(d_w, torch.ones(10, 8, dtype=torch.float64).t() @ x.detach().reshape(10, 4))
    assert unfused == []
