"""Every layer on the eager references (MINGRU_SCAN=eager) compiles once for a changing sequence length.

With ``dynamic=True`` (or ``mark_dynamic`` on T) the compiled forward and backward equal eager ones at every
length, in one graph, with no break and no recompilation. The references' doubling scans run inside the
custom ops ``mingru_ref::*`` (one graph node whatever T is); traced inline, their ceil(log2 T) steps would
make Dynamo guard T into a power-of-two range and compile a graph per range. The lengths therefore span
several such ranges, including T = 2^j and 2^j + 1 (whose last doubling step works on one slot).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from compile_cases import B, layer_input, layer_params, layer_state, make_layer, make_lm
from torch import Tensor, nn

from mingru_compile import compile_and_report

pytestmark = pytest.mark.compile
LENGTHS = (5, 9, 16, 17, 40)


@pytest.fixture(autouse=True)
def eager_references(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINGRU_SCAN", "eager")


def _weighted_grads(module: nn.Module, out: Any, inputs: list[Tensor]) -> tuple[Tensor | None, ...]:
    """Gradients of sum_i <out_i, w_i> (w_i fixed) w.r.t. ``inputs`` and the module's parameters."""
    generator = torch.Generator().manual_seed(0)
    loss = sum(
        (t * torch.randn(t.shape, generator=generator, dtype=torch.float64).to(t)).sum()
        for t in torch.utils._pytree.tree_flatten(out)[0]
        if isinstance(t, Tensor) and t.requires_grad
    )
    wrt = [*inputs, *module.parameters()]
    return torch.autograd.grad(loss, wrt, allow_unused=True)  # type: ignore[arg-type]


def _check_lengths(name: str, backend: str) -> None:
    layer = make_layer(name)
    calls = [((layer_input(length=t), layer_state(layer)), {}) for t in LENGTHS]
    report = compile_and_report(
        layer, *calls[0][0], backend=backend, dynamic=True, backward=True, calls=calls[1:]
    )
    for (args, _), out, grads in zip(calls, report.outputs, report.grads, strict=True):
        expected = layer(*args)
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(grads, _weighted_grads(layer, expected, list(args)))
    assert report.graph_breaks == 0, report.summary()
    assert (report.graphs, report.recompiles) == (1, 0), report.summary()
    if backend == "aot_eager":
        assert len(report.backward_graphs) == 1, "one backward graph for every length"


@pytest.mark.parametrize("name", layer_params())
def test_layer_compiles_once_for_changing_lengths(name: str) -> None:
    """Dynamo's graph (backend "eager"); the backward runs through eager autograd of that graph."""
    _check_lengths(name, "eager")


@pytest.mark.parametrize("name", ["MinGRU-linear", "MinGRUDiag"])
def test_layer_compiled_backward_serves_changing_lengths(name: str) -> None:
    """AOTAutograd traces forward and backward once with a symbolic T (the slow part: two layers only)."""
    _check_lengths(name, "aot_eager")


@pytest.mark.parametrize("name", ["MinGRU-log", "MinGRUDiag", "MinGRUMatrix"])
def test_mark_dynamic_sequence_length_never_specializes(name: str) -> None:
    layer = make_layer(name)
    inputs = [layer_input(length=t) for t in LENGTHS]
    for x in inputs:
        torch._dynamo.mark_dynamic(x, 1)
    report = compile_and_report(layer, inputs[0], backend="eager", calls=[((x,), {}) for x in inputs[1:]])
    assert (report.graphs, report.graph_breaks, report.recompiles) == (1, 0, 0), report.summary()
    for x, (y, _) in zip(inputs, report.outputs, strict=True):
        assert y.shape == (B, x.shape[1], x.shape[2])
        torch.testing.assert_close(y, layer(x)[0])


def test_language_model_compiles_once_for_changing_lengths() -> None:
    model = make_lm("diag")
    generator = torch.Generator().manual_seed(0)
    tokens = [torch.randint(0, model.num_tokens, (B, t), generator=generator) for t in LENGTHS]
    report = compile_and_report(
        model, tokens[0], backend="eager", dynamic=True, backward=True, calls=[((t,), {}) for t in tokens[1:]]
    )
    assert (report.graphs, report.graph_breaks, report.recompiles) == (1, 0, 0), report.summary()
    for t, (logits, _) in zip(tokens, report.outputs, strict=True):
        torch.testing.assert_close(logits, model(t)[0])


def test_automatic_dynamic_recompiles_once_then_holds() -> None:
    """Without ``dynamic``: the second length recompiles with a symbolic T, the third reuses that graph."""
    layer = make_layer("MinGRU-linear")
    calls = [((layer_input(length=t),), {}) for t in LENGTHS[1:]]
    report = compile_and_report(layer, layer_input(length=LENGTHS[0]), backend="eager", calls=calls)
    assert (report.graphs, report.recompiles) == (2, 1), report.summary()
    assert any("size mismatch at index 1" in reason for reason in report.recompile_reasons), report.summary()


def test_length_equal_to_a_state_size() -> None:
    """With ``dynamic=True``, Dynamo gives equal input sizes one symbol ("duck shaping"): T = 3 beside an
    initial state (B, n, 3, 3) ties T to the state size, which the layer's shape check fixes at 3, so the
    next length recompiles. ``mark_dynamic`` on T alone keeps one graph (the way docs/dispatch.md gives)."""
    layer = make_layer("MinGRUMatrix")
    h0 = layer_state(layer)
    assert h0.shape[-2] == 3
    inputs = [layer_input(length=t) for t in (3, 9)]
    report = compile_and_report(
        layer, inputs[0], h0, backend="eager", dynamic=True, calls=[((inputs[1], h0), {})]
    )
    assert (report.graphs, report.recompiles) == (2, 1), report.summary()
    for x in inputs:
        torch._dynamo.mark_dynamic(x, 1)
    report = compile_and_report(layer, inputs[0], h0, backend="eager", calls=[((inputs[1], h0), {})])
    assert (report.graphs, report.graph_breaks, report.recompiles) == (1, 0, 0), report.summary()
    for x, (y, _) in zip(inputs, report.outputs, strict=True):
        torch.testing.assert_close(y, layer(x, h0)[0])


REFERENCE_OPS = {
    "MinGRU-linear": "linear_scan",
    "MinGRU-log": "parallel_scan_log",
    "MinGRUMatrix": "affine_scan",
    "MinGRUDiag": "diag_scan",
}


@pytest.mark.parametrize(("name", "op"), REFERENCE_OPS.items())
def test_reference_scans_are_single_graph_nodes(name: str, op: str) -> None:
    """The eager scans enter the graphs as ``mingru_ref`` custom ops, forward and backward; no kernel op."""
    layer = make_layer(name)
    x = layer_input(length=LENGTHS[0])
    report = compile_and_report(layer, x, backend="aot_eager", dynamic=True, backward=True)
    assert report.custom_ops("mingru_ref") == {f"mingru_ref::{op}_fwd"}, report.targets()
    assert report.custom_ops("mingru_ref", "backward") == {f"mingru_ref::{op}_bwd"}
    assert not report.custom_ops("mingru"), report.targets()
