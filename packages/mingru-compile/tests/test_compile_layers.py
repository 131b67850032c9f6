"""Every layer compiles with a full graph on CPU and matches eager: forward, step and their gradients."""

from __future__ import annotations

import pytest
import torch
from compile_cases import DIM, B, T, layer_input, layer_params, layer_state, make_layer, make_lm

from mingru_compile import assert_compiles_like_eager

pytestmark = pytest.mark.compile


@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "given-state"])
@pytest.mark.parametrize("name", layer_params())
def test_layer_forward_compiles_like_eager(name: str, with_state: bool) -> None:
    layer = make_layer(name)
    args = (layer_input(), layer_state(layer)) if with_state else (layer_input(),)
    assert_compiles_like_eager(layer, *args, backend="aot_eager")


@pytest.mark.parametrize("name", layer_params())
def test_layer_step_compiles_like_eager(name: str) -> None:
    layer = make_layer(name)
    x_t = layer_input(length=1)[:, 0].detach().requires_grad_(True)
    assert_compiles_like_eager(layer.step, x_t, layer_state(layer), backend="aot_eager")


@pytest.mark.parametrize("name", ["MinGRU-log", "MinGRUAngle"])
def test_bfloat16_layer_compiles_like_eager(name: str) -> None:
    layer = make_layer(name).to(torch.bfloat16)
    assert_compiles_like_eager(layer, layer_input(torch.bfloat16), backend="aot_eager")


@pytest.mark.parametrize("layer", ["mingru", "angle"])
def test_language_model_compiles_like_eager(layer: str) -> None:
    model = make_lm(layer)
    tokens = torch.randint(0, model.num_tokens, (B, T), generator=torch.Generator().manual_seed(0))
    assert_compiles_like_eager(model, tokens, backend="aot_eager")


def test_layer_output_shapes_under_compile() -> None:
    layer = make_layer("MinGRUDiag")
    y, state = torch.compile(layer, fullgraph=True, backend="eager")(layer_input())
    assert y.shape == (B, T, DIM)
    assert state.shape == (B, *layer.state_shape)
    assert state.dtype == torch.float32
