"""Layers with ``recompute=True`` compile to one graph and match eager; the compiled backward recomputes
each chunk's projection (its matmuls appear again there), on CPU and around the kernels on CUDA."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from compile_cases import DIM, layer_input, layer_state

from mingru.layers import MinGRU, MinGRUAngle, MinGRUMatrix
from mingru_compile import assert_compiles_like_eager, compile_and_report

pytestmark = pytest.mark.compile

STEPS, CHUNK = 7, 3  # three chunks, the last one short
FACTORIES: dict[str, Any] = {
    "MinGRU-log": lambda **kw: MinGRU(DIM, **kw),
    "MinGRU-linear": lambda **kw: MinGRU(DIM, mode="linear", **kw),
    "MinGRUMatrix": lambda **kw: MinGRUMatrix(DIM, heads=2, head_dim=3, **kw),
    "MinGRUAngle": lambda **kw: MinGRUAngle(DIM, heads=2, head_dim=4, rotation_layers=2, **kw),
}
KERNEL_OP = {
    "MinGRU-log": "gated_recurrence_fwd",
    "MinGRU-linear": "gated_recurrence_fwd",
    "MinGRUMatrix": "affine_recurrence_fwd",
    "MinGRUAngle": "angle_scan_fwd",
}


def _layer(name: str, recompute: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    kwargs = {"recompute": True, "chunk_len": CHUNK} if recompute else {}
    return FACTORIES[name](**kwargs)


def _projections(report: Any, which: str) -> int:
    """Matrix products in the ``which`` graph of AOTAutograd (the Linear layers decompose to mm/addmm)."""
    return sum(n for op, n in report.targets(which).items() if op in ("aten::mm", "aten::addmm"))


@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "given-state"])
@pytest.mark.parametrize("name", list(FACTORIES))
def test_recompute_layer_compiles_like_eager_and_recomputes(name: str, with_state: bool) -> None:
    layer = _layer(name, recompute=True)
    x = layer_input(length=STEPS)
    args = (x, layer_state(layer)) if with_state else (x,)
    report = assert_compiles_like_eager(layer, *args, backend="aot_eager", rtol=1e-5, atol=1e-5)
    assert (report.graphs, report.graph_breaks) == (1, 0), report.summary()
    plain = compile_and_report(_layer(name, recompute=False), *args, backend="aot_eager", backward=True)
    # each chunk's forward projections run again in the backward, beside their gradients
    assert _projections(report, "backward") > _projections(plain, "backward"), (
        report.targets("backward"),
        plain.targets("backward"),
    )
    torch.testing.assert_close(report.outputs[0][0], plain.outputs[0][0], rtol=1e-5, atol=1e-5)


def test_recompute_compiled_for_changing_lengths_stays_right() -> None:
    """A Python loop over the chunks: a changing length recompiles (the chunk count and the short last chunk
    are guarded), without a graph break, and every length gives eager's values."""
    layer = _layer("MinGRU-linear", recompute=True)
    inputs = [layer_input(length=t) for t in (8, 9, 7, 12)]
    report = compile_and_report(
        layer, inputs[0], backend="eager", dynamic=True, calls=[((x,), {}) for x in inputs[1:]]
    )
    assert report.graph_breaks == 0 and report.graphs <= len(inputs), report.summary()
    for x, (y, _) in zip(inputs, report.outputs, strict=True):
        torch.testing.assert_close(y, layer(x)[0])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (real Triton kernels)")
@pytest.mark.parametrize("name", list(FACTORIES))
def test_recompute_layer_compiles_around_the_kernels(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINGRU_SCAN", "triton")
    layer = _layer(name, recompute=True).cuda()
    x = layer_input(length=STEPS).detach().cuda().requires_grad_()
    h0 = layer_state(layer).detach().cuda().requires_grad_()
    report = assert_compiles_like_eager(layer, x, h0, backend="aot_eager", rtol=1e-5, atol=1e-5)
    assert (report.graphs, report.graph_breaks) == (1, 0), report.summary()
    assert report.custom_ops() == {f"mingru::{KERNEL_OP[name]}"}, report.targets()
    assert report.kernel_launches("backward") >= 1
