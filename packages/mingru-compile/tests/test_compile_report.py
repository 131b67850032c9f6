"""compile_and_report and opcheck_ops themselves: the numbers they report, and their refusals on CPU."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from mingru_compile import assert_compiles_like_eager, compile_and_report, opcheck_ops, target_name
from mingru_triton.samples import OP_NAMES

pytestmark = pytest.mark.compile


def _smooth(x: Tensor) -> Tensor:
    return torch.tanh(x) * 2


def _with_break(x: Tensor) -> Tensor:
    y = x * 2
    torch._dynamo.graph_break()
    return y + 1


def test_one_graph_no_break_no_recompile_for_new_values() -> None:
    calls = [((torch.randn(2, 3, requires_grad=True),), {})]
    report = compile_and_report(_smooth, torch.randn(2, 3, requires_grad=True), backward=True, calls=calls)
    assert (report.graphs, report.graph_breaks, report.recompiles) == (1, 0, 0), report.summary()
    assert len(report.outputs) == len(report.grads) == 2
    assert report.targets("forward")["aten::tanh"] == 1
    assert len(report.backward_graphs) == 1
    assert report.custom_ops() == set()


def test_breaks_and_recompiles_are_counted_with_their_reasons() -> None:
    report = compile_and_report(
        _with_break, torch.ones(3), backend="eager", fullgraph=False, calls=[((torch.ones(4),), {})]
    )
    assert report.graphs == 4 and report.recompiles == 2, report.summary()
    assert report.graph_breaks >= 1 and any("graph_break" in r for r in report.break_reasons), (
        report.summary()
    )
    assert any("size mismatch" in r for r in report.recompile_reasons), report.summary()
    with pytest.raises(torch._dynamo.exc.Unsupported):
        compile_and_report(_with_break, torch.ones(3), backend="eager")


def test_counters_do_not_leak_between_reports() -> None:
    compile_and_report(_with_break, torch.ones(3), backend="eager", fullgraph=False)
    report = compile_and_report(_smooth, torch.ones(3), backend="eager")
    assert (report.graphs, report.graph_breaks, report.recompiles) == (1, 0, 0), report.summary()


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="backend must be one of"):
        compile_and_report(_smooth, torch.ones(3), backend="cudagraphs")
    with pytest.raises(ValueError, match="no output requires grad"):
        compile_and_report(_smooth, torch.ones(3), backward=True)
    with pytest.raises(ValueError, match="which must be one of"):
        compile_and_report(_smooth, torch.ones(3), backend="eager").targets("joint")


def test_assert_compiles_like_eager_returns_its_report() -> None:
    report = assert_compiles_like_eager(_smooth, torch.randn(2, 3, requires_grad=True))
    assert (report.graphs, report.graph_breaks) == (1, 0)
    assert len(report.grads) == 1 and report.grads[0][0] is not None


def test_target_names() -> None:
    assert target_name(torch.ops.aten.mul.Tensor) == "aten::mul"
    assert target_name(torch.ops.mingru.linear_scan_fwd.default) == "mingru::linear_scan_fwd"
    assert target_name(torch.tanh) == "torch.tanh"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_opcheck_is_skipped_with_a_reason_without_cuda() -> None:
    results = opcheck_ops()
    assert [r.op for r in results] == list(OP_NAMES)
    assert {(r.outcome, r.reason) for r in results} == {("skipped", "CUDA is not available")}


def test_opcheck_is_skipped_for_cpu_and_under_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    (cpu,) = opcheck_ops(["linear_scan_fwd"], device="cpu")
    assert cpu.outcome == "skipped" and "CUDA tensors" in cpu.reason, cpu
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    (interpreted,) = opcheck_ops(["linear_scan_fwd"], device="cuda")
    assert interpreted.outcome == "skipped" and "Triton interpreter" in interpreted.reason, interpreted
    with pytest.raises(ValueError, match="unknown mingru ops"):
        opcheck_ops(["linear_scan"])
