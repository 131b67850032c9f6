"""Every dispatched scan compiles with a full graph on CPU and matches eager, forward and backward."""

from __future__ import annotations

import pytest
import torch
from compile_cases import SCAN_CASES, ScanCase, scan_params

from mingru import min_gru
from mingru_compile import assert_compiles_like_eager, compile_fullgraph

pytestmark = pytest.mark.compile
CASES = {case.name: case for case in SCAN_CASES}


@pytest.mark.parametrize("case", scan_params())
def test_scan_compiles_like_eager(case: ScanCase) -> None:
    assert_compiles_like_eager(case.fn, *case.args(), kwargs=case.kwargs, backend="aot_eager")


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["parallel_scan_log", "linear_scan", "diag_scan", "angle_scan"])
def test_scan_compiles_like_eager_in_other_dtypes(name: str, dtype: torch.dtype) -> None:
    case = CASES[name]
    assert_compiles_like_eager(case.fn, *case.args(dtype), kwargs=case.kwargs, backend="aot_eager")


@pytest.mark.parametrize("name", ["parallel_scan_log", "affine_scan"])
def test_scan_compiles_like_eager_with_mingru_scan_eager(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINGRU_SCAN", "eager")
    case = CASES[name]
    assert_compiles_like_eager(case.fn, *case.args(), kwargs=case.kwargs, backend="aot_eager")


def test_mingru_scan_triton_raises_at_trace_time_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINGRU_SCAN", "triton")
    a, b = CASES["linear_scan"].args()
    with pytest.raises(RuntimeError) as raised:
        compile_fullgraph(min_gru.linear_scan, backend="eager")(a, b)
    # Newer torch re-raises the dispatch's own error; torch 2.8 reports it as a Dynamo "Observed exception"
    # that names the raising frame instead.
    assert "MINGRU_SCAN=triton" in str(raised.value) or "_dispatch_scan" in str(raised.value), raised.value


def test_new_values_of_the_same_shape_do_not_recompile() -> None:
    case = CASES["linear_recurrence"]
    compiled = compile_fullgraph(case.fn, backend="aot_eager")
    compiled(*case.args(seed=0))
    with torch.compiler.set_stance("fail_on_recompile"):
        compiled(*case.args(seed=1))


@pytest.mark.slow
def test_linear_scan_compiles_like_eager_with_inductor() -> None:
    case = CASES["linear_scan"]
    assert_compiles_like_eager(case.fn, *case.args(), backend="inductor", rtol=1e-5, atol=1e-5)
