"""MinGRUAngle: equations, orthogonality, sign flips (state tracking), layout buffers and argument checks."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from mingru.layers import MinGRUAngle
from mingru.scans.angle import default_angle_layout


def rotate(x: torch.Tensor, theta: torch.Tensor, perm, sgn, p2p) -> torch.Tensor:
    """The rotation layers written out position by position: x (..., k), theta (..., R, k/2)."""
    for r in range(perm.shape[0]):
        signed = x * sgn[r]
        columns = []
        for i in range(x.shape[-1]):
            j, angle = int(perm[r, i]), theta[..., r, int(p2p[r, i])]
            if i < j:
                columns.append(angle.cos() * signed[..., i] - angle.sin() * signed[..., j])
            else:
                columns.append(angle.sin() * signed[..., j] + angle.cos() * signed[..., i])
        x = torch.stack(columns, dim=-1)
    return x


def angle_reference(layer: MinGRUAngle, x: torch.Tensor, h: torch.Tensor):
    n, k, layers = layer.heads, layer.head_dim, layer.rotation_layers
    pre = layer.proj_in(x).unflatten(-1, (n, -1))
    theta = pre[..., : layers * k // 2].unflatten(-1, (layers, k // 2))
    rest = pre[..., layers * k // 2 :]
    c = torch.ones(pre.shape[:-1], dtype=x.dtype)
    if layer.use_scale:
        c = c * torch.tanh(rest[..., 0])
        rest = rest[..., 1:]
    if layer.use_decay:
        c = c * torch.exp(-F.softplus(layer.decay_param) * F.softplus(rest[..., 0]))
        rest = rest[..., 1:]
    outputs = []
    for t in range(x.shape[1]):
        h = c[:, t, :, None] * rotate(h, theta[:, t], layer.perm, layer.sgn, layer.p2p) + rest[:, t]
        outputs.append(h.flatten(-2))
    return layer.proj_out(torch.stack(outputs, dim=1)), h


CONFIGS = {
    "h2-k4-R2": {"heads": 2, "head_dim": 4},
    "h1-k6-R3-reflect": {"heads": 1, "head_dim": 6, "rotation_layers": 3, "reflect": True},
    "h3-k8-R1-noscale": {"heads": 3, "head_dim": 8, "rotation_layers": 1, "use_scale": False},
    "h2-k2-R2-nodecay": {"heads": 2, "head_dim": 2, "use_decay": False},
}


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("steps", [1, 6, 13], ids=lambda t: f"T{t}")
def test_matches_equations(name, steps):
    torch.manual_seed(0)
    layer = MinGRUAngle(5, **CONFIGS[name]).double()
    x = 2 * torch.randn(2, steps, 5, dtype=torch.float64)
    h0 = torch.randn(2, *layer.state_shape, dtype=torch.float64)
    y, final = layer(x, h0)
    y_ref, final_ref = angle_reference(layer, x, h0)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final, final_ref, rtol=1e-10, atol=1e-10)


def zero_writes(layer: MinGRUAngle) -> None:
    """Zero the projection of b so that only the transition acts on the state."""
    k = layer.head_dim
    with torch.no_grad():
        layer.proj_in.weight.view(layer.heads, -1, layer.dim)[:, -k:] = 0
        layer.proj_in.bias.view(layer.heads, -1)[:, -k:] = 0


def test_pure_rotation_preserves_the_state_norm():
    torch.manual_seed(1)
    layer = MinGRUAngle(4, heads=2, head_dim=6, rotation_layers=3, use_scale=False, use_decay=False).double()
    zero_writes(layer)
    h0 = torch.randn(3, 2, 6, dtype=torch.float64)
    x = 3 * torch.randn(3, 17, 4, dtype=torch.float64)
    _, final = layer(x, h0)
    torch.testing.assert_close(final.norm(dim=-1), h0.norm(dim=-1), rtol=1e-12, atol=0)
    assert not torch.allclose(final, h0)


def test_signed_scale_tracks_parity():
    """scale = tanh(u) reaches -1, so a head can flip its state on each 1 bit: its sign is the parity."""
    layer = MinGRUAngle(1, heads=1, head_dim=2, rotation_layers=1, use_decay=False).double()
    with torch.no_grad():
        layer.proj_in.weight.zero_()
        layer.proj_in.bias.zero_()
        layer.proj_in.weight[1, 0] = -40.0  # u = 20 - 40 bit: tanh(u) = +-1 to double precision
        layer.proj_in.bias[1] = 20.0
    bits = torch.randint(0, 2, (4, 21, 1), generator=torch.Generator().manual_seed(2)).double()
    h0 = torch.tensor([1.0, 0.0], dtype=torch.float64).expand(4, 1, 2)
    _, final = layer(bits, h0)
    parity = bits.sum(dim=1) % 2
    torch.testing.assert_close(final[:, 0, 0], (1 - 2 * parity)[:, 0], rtol=0, atol=1e-12)


def test_decay_shrinks_the_state():
    layer = MinGRUAngle(3, heads=2, head_dim=4, use_scale=False).double()
    zero_writes(layer)
    h0 = torch.randn(2, 2, 4, dtype=torch.float64)
    _, final = layer(torch.randn(2, 8, 3, dtype=torch.float64), h0)
    assert (final.norm(dim=-1) < h0.norm(dim=-1)).all()


@pytest.mark.parametrize("reflect", [False, True], ids=["rotate", "reflect"])
def test_layout_buffers(reflect):
    layer = MinGRUAngle(8, heads=2, head_dim=6, rotation_layers=3, reflect=reflect)
    perm, sgn, p2p = default_angle_layout(6, 3, reflect=reflect)
    assert torch.equal(layer.perm, perm) and torch.equal(layer.sgn, sgn) and torch.equal(layer.p2p, p2p)
    assert bool((layer.sgn < 0).any()) is reflect
    assert not {"perm", "sgn", "p2p"} & set(layer.state_dict())
    layer.double()
    assert layer.sgn.dtype == torch.float64 and layer.perm.dtype == torch.int64


def test_disabled_features_drop_their_parameters():
    full = MinGRUAngle(8, heads=2, head_dim=4, rotation_layers=2)
    bare = MinGRUAngle(8, heads=2, head_dim=4, rotation_layers=2, use_scale=False, use_decay=False)
    assert full.decay_param is not None and full.decay_param.shape == (2,)
    assert bare.decay_param is None
    assert full.proj_in.out_features == 2 * (4 + 1 + 1 + 4)
    assert bare.proj_in.out_features == 2 * (4 + 4)
    assert "use_scale=False, use_decay=False" in repr(bare)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"head_dim": 3}, r"head_dim must be even \(rotations act on pairs\); got 3"),
        ({"head_dim": 0}, r"head_dim must be a positive int; got 0"),
        ({"heads": -2}, r"heads must be a positive int; got -2"),
        ({"rotation_layers": 0}, r"rotation_layers must be a positive int; got 0"),
        ({"use_scale": "yes"}, r"use_scale must be a bool; got 'yes'"),
        ({"use_decay": None}, r"use_decay must be a bool; got None"),
        ({"reflect": 1}, r"reflect must be a bool; got 1"),
    ],
    ids=[
        "head_dim-odd",
        "head_dim-zero",
        "heads-negative",
        "rotation_layers-zero",
        "use_scale-str",
        "use_decay-none",
        "reflect-int",
    ],
)
def test_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=rf"MinGRUAngle: {message}"):
        MinGRUAngle(8, **kwargs)
