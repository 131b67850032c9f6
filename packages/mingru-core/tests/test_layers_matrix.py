"""MinGRUMatrix and MinGRUDiag: equations, the transition norm bound, permutations and argument checks."""

from __future__ import annotations

import pytest
import torch

from mingru.layers import MinGRUDiag, MinGRUMatrix


def split_heads(layer, x: torch.Tensor) -> list[torch.Tensor]:
    pre = layer.proj_in(x).unflatten(-1, (layer.heads, -1))
    k, v = layer.head_dim, layer.value_dim
    width = pre.shape[-1] - 2 * k - v
    return list(pre.split((width, k, k, v), dim=-1))


def matrix_reference(layer: MinGRUMatrix, x: torch.Tensor, h: torch.Tensor):
    """Sequential H_t = A_t H_{t-1} + z_t key_t value_t^T, y = Lout(q_t^T H_t), written out directly."""
    k = layer.head_dim
    transition, query, key, value = split_heads(layer, x)
    m = transition[..., : k * k].unflatten(-1, (k, k))
    z = torch.sigmoid(transition[..., k * k])
    col_sum = m.abs().sum(dim=-2).amax(dim=-1)
    row_sum = m.abs().sum(dim=-1).amax(dim=-1)
    a = ((1 - z) / torch.clamp(torch.sqrt(col_sum * row_sum), min=1.0))[..., None, None] * m
    outputs = []
    for t in range(x.shape[1]):
        h = a[:, t] @ h + z[:, t, :, None, None] * key[:, t, :, :, None] * value[:, t, :, None, :]
        outputs.append((query[:, t, :, :, None] * h).sum(dim=-2).flatten(-2))
    return layer.proj_out(torch.stack(outputs, dim=1)), h


def diag_reference(layer: MinGRUDiag, x: torch.Tensor, h: torch.Tensor):
    """Sequential H_t = diag(a_t) H_{t-1} + ((1 - a_t) key_t) value_t^T, y = Lout(q_t^T H_t)."""
    transition, query, key, value = split_heads(layer, x)
    a = torch.sigmoid(transition)
    outputs = []
    for t in range(x.shape[1]):
        write = ((1 - a[:, t]) * key[:, t])[..., :, None] * value[:, t, :, None, :]
        h = a[:, t, :, :, None] * h + write
        outputs.append((query[:, t, :, :, None] * h).sum(dim=-2).flatten(-2))
    return layer.proj_out(torch.stack(outputs, dim=1)), h


REFERENCES = {
    "matrix-h2-k3": (MinGRUMatrix, {"heads": 2, "head_dim": 3}, matrix_reference),
    "matrix-h1-k4-v2": (MinGRUMatrix, {"heads": 1, "head_dim": 4, "value_dim": 2}, matrix_reference),
    "diag-h2-k3": (MinGRUDiag, {"heads": 2, "head_dim": 3}, diag_reference),
    "diag-h3-k2-v5": (MinGRUDiag, {"heads": 3, "head_dim": 2, "value_dim": 5}, diag_reference),
}


@pytest.mark.parametrize("name", list(REFERENCES))
@pytest.mark.parametrize("steps", [1, 6, 11], ids=lambda t: f"T{t}")
def test_matches_equations(name, steps):
    cls, kwargs, reference = REFERENCES[name]
    torch.manual_seed(0)
    layer = cls(5, **kwargs).double()
    x = 2 * torch.randn(2, steps, 5, dtype=torch.float64)
    h0 = torch.randn(2, *layer.state_shape, dtype=torch.float64)
    y, final = layer(x, h0)
    y_ref, final_ref = reference(layer, x, h0)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final, final_ref, rtol=1e-10, atol=1e-10)


def test_matrix_transition_spectral_norm_is_bounded_by_one_minus_z():
    torch.manual_seed(1)
    layer = MinGRUMatrix(6, heads=3, head_dim=4).double()
    x = 10 * torch.randn(4, 9, 6, dtype=torch.float64)
    transition, _, key, value = layer._project(x)
    a, _ = layer._transition(transition, key, value)
    z = torch.sigmoid(transition[..., -1])
    spectral = torch.linalg.matrix_norm(a, ord=2)
    assert (spectral <= (1 - z) * (1 + 1e-12)).all()


@pytest.mark.parametrize("steps", [1, 5, 12], ids=lambda t: f"T{t}")
def test_matrix_layer_carries_a_signed_permutation_without_decay(steps):
    k = 4
    perm = torch.tensor([[0, 0, 1, 0], [0, 0, 0, -1], [1, 0, 0, 0], [0, 1, 0, 0]], dtype=torch.float64)
    layer = MinGRUMatrix(3, heads=1, head_dim=k, value_dim=2).double()
    with torch.no_grad():
        layer.proj_in.weight.zero_()
        layer.proj_in.bias.zero_()
        layer.proj_in.bias[: k * k] = perm.flatten()
        layer.proj_in.bias[k * k] = -60.0  # z = sigmoid(-60): no write, 1 - z == 1 to double precision
    h0 = torch.randn(2, 1, k, 2, dtype=torch.float64)
    _, final = layer(torch.randn(2, steps, 3, dtype=torch.float64), h0)
    expected = torch.linalg.matrix_power(perm, steps) @ h0
    torch.testing.assert_close(final, expected, rtol=0, atol=1e-12)


def test_matrix_layer_starts_near_identity():
    layer = MinGRUMatrix(4, heads=2, head_dim=3)
    with torch.no_grad():
        layer.proj_in.weight.zero_()
    transition, _, key, value = layer._project(torch.zeros(1, 4))
    a, _ = layer._transition(transition, key, value)
    keep = torch.sigmoid(-transition[..., 9])
    torch.testing.assert_close(a, keep[..., None, None] * torch.eye(3))


def test_diag_state_stays_within_the_largest_write():
    torch.manual_seed(2)
    layer = MinGRUDiag(4, heads=2, head_dim=3).double()
    x = 5 * torch.randn(2, 40, 4, dtype=torch.float64)
    _, _, key, value = layer._project(x)
    bound = (key.abs()[..., :, None] * value.abs()[..., None, :]).amax(dim=1)
    _, final = layer(x)
    assert (final.abs() <= bound * (1 + 1e-12)).all()


@pytest.mark.parametrize("cls", [MinGRUMatrix, MinGRUDiag], ids=lambda c: c.__name__)
def test_default_value_dim_and_repr(cls):
    layer = cls(8, heads=3, head_dim=5)
    assert layer.state_shape == (3, 5, 5)
    assert cls(8, heads=3, head_dim=5, value_dim=2).state_shape == (3, 5, 2)
    assert "heads=3, head_dim=5, value_dim=5" in repr(layer)


@pytest.mark.parametrize("cls", [MinGRUMatrix, MinGRUDiag], ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"heads": 0}, r"heads must be a positive int; got 0"),
        ({"heads": 2.0}, r"heads must be a positive int; got 2.0"),
        ({"head_dim": -1}, r"head_dim must be a positive int; got -1"),
        ({"value_dim": 0}, r"value_dim must be a positive int; got 0"),
        ({"value_dim": "4"}, r"value_dim must be a positive int; got '4'"),
    ],
    ids=["heads-zero", "heads-float", "head_dim-negative", "value_dim-zero", "value_dim-str"],
)
def test_argument_errors(cls, kwargs, message):
    with pytest.raises(ValueError, match=rf"{cls.__name__}: {message}"):
        cls(8, **kwargs)
