"""Every layer on the Triton kernels equals the same layer on the eager references: outputs, final state and
the gradients of the input, the initial state and every parameter (interpreter: small; CUDA: real sizes)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from kernel_cases import kernel_device, marked, on_cuda, on_interpreter

from mingru.layers import MinGRU, MinGRUAngle, MinGRUDiag, MinGRUMatrix, MinLSTM

LAYERS = {
    "mingru-log": (MinGRU, {"mode": "log"}),
    "mingru-linear": (MinGRU, {"mode": "linear"}),
    "mingru-linear-negative": (MinGRU, {"mode": "linear", "negative_gates": True}),
    "minlstm-log": (MinLSTM, {"mode": "log"}),
    "minlstm-linear": (MinLSTM, {"mode": "linear"}),
    "matrix-k3-v2": (MinGRUMatrix, {"heads": 2, "head_dim": 3, "value_dim": 2}),
    "diag-k2-v3": (MinGRUDiag, {"heads": 2, "head_dim": 2, "value_dim": 3}),
    "angle-k4-R2-reflect": (MinGRUAngle, {"heads": 2, "head_dim": 4, "reflect": True}),
    "angle-k6-R3-noscale": (
        MinGRUAngle,
        {"heads": 1, "head_dim": 6, "rotation_layers": 3, "use_scale": False},
    ),
    # chunks of 4 steps recomputed in the backward (the last chunk short at T = 13)
    "mingru-log-recompute": (MinGRU, {"mode": "log", "recompute": True, "chunk_len": 4}),
    "minlstm-linear-recompute": (MinLSTM, {"mode": "linear", "recompute": True, "chunk_len": 4}),
    "angle-k4-R2-recompute": (MinGRUAngle, {"heads": 2, "head_dim": 4, "recompute": True, "chunk_len": 4}),
}


def _run(layer, x, h0, mode: str, monkeypatch):
    monkeypatch.setenv("MINGRU_SCAN", mode)
    x = x.detach().requires_grad_()
    h0 = h0.detach().requires_grad_()
    y, final = layer(x, h0)
    loss = (
        y * torch.linspace(-1, 1, y.shape[-1], device=y.device, dtype=y.dtype)
    ).sum() + final.square().sum()
    grads = torch.autograd.grad(loss, [x, h0, *layer.parameters()])
    return y.detach(), final.detach(), grads


def _errors(got, want) -> list[float]:
    """Per tensor: max |got - want| over the largest |want| (at least 1)."""
    return [
        ((g.double() - w.double()).abs().max() / w.double().abs().max().clamp_min(1.0)).item()
        for g, w in zip(got, want, strict=True)
    ]


def _compare(
    name: str, batch: int, steps: int, dim: int, dtype: torch.dtype, monkeypatch, rtol: float
) -> None:
    """The layer on the kernels against the layer on the references.

    float64: both must agree to ``rtol`` (normwise). float32: both runs are compared with a float64 run of
    the references, and the kernels' error must stay within twice the references' error (plus ``rtol``).
    """
    cls, kwargs = LAYERS[name]
    device = kernel_device()
    torch.manual_seed(0)
    layer = cls(dim, **kwargs).to(device=device, dtype=dtype)
    x = torch.randn(batch, steps, dim, device=device, dtype=dtype)
    h0 = torch.randn(batch, *layer.state_shape, device=device, dtype=dtype) * 0.5
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "mingru: ", RuntimeWarning)  # the kernels must take these inputs
        y, final, grads = _run(layer, x, h0, "triton", monkeypatch)
    kernel = [y, final, *grads]
    y, final, grads = _run(layer, x, h0, "eager", monkeypatch)
    eager = [y, final, *grads]
    names = ["y", "final state", "d x", "d h0", *(f"d {n}" for n, _ in layer.named_parameters())]
    if dtype == torch.float64:
        for label, error in zip(names, _errors(kernel, eager), strict=True):
            assert error <= rtol, f"{name}: {label}: kernel vs eager error {error:.2e} > {rtol:.0e}"
        return
    wide = copy.deepcopy(layer).double()
    y, final, grads = _run(wide, x.double(), h0.double(), "eager", monkeypatch)
    truth = [y, final, *grads]
    for label, k_err, e_err in zip(names, _errors(kernel, truth), _errors(eager, truth), strict=True):
        assert k_err <= 2 * e_err + rtol, (
            f"{name}: {label}: kernel error {k_err:.2e}, eager error {e_err:.2e}"
        )


@marked(on_interpreter)
@pytest.mark.parametrize("steps", [1, 13])
@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_on_kernels_equals_eager_under_the_interpreter(name, steps, monkeypatch):
    _compare(name, 2, steps, 5, torch.float64, monkeypatch, 1e-9)


@marked(on_interpreter)
@pytest.mark.parametrize("name", ["mingru-log", "matrix-k3-v2", "angle-k4-R2-reflect"])
def test_layer_on_kernels_fp32_under_the_interpreter(name, monkeypatch):
    _compare(name, 2, 9, 4, torch.float32, monkeypatch, 1e-6)


@marked(on_cuda)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_on_kernels_equals_eager_on_cuda(name, dtype, monkeypatch):
    rtol = 1e-9 if dtype == torch.float64 else 1e-6
    _compare(name, 4, 1000, 64, dtype, monkeypatch, rtol)


@marked(on_cuda)
def test_lm_training_step_on_kernels_equals_eager_on_cuda(monkeypatch):
    from mingru import MinGRULM

    torch.manual_seed(0)
    model = MinGRULM(num_tokens=64, dim=128, depth=2).cuda()
    tokens = torch.randint(0, 64, (4, 257), device="cuda")
    grads = {}
    for mode in ("triton", "eager"):
        monkeypatch.setenv("MINGRU_SCAN", mode)
        model.zero_grad()
        logits, _ = model(tokens[:, :-1])
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
        grads[mode] = [p.grad.clone() for p in model.parameters()]
    for got, want in zip(grads["triton"], grads["eager"], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def _training_step_peak(layer, x, grad_y) -> tuple[int, list[torch.Tensor]]:
    """Peak bytes allocated during forward + backward beyond what was allocated before, and the gradients."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    y, _ = layer(x)
    grads = torch.autograd.grad(y, [x, *layer.parameters()], grad_y)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before, [g.detach() for g in grads]


@marked(on_cuda)
@pytest.mark.parametrize("mode", ["log", "linear"])
def test_recompute_training_step_memory_on_cuda(mode, monkeypatch):
    """MinGRU (4, 4096, 512), float32: with recompute the step holds its inputs, outputs, their gradients and
    one chunk's activations (at most 1.2x the least; the single pass 2.7x), and gives the single pass's
    gradients. (256-step chunks gave 1.20x in log mode on an H200: 128 leaves a margin.)"""
    monkeypatch.setenv("MINGRU_SCAN", "triton")
    batch, steps, dim, chunk_len = 4, 4096, 512, 128
    torch.manual_seed(0)
    plain = MinGRU(dim, mode=mode, bias=False).cuda()
    lean = MinGRU(dim, mode=mode, bias=False, recompute=True, chunk_len=chunk_len).cuda()
    lean.load_state_dict(plain.state_dict())
    x = torch.randn(batch, steps, dim, device="cuda", requires_grad=True)
    grad_y = torch.randn_like(x)
    params = sum(p.numel() * p.element_size() for p in plain.parameters())
    # x, grad_y, the parameters are allocated before; y, d x and d params during the step
    least = 4 * x.numel() * x.element_size() + 2 * params
    allocated_before = x.numel() * x.element_size() * 2 + params
    peaks, grads = {}, {}
    for label, layer in (("plain", plain), ("recompute", lean)):
        _training_step_peak(layer, x, grad_y)  # warm-up: kernels compiled, plans cached
        peak, grads[label] = _training_step_peak(layer, x, grad_y)
        peaks[label] = (allocated_before + peak) / least
    assert peaks["recompute"] <= 1.2, peaks
    assert peaks["recompute"] < peaks["plain"], peaks
    for label, got, want in zip(["d x", "d W_in"], grads["recompute"], grads["plain"], strict=True):
        error = ((got - want).abs().max() / want.abs().max()).item()
        assert error <= 1e-5, f"{label}: recompute vs single pass {error:.2e}"


def _recompute_grads(layer, x, h0, weight):
    x = x.detach().requires_grad_()
    h0 = None if h0 is None else h0.detach().requires_grad_()
    y, final = layer(x, h0)
    loss = (y * weight).sum() + final.square().sum()
    inputs = [x, *([] if h0 is None else [h0]), *layer.parameters()]
    return [y.detach(), final.detach(), *torch.autograd.grad(loss, inputs)]


@marked(on_interpreter)
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    ("cls", "kwargs", "with_state"),
    [
        (MinGRU, {"mode": "log"}, True),
        (MinGRU, {"mode": "linear", "expansion": 1.5, "bias": True}, False),
        (MinLSTM, {"mode": "log", "expansion": 0.5}, True),
    ],
    ids=["gru-log-state", "gru-linear-proj-out", "lstm-log-proj-out"],
)
def test_recompute_chunks_run_the_fused_adjoint_without_autograd(cls, kwargs, with_state, dtype, monkeypatch):
    """Under the kernels a recomputed chunk's recurrence gradient comes from the plugin's adjoint
    (``GATED_ADJOINTS``: grad h as a time slice in x's dtype, d final inside the kernel), once per chunk; it
    equals the chunks differentiated by autograd (the same kernels), and a declining adjoint falls back to
    that path."""
    import mingru_triton
    from mingru.layers._common import ScalarGatedLayer

    monkeypatch.setenv("MINGRU_SCAN", "triton")
    torch.manual_seed(0)
    layer = cls(6, recompute=True, chunk_len=4, **kwargs).to(dtype)
    x = torch.randn(2, 13, 6, dtype=dtype)
    h0 = torch.randn(2, layer.hidden, dtype=torch.promote_types(dtype, torch.float32)) if with_state else None
    weight = torch.linspace(-1, 1, 6, dtype=dtype)
    kind = layer.gated_kind
    fused = mingru_triton.GATED_ADJOINTS[kind]
    calls: list[torch.dtype] = []

    def counted(pre, state, h, grad_h, d_final):
        calls.append(grad_h.dtype)
        return fused(pre, state, h, grad_h, d_final)

    monkeypatch.setitem(mingru_triton.GATED_ADJOINTS, kind, counted)
    direct = _recompute_grads(layer, x, h0, weight)
    assert calls == [dtype] * 4  # four chunks (4, 4, 4, 1), grad h in x's dtype

    def declines(*args):
        calls.append(None)
        raise mingru_triton.ScanFallback("declined for the test")

    monkeypatch.setitem(mingru_triton.GATED_ADJOINTS, kind, declines)
    fallback = _recompute_grads(layer, x, h0, weight)
    assert calls[4:] == [None] * 4
    monkeypatch.setattr(ScalarGatedLayer, "_chunk_adjoint_ok", lambda self: False)
    autograd = _recompute_grads(layer, x, h0, weight)
    tol = 1e-12 if dtype == torch.float64 else 2e-2
    for index, (a, b, c) in enumerate(zip(direct, fallback, autograd, strict=True)):
        torch.testing.assert_close(
            a, c, rtol=tol, atol=tol, msg=lambda m, i=index: f"direct, output {i}: {m}"
        )
        torch.testing.assert_close(
            b, c, rtol=tol, atol=tol, msg=lambda m, i=index: f"fallback, output {i}: {m}"
        )
