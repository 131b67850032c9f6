"""The contract of every recurrent layer: step == forward, chunking, state gradients, dtypes, validation."""

from __future__ import annotations

import copy

import pytest
import torch

from mingru.layers import MinGRU, MinGRUAngle, MinGRUDiag, MinGRUMatrix, MinLSTM

DIM = 6
CASES = {
    "mingru-log": (MinGRU, {"mode": "log"}),
    "mingru-linear": (MinGRU, {"mode": "linear"}),
    "mingru-linear-negative": (MinGRU, {"mode": "linear", "negative_gates": True}),
    "mingru-log-expansion1.5": (MinGRU, {"mode": "log", "expansion": 1.5}),
    "mingru-linear-nobias": (MinGRU, {"mode": "linear", "bias": False}),
    "minlstm-log": (MinLSTM, {"mode": "log"}),
    "minlstm-linear": (MinLSTM, {"mode": "linear"}),
    "minlstm-log-expansion0.5": (MinLSTM, {"mode": "log", "expansion": 0.5}),
    "matrix-h2-k3": (MinGRUMatrix, {"heads": 2, "head_dim": 3}),
    "matrix-h1-k2-v5": (MinGRUMatrix, {"heads": 1, "head_dim": 2, "value_dim": 5}),
    "diag-h2-k3": (MinGRUDiag, {"heads": 2, "head_dim": 3}),
    "diag-h3-k2-v4": (MinGRUDiag, {"heads": 3, "head_dim": 2, "value_dim": 4}),
    "angle-h2-k4-R2": (MinGRUAngle, {"heads": 2, "head_dim": 4}),
    "angle-h2-k6-R3-reflect": (
        MinGRUAngle,
        {"heads": 2, "head_dim": 6, "rotation_layers": 3, "reflect": True},
    ),
    "angle-noscale-nodecay": (
        MinGRUAngle,
        {"heads": 2, "head_dim": 4, "use_scale": False, "use_decay": False},
    ),
    "angle-scale-only": (MinGRUAngle, {"heads": 1, "head_dim": 2, "rotation_layers": 1, "use_decay": False}),
    "angle-decay-only": (MinGRUAngle, {"heads": 2, "head_dim": 4, "use_scale": False}),
}
TINY = {
    "mingru-log": (MinGRU, {"mode": "log"}),
    "mingru-linear-negative": (MinGRU, {"mode": "linear", "negative_gates": True}),
    "minlstm-log": (MinLSTM, {"mode": "log"}),
    "minlstm-linear-expansion2": (MinLSTM, {"mode": "linear", "expansion": 2.0}),
    "matrix": (MinGRUMatrix, {"heads": 2, "head_dim": 2}),
    "diag": (MinGRUDiag, {"heads": 2, "head_dim": 2, "value_dim": 1}),
    "angle": (MinGRUAngle, {"heads": 1, "head_dim": 4, "reflect": True}),
}
case = pytest.mark.parametrize("name", list(CASES))


def make(name: str, dtype: torch.dtype = torch.float64, dim: int = DIM, cases: dict = CASES, seed: int = 0):
    cls, kwargs = cases[name]
    torch.manual_seed(seed)
    return cls(dim, **kwargs).to(dtype)


def random_state(layer, batch: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn((batch, *layer.state_shape), dtype=dtype)


def run_steps(layer, x: torch.Tensor, state=None):
    ys = []
    for t in range(x.shape[1]):
        y, state = layer.step(x[:, t], state)
        ys.append(y)
    return torch.stack(ys, dim=1), state


@case
@pytest.mark.parametrize("steps", [1, 2, 7], ids=lambda t: f"T{t}")
def test_forward_shapes_and_state_dtype(name, steps):
    layer = make(name, torch.float32)
    y, state = layer(torch.randn(3, steps, DIM))
    assert y.shape == (3, steps, DIM) and y.dtype == torch.float32
    assert state.shape == layer.init_state(3).shape == (3, *layer.state_shape)
    assert state.dtype == torch.float32


@case
@pytest.mark.parametrize("steps", [1, 7], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "given-state"])
def test_step_equals_forward_fp64(name, steps, with_state):
    layer = make(name)
    x = torch.randn(2, steps, DIM, dtype=torch.float64)
    h0 = random_state(layer, 2) if with_state else None
    y, final = layer(x, h0)
    y_steps, final_steps = run_steps(layer, x, h0)
    torch.testing.assert_close(y_steps, y, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final_steps, final, rtol=1e-10, atol=1e-10)


@case
def test_step_equals_forward_fp32(name):
    layer = make(name, torch.float32)
    x = torch.randn(2, 9, DIM)
    h0 = random_state(layer, 2, torch.float32)
    y, final = layer(x, h0)
    y_steps, final_steps = run_steps(layer, x, h0)
    torch.testing.assert_close(y_steps, y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final_steps, final, rtol=1e-5, atol=1e-5)


@case
@pytest.mark.parametrize("cuts", [(1,), (4,), (2, 3)], ids=lambda c: "cut" + "-".join(map(str, c)))
def test_chunked_equals_one_pass_with_gradients(name, cuts):
    layer = make(name)
    x = torch.randn(2, 7, DIM, dtype=torch.float64, requires_grad=True)
    h0 = random_state(layer, 2).requires_grad_()
    y_weight = torch.randn(2, 7, DIM, dtype=torch.float64)
    h_weight = torch.randn_like(h0)

    def loss_and_grads(y, final):
        loss = (y * y_weight).sum() + (final * h_weight).sum()
        return torch.autograd.grad(loss, [x, h0, *layer.parameters()])

    y_whole, final_whole = layer(x, h0)
    grads_whole = loss_and_grads(y_whole, final_whole)

    pieces, state, start = [], h0, 0
    for stop in (*cuts, x.shape[1]):
        y, state = layer(x[:, start:stop], state)
        pieces.append(y)
        start = stop
    y_chunked = torch.cat(pieces, dim=1)
    grads_chunked = loss_and_grads(y_chunked, state)

    torch.testing.assert_close(y_chunked, y_whole, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(state, final_whole, rtol=1e-10, atol=1e-10)
    for got, want in zip(grads_chunked, grads_whole, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", list(TINY))
def test_gradcheck_input_and_state(name):
    layer = make(name, dim=3, cases=TINY)
    x = torch.randn(2, 3, 3, dtype=torch.float64, requires_grad=True)
    h0 = random_state(layer, 2).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, h0: layer(x, h0), (x, h0))


@pytest.mark.parametrize("name", list(TINY))
def test_gradcheck_step(name):
    layer = make(name, dim=3, cases=TINY)
    x_t = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    h = random_state(layer, 2).requires_grad_()
    assert torch.autograd.gradcheck(lambda x_t, h: layer.step(x_t, h), (x_t, h))


@case
def test_bf16_input_keeps_fp32_state(name):
    reference = make(name, torch.float32)
    layer = copy.deepcopy(reference).to(torch.bfloat16)
    x = torch.randn(2, 9, DIM).to(torch.bfloat16)
    h0 = 0.5 * random_state(layer, 2, torch.float32)

    y, final = layer(x, h0)
    assert y.dtype == torch.bfloat16 and final.dtype == torch.float32
    y_ref, final_ref = reference.to(torch.float32)(x.float(), h0)
    # the bf16 layer rounds weights and projections; the recurrence itself runs in fp32
    torch.testing.assert_close(y.float(), y_ref, rtol=0.05, atol=0.05)
    torch.testing.assert_close(final, final_ref, rtol=0.05, atol=0.05)

    y_t, state = layer.step(x[:, 0], h0.to(torch.bfloat16))
    assert y_t.dtype == torch.bfloat16 and state.dtype == torch.float32
    _, final_steps = run_steps(layer, x, h0)
    assert final_steps.dtype == torch.float32
    torch.testing.assert_close(final_steps, final, rtol=1e-2, atol=1e-2)


@case
def test_empty_sequence_returns_the_state(name):
    layer = make(name, torch.float32)
    h0 = random_state(layer, 2, torch.float32)
    y, final = layer(torch.randn(2, 0, DIM), h0)
    assert y.shape == (2, 0, DIM)
    torch.testing.assert_close(final, h0)
    _, final = layer(torch.randn(2, 0, DIM))
    torch.testing.assert_close(final, layer.init_state(2))


@case
def test_init_state(name):
    layer = make(name, torch.float32)
    state = layer.init_state(4, device="cpu")
    assert state.shape == (4, *layer.state_shape) and state.dtype == torch.float32
    assert not state.any()
    assert layer.init_state(1, dtype=torch.float64).dtype == torch.float64
    assert layer.init_state(0).shape == (0, *layer.state_shape)
    with pytest.raises(
        ValueError, match=rf"{type(layer).__name__}\.init_state: batch must be an int >= 0; got -1"
    ):
        layer.init_state(-1)


@case
def test_zero_state_equals_no_state(name):
    layer = make(name)
    x = torch.randn(2, 5, DIM, dtype=torch.float64)
    y_none, final_none = layer(x)
    y_zero, final_zero = layer(x, layer.init_state(2, dtype=torch.float64))
    torch.testing.assert_close(y_zero, y_none, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(final_zero, final_none, rtol=1e-12, atol=1e-12)


@case
def test_input_validation_messages(name):
    layer = make(name, torch.float32)
    cls = type(layer).__name__
    shape = tuple(layer.state_shape)
    with pytest.raises(
        ValueError, match=rf"{cls}\.forward: x must have shape \(batch, time, {DIM}\); got \(2, {DIM}\)"
    ):
        layer(torch.randn(2, DIM))
    with pytest.raises(
        ValueError, match=rf"x must have shape \(batch, time, {DIM}\); got \(2, 3, {DIM + 1}\)"
    ):
        layer(torch.randn(2, 3, DIM + 1))
    with pytest.raises(ValueError, match=r"x must be a floating tensor; got dtype torch.int64"):
        layer(torch.zeros(2, 3, DIM, dtype=torch.long))
    with pytest.raises(ValueError, match=r"x must be a Tensor of shape .*; got list"):
        layer([[0.0] * DIM])
    expected = str((2, *shape)).replace("(", r"\(").replace(")", r"\)")
    with pytest.raises(ValueError, match=rf"{cls}\.forward: state must have shape {expected}; got \(3, "):
        layer(torch.randn(2, 3, DIM), torch.zeros(3, *shape))
    with pytest.raises(ValueError, match=r"state must be a Tensor of shape .* or None; got float"):
        layer(torch.randn(2, 3, DIM), 0.0)
    with pytest.raises(
        ValueError, match=rf"{cls}\.step: x_t must have shape \(batch, {DIM}\); got \(2, 1, {DIM}\)"
    ):
        layer.step(torch.randn(2, 1, DIM))
    with pytest.raises(ValueError, match=rf"{cls}\.step: state must have shape {expected}; got \(2, 1\)"):
        layer.step(torch.randn(2, DIM), torch.zeros(2, 1))


@pytest.mark.parametrize(
    "cls", [MinGRU, MinLSTM, MinGRUMatrix, MinGRUDiag, MinGRUAngle], ids=lambda c: c.__name__
)
@pytest.mark.parametrize("dim", [0, -3, 2.5, True, "8"], ids=repr)
def test_dim_must_be_positive_int(cls, dim):
    with pytest.raises(ValueError, match=rf"{cls.__name__}: dim must be a positive int; got {dim!r}"):
        cls(dim)


@pytest.mark.parametrize(
    "name", ["mingru-log", "minlstm-linear", "matrix-h2-k3", "diag-h2-k3", "angle-h2-k6-R3-reflect"]
)
def test_compiles_to_one_graph(name):
    layer = make(name, torch.float32)
    x = torch.randn(2, 5, DIM, requires_grad=True)
    h0 = random_state(layer, 2, torch.float32)
    y, final = torch.compile(layer, fullgraph=True, backend="aot_eager")(x, h0)
    y_eager, final_eager = layer(x, h0)
    torch.testing.assert_close(y, y_eager)
    torch.testing.assert_close(final, final_eager)
    (grad,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(grad, torch.autograd.grad(y_eager.sum(), x)[0])
    y_t, _ = torch.compile(layer.step, fullgraph=True, backend="aot_eager")(x[:, 0], h0)
    torch.testing.assert_close(y_t, layer.step(x[:, 0], h0)[0])
