"""On a CUDA device: every op and every layer compiles with fullgraph=True around the Triton kernels.

One graph, no break, results and gradients equal to eager (which runs the same kernels); opcheck passes for
every op; a compiled MinGRULM trains; the dispatch decision is taken at trace time (``MINGRU_SCAN=eager`` and
``auto`` give different graphs, and an input outside a kernel's envelope compiles to the reference).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from compile_cases import DIM, B, layer_input, layer_params, layer_state, make_layer, make_lm
from torch import Tensor
from torch.nn import functional as F

from mingru import dispatch, min_gru
from mingru_compile import assert_compiles_like_eager, compile_and_report, opcheck_ops
from mingru_triton.samples import BACKWARD_OPS, FORWARD_OPS, OP_NAMES, sample_inputs

pytestmark = [
    pytest.mark.compile,
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (real Triton kernels)"),
]
CUDA = "cuda"
KERNEL_OP = {  # the op each layer's forward runs on CUDA
    "MinGRU-log": "gated_recurrence_fwd",  # gates and scan fused (mingru_triton.gated)
    "MinGRU-linear": "gated_recurrence_fwd",
    "MinGRU-linear-negative": "gated_recurrence_fwd",
    "MinLSTM-log": "gated_recurrence_fwd",
    "MinLSTM-linear": "gated_recurrence_fwd",
    "MinGRUMatrix": "affine_recurrence_fwd",
    "MinGRUDiag": "diag_recurrence_fwd",
    "MinGRUAngle": "angle_scan_fwd",
    "MinGRUAngle-reflect-plain": "angle_scan_fwd",
}
TOLERANCE = {"aot_eager": (1e-5, 1e-5), "inductor": (1e-4, 1e-4)}  # inductor may reorder the projections


def _op(name: str) -> Any:
    return getattr(torch.ops.mingru, name).default


def _on_cuda(x: Tensor) -> Tensor:
    return x.detach().to(CUDA).requires_grad_(x.requires_grad)


@pytest.fixture
def triton_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """MINGRU_SCAN=triton: a reference anywhere raises instead of passing silently."""
    monkeypatch.setenv("MINGRU_SCAN", "triton")


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("name", OP_NAMES)
def test_op_compiles_in_one_graph_like_eager(name: str, backend: str) -> None:
    args, kwargs = sample_inputs(name, CUDA)[0]
    op = _op(name)
    rtol, atol = TOLERANCE[backend]
    report = assert_compiles_like_eager(
        lambda *a: op(*a, **kwargs),
        *args,
        backend=backend,
        rtol=rtol,
        atol=atol,
        check_grad=name in FORWARD_OPS,
    )
    assert (report.graphs, report.graph_breaks) == (1, 0), report.summary()
    assert report.custom_ops() == {f"mingru::{name}"}
    if backend == "aot_eager":  # AOTAutograd decomposes the op into its kernel launches
        assert report.kernel_launches("forward") >= 1, report.targets("forward")
        if name in FORWARD_OPS:
            assert report.kernel_launches("backward") >= 1, report.targets("backward")


@pytest.mark.parametrize("name", OP_NAMES)
def test_opcheck_passes(name: str) -> None:
    results = opcheck_ops([name], device=CUDA)
    assert results and all(r.outcome == "passed" for r in results), "\n".join(map(str, results))


def test_opcheck_in_half_precision() -> None:
    results = opcheck_ops(FORWARD_OPS, device=CUDA, dtype=torch.bfloat16)
    assert all(r.outcome == "passed" for r in results), "\n".join(
        str(r) for r in results if r.outcome != "passed"
    )


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("name", layer_params())
def test_layer_compiles_around_the_kernels_like_eager(name: str, backend: str, triton_only: None) -> None:
    layer = make_layer(name).to(CUDA)
    x, h0 = _on_cuda(layer_input()), _on_cuda(layer_state(layer))
    rtol, atol = TOLERANCE[backend]
    report = assert_compiles_like_eager(layer, x, h0, backend=backend, rtol=rtol, atol=atol)
    assert (report.graphs, report.graph_breaks) == (1, 0), report.summary()
    assert report.custom_ops() == {f"mingru::{KERNEL_OP[name]}"}, report.targets()
    if backend == "aot_eager":
        assert report.kernel_launches("forward") >= 1 and report.kernel_launches("backward") >= 1


@pytest.mark.parametrize("name", ["MinGRU-log", "MinGRUDiag", "MinGRUMatrix", "MinGRUAngle"])
def test_layer_compiles_once_for_changing_lengths_on_the_kernels(name: str, triton_only: None) -> None:
    """The kernels take any T: with dynamic=True one graph serves every length (no doubling buckets)."""
    layer = make_layer(name).to(CUDA)
    inputs = [_on_cuda(layer_input(length=t)) for t in (6, 12, 40)]
    report = compile_and_report(
        layer,
        inputs[0],
        backend="aot_eager",
        dynamic=True,
        backward=True,
        calls=[((x,), {}) for x in inputs[1:]],
    )
    assert (report.graphs, report.graph_breaks, report.recompiles) == (1, 0, 0), report.summary()
    for x, (y, _) in zip(inputs, report.outputs, strict=True):
        torch.testing.assert_close(y, layer(x)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layer", ["mingru", "angle"])
def test_compiled_language_model_trains(layer: str, triton_only: None) -> None:
    model = make_lm(layer).to(CUDA)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.num_tokens, (B, 17), generator=generator).to(CUDA)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    report = compile_and_report(model, inputs, backend="inductor")  # the first step's forward, compiled
    assert (report.graphs, report.graph_breaks) == (1, 0), report.summary()
    compiled = torch.compile(model, fullgraph=True, backend="inductor")
    losses = []
    for _ in range(8):
        logits, _ = compiled(inputs)
        loss = F.cross_entropy(logits.reshape(-1, model.num_tokens), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))), losses
    assert losses[-1] < losses[0], losses
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize(
    ("scan", "op"), [("linear", "linear_scan_fwd"), ("layer", "gated_recurrence_fwd")], ids=["scan", "layer"]
)
def test_mingru_scan_eager_and_auto_compile_to_different_graphs(
    scan: str, op: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if scan == "layer":
        fn: Any = make_layer("MinGRU-linear").to(CUDA)
        args: tuple[Tensor, ...] = (_on_cuda(layer_input()),)
    else:
        fn = min_gru.linear_scan
        args = tuple(torch.randn(B, 9, DIM, device=CUDA, requires_grad=True) for _ in range(2))
    graphs = {}
    for mode in ("auto", "eager"):
        monkeypatch.setenv("MINGRU_SCAN", mode)
        graphs[mode] = compile_and_report(fn, *args, backend="aot_eager", backward=True)
        assert (graphs[mode].graphs, graphs[mode].graph_breaks) == (1, 0), graphs[mode].summary()
    assert graphs["auto"].custom_ops() == {f"mingru::{op}"}
    assert graphs["eager"].custom_ops() == set()
    assert graphs["auto"].kernel_launches("backward") >= 1
    assert graphs["eager"].kernel_launches("forward") == graphs["eager"].kernel_launches("backward") == 0
    assert graphs["auto"].targets() != graphs["eager"].targets()
    torch.testing.assert_close(graphs["auto"].outputs, graphs["eager"].outputs, rtol=1e-5, atol=1e-5)


def _affine_outside_the_envelope() -> tuple[Tensor, Tensor]:
    k = 33  # the affine kernel takes k <= 32
    A = (torch.randn(B, 5, 1, k, k, device=CUDA) / k).requires_grad_(True)
    Bm = torch.randn(B, 5, 1, k, 2, device=CUDA, requires_grad=True)
    return A, Bm


def test_envelope_case_compiles_to_the_reference_without_a_break(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        dispatch, "_WARNED", set()
    )  # the fallback warns once per process: reset for this test
    A, Bm = _affine_outside_the_envelope()
    with pytest.warns(
        RuntimeWarning, match=r"the 'affine' scan runs its eager reference: k must be in \[1, 32\]"
    ):
        report = compile_and_report(min_gru.affine_scan, A, Bm, backend="aot_eager", backward=True)
    assert (report.graphs, report.graph_breaks) == (1, 0), report.summary()
    assert report.custom_ops() == set()
    assert report.kernel_launches("forward") == report.kernel_launches("backward") == 0
    monkeypatch.setenv("MINGRU_SCAN", "eager")
    expected = min_gru.affine_scan(A, Bm)
    torch.testing.assert_close(report.outputs[0], expected, rtol=1e-5, atol=1e-5)


def test_envelope_case_under_mingru_scan_triton_raises_at_trace_time(triton_only: None) -> None:
    A, Bm = _affine_outside_the_envelope()
    with pytest.raises(RuntimeError) as raised:
        compile_and_report(min_gru.affine_scan, A, Bm, backend="eager")
    # torch 2.8 reports the dispatch's error as a Dynamo "Observed exception" naming the raising frame.
    assert "k must be in [1, 32]" in str(raised.value) or "_run" in str(raised.value), raised.value


@pytest.mark.parametrize("name", FORWARD_OPS)
def test_compiled_backward_of_each_op_launches_kernels_only(name: str) -> None:
    """The backward graph of each forward op holds the launches of its _bwd op's kernels and no eager scan."""
    assert name.replace("_fwd", "_bwd") in BACKWARD_OPS
    args, kwargs = sample_inputs(name, CUDA)[0]
    op = _op(name)
    report = compile_and_report(lambda *a: op(*a, **kwargs), *args, backward=True)
    assert report.kernel_launches("backward") >= 1, report.targets("backward")
    assert not {t for t in report.targets("backward") if t.startswith(("aten::cumsum", "aten::cumprod"))}
