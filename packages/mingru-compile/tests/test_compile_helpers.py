"""The helpers themselves: graph breaks raise, differences are reported with where and how much."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn
from torch._subclasses.fake_tensor import DataDependentOutputException

from mingru_compile import (
    BACKENDS,
    TensorSpec,
    assert_compiles_like_eager,
    compile_fullgraph,
    fake_output_shapes,
)

pytestmark = pytest.mark.compile


def _smooth(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    return torch.tanh(x) * y, x.cumsum(1)


def _off_by_one_when_compiled(x: Tensor) -> Tensor:
    return x + 1 if torch.compiler.is_compiling() else x


def _double_gradient_when_compiled(x: Tensor) -> Tensor:
    return x + (x - x.detach()) if torch.compiler.is_compiling() else x * 1


def _with_graph_break(x: Tensor) -> Tensor:
    y = x * 2
    torch._dynamo.graph_break()
    return y + 1


def _inputs() -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(2, 3, generator=g) for _ in range(2))
    return x.requires_grad_(True), y.requires_grad_(True)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_matching_function_passes(backend: str) -> None:
    assert_compiles_like_eager(_smooth, *_inputs(), backend=backend)  # type: ignore[arg-type]


def test_module_parameters_are_differentiated() -> None:
    torch.manual_seed(0)
    assert_compiles_like_eager(nn.Linear(3, 4), torch.randn(2, 3))


def test_inputs_are_not_modified() -> None:
    x, y = _inputs()
    before = (x.detach().clone(), y.detach().clone())
    assert_compiles_like_eager(_smooth, x, y)
    assert x.grad is None and y.grad is None
    torch.testing.assert_close((x.detach(), y.detach()), before)


def test_output_difference_names_where_and_how_much() -> None:
    expected = r"(?s)output: compiled \(aot_eager\) differs from eager.*difference"
    with pytest.raises(AssertionError, match=expected):
        assert_compiles_like_eager(_off_by_one_when_compiled, _inputs()[0])


def test_gradient_difference_names_the_input() -> None:
    with pytest.raises(AssertionError, match=r"(?s)gradient of args\[0\]: compiled \(aot_eager\) differs"):
        assert_compiles_like_eager(_double_gradient_when_compiled, _inputs()[0])


def test_graph_break_raises() -> None:
    with pytest.raises(torch._dynamo.exc.Unsupported):
        compile_fullgraph(_with_graph_break, backend="eager")(torch.ones(2))


def test_unknown_backend_is_rejected() -> None:
    assert BACKENDS == ("eager", "aot_eager", "inductor")
    with pytest.raises(ValueError, match=r"backend must be one of .*got 'cudagraphs'"):
        compile_fullgraph(_smooth, backend="cudagraphs")  # type: ignore[arg-type]


def test_tolerances_come_in_pairs() -> None:
    with pytest.raises(ValueError, match="both rtol and atol or neither"):
        assert_compiles_like_eager(_smooth, *_inputs(), rtol=1e-3)


def test_gradient_check_needs_a_differentiable_input() -> None:
    with pytest.raises(ValueError, match="requires_grad=True"):
        assert_compiles_like_eager(_smooth, torch.ones(2, 3), torch.ones(2, 3))
    assert_compiles_like_eager(_smooth, torch.ones(2, 3), torch.ones(2, 3), check_grad=False)


def test_fake_cuda_outputs_on_any_machine() -> None:
    x, y = _inputs()
    first, second = fake_output_shapes(_smooth, x, y, device="cuda")
    # Without a CUDA runtime the fake run is a no_grad forward (autograd would abort the process).
    assert first == TensorSpec((2, 3), torch.float32, torch.device("cuda", 0), torch.cuda.is_available())
    assert second.device.type == "cuda"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA runtime")
def test_fake_cuda_backward_without_a_cuda_runtime_is_refused() -> None:
    with pytest.raises(ValueError, match=r"backward=True needs the runtime of every device.*\['cuda'\]"):
        fake_output_shapes(torch.exp, torch.ones(2, requires_grad=True), device="cuda", backward=True)


def test_fake_tensors_allocate_nothing() -> None:
    huge = torch.empty_strided((2**20, 2**20), (0, 0))  # 4 TiB of float32 if it were real
    (out,) = fake_output_shapes(lambda t: (t.exp(),), huge, device="cuda")
    assert out.shape == (2**20, 2**20)


def test_fake_outputs_keep_non_tensor_leaves() -> None:
    out = fake_output_shapes(lambda t: {"n": 3, "y": t[:, :1]}, torch.ones(2, 3))
    assert out["n"] == 3
    assert out["y"].shape == (2, 1)


def test_data_dependent_python_raises_on_fake_tensors() -> None:
    with pytest.raises(DataDependentOutputException):
        fake_output_shapes(lambda t: t * float(t.sum()), torch.ones(2))


def test_fake_backward_needs_a_differentiable_output() -> None:
    with pytest.raises(ValueError, match="no output requires grad"):
        fake_output_shapes(torch.exp, torch.ones(2), backward=True)
