"""Shapes, dtypes and devices of every scan and layer on fake CPU and fake CUDA tensors.

On a machine without CUDA, fake CUDA tensors still trace: the dispatch sees CUDA tensors, the plugin reports
itself unavailable, and ``auto`` runs the eager reference (warning once, which is silenced here).
"""

from __future__ import annotations

import pytest
import torch
from compile_cases import (
    DIM,
    SCAN_CASES,
    B,
    ScanCase,
    T,
    layer_input,
    layer_params,
    layer_state,
    make_layer,
    make_lm,
)
from torch.utils._pytree import tree_flatten

import mingru
from mingru import min_gru
from mingru_compile import TensorSpec, fake_output_shapes

pytestmark = [
    pytest.mark.compile,
    pytest.mark.filterwarnings("ignore:mingru. the .* scan runs its eager reference"),
]
DEVICES = ["cpu", "cuda"]


def _backward_possible(device: str) -> bool:
    """Autograd on fake tensors needs the device's runtime (see fake_output_shapes)."""
    return device == "cpu" or torch.cuda.is_available()


def _real_specs(out: object) -> list[tuple[tuple[int, ...], torch.dtype]]:
    return [(tuple(t.shape), t.dtype) for t in tree_flatten(out)[0]]


def _fake_specs(out: object, device: str) -> list[tuple[tuple[int, ...], torch.dtype]]:
    leaves = tree_flatten(out)[0]
    assert all(isinstance(spec, TensorSpec) for spec in leaves), leaves
    assert all(spec.device.type == device for spec in leaves), [spec.device for spec in leaves]
    return [(spec.shape, spec.dtype) for spec in leaves]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in SCAN_CASES])
def test_scan_shapes_on_fake_tensors(case: ScanCase, device: str) -> None:
    args = case.args()
    expected = _real_specs(case.fn(*args, **case.kwargs))
    fake = fake_output_shapes(
        case.fn, *args, kwargs=case.kwargs, device=device, backward=_backward_possible(device)
    )
    assert _fake_specs(fake, device) == expected


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64], ids=str)
def test_scan_output_dtype_follows_the_input_on_fake_cuda(dtype: torch.dtype) -> None:
    case = next(c for c in SCAN_CASES if c.name == "linear_scan")
    A, Bc = fake_output_shapes(case.fn, *case.args(dtype), device="cuda")
    assert A.dtype == Bc.dtype == dtype


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", layer_params())
def test_layer_shapes_on_fake_tensors(name: str, device: str) -> None:
    layer = make_layer(name)
    y, state = fake_output_shapes(
        layer, layer_input(), layer_state(layer), device=device, backward=_backward_possible(device)
    )
    assert (y.shape, y.dtype, y.device.type) == ((B, T, DIM), torch.float32, device)
    assert (state.shape, state.dtype, state.device.type) == ((B, *layer.state_shape), torch.float32, device)


@pytest.mark.parametrize("device", DEVICES)
def test_language_model_shapes_on_fake_tensors(device: str) -> None:
    model = make_lm("matrix")
    tokens = torch.randint(0, model.num_tokens, (B, T))
    logits, states = fake_output_shapes(model, tokens, device=device, backward=_backward_possible(device))
    assert (logits.shape, logits.device.type) == ((B, T, model.num_tokens), device)
    assert len(states) == model.depth


def test_fake_cuda_dispatch_runs_the_reference_where_kernels_are_unavailable() -> None:
    if mingru.triton_scans.available() is True:
        pytest.skip("Triton kernels are available here; the fake CUDA run may take the kernel path")
    a, b = (torch.randn(B, T, DIM) for _ in range(2))
    A, Bc = fake_output_shapes(min_gru.linear_scan, a, b, device="cuda")
    assert A.shape == Bc.shape == (B, T, DIM)
    assert mingru.explain_scan("linear", a, b).impl == "eager"


def test_scan_shapes_beyond_memory_on_fake_cuda() -> None:
    batch, length, width = 4, 2**20, 1024  # 2**32 elements per tensor: 8 GiB in fp16 if it were real
    a = torch.empty_strided((batch, length, width), (0, 0, 0), dtype=torch.float16)
    log_coeffs = torch.empty_strided((batch, length, width), (0, 0, 0))
    log_values = torch.empty_strided((batch, length + 1, width), (0, 0, 0))
    A, Bc = fake_output_shapes(min_gru.linear_scan, a, a, device="cuda")
    h = fake_output_shapes(min_gru.parallel_scan_log, log_coeffs, log_values, device="cuda")
    assert A.shape == Bc.shape == h.shape == (batch, length, width)
