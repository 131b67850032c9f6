"""MinGRU and MinLSTM: the paper's equations, both modes, negative gates and argument checks."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from mingru.layers import MinGRU, MinLSTM


def g(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x >= 0, x + 0.5, torch.sigmoid(x))


def mingru_reference(layer: MinGRU, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The paper's sequential minGRU written out directly."""
    k, h_tilde = layer.proj_in(x).chunk(2, dim=-1)
    z = torch.sigmoid(k)
    a = 1 - 2 * z if layer.negative_gates else 1 - z
    value = g(h_tilde) if layer.mode == "log" else h_tilde
    states = []
    for t in range(x.shape[1]):
        h = a[:, t] * h + z[:, t] * value[:, t]
        states.append(h)
    return layer.proj_out(torch.stack(states, dim=1)), h


def minlstm_reference(layer: MinLSTM, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The paper's sequential minLSTM with normalised gates written out directly."""
    pre_f, pre_i, h_tilde = layer.proj_in(x).chunk(3, dim=-1)
    f, i = torch.sigmoid(pre_f), torch.sigmoid(pre_i)
    f_norm, i_norm = f / (f + i), i / (f + i)
    value = g(h_tilde) if layer.mode == "log" else h_tilde
    states = []
    for t in range(x.shape[1]):
        h = f_norm[:, t] * h + i_norm[:, t] * value[:, t]
        states.append(h)
    return layer.proj_out(torch.stack(states, dim=1)), h


REFERENCES = {
    "mingru-log": (MinGRU, {"mode": "log"}, mingru_reference),
    "mingru-linear": (MinGRU, {"mode": "linear"}, mingru_reference),
    "mingru-negative": (MinGRU, {"mode": "linear", "negative_gates": True}, mingru_reference),
    "mingru-log-expansion2": (MinGRU, {"expansion": 2.0}, mingru_reference),
    "minlstm-log": (MinLSTM, {"mode": "log"}, minlstm_reference),
    "minlstm-linear": (MinLSTM, {"mode": "linear"}, minlstm_reference),
    "minlstm-linear-expansion0.75": (MinLSTM, {"mode": "linear", "expansion": 0.75}, minlstm_reference),
}


@pytest.mark.parametrize("name", list(REFERENCES))
@pytest.mark.parametrize("steps", [1, 5, 16], ids=lambda t: f"T{t}")
def test_matches_paper_equations(name, steps):
    cls, kwargs, reference = REFERENCES[name]
    torch.manual_seed(0)
    layer = cls(4, **kwargs).double()
    x = 3 * torch.randn(2, steps, 4, dtype=torch.float64)
    h0 = torch.rand(2, layer.hidden, dtype=torch.float64)
    y, final = layer(x, h0)
    y_ref, final_ref = reference(layer, x, h0)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final, final_ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(("cls", "mode"), [(MinGRU, "log"), (MinLSTM, "log")], ids=["mingru", "minlstm"])
def test_log_mode_with_negative_initial_state(cls, mode):
    torch.manual_seed(1)
    layer = cls(3, mode=mode).double()
    x = torch.randn(2, 6, 3, dtype=torch.float64)
    h0 = -torch.rand(2, 3, dtype=torch.float64) - 0.1
    reference = mingru_reference if cls is MinGRU else minlstm_reference
    y, final = layer(x, h0)
    y_ref, final_ref = reference(layer, x, h0)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final, final_ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("cls", [MinGRU, MinLSTM], ids=lambda c: c.__name__)
def test_log_mode_states_stay_nonnegative_and_finite_for_extreme_inputs(cls):
    torch.manual_seed(2)
    layer = cls(4)
    x = torch.randn(2, 33, 4) * 200
    x.requires_grad_()
    y, final = layer(x)
    assert (final >= 0).all() and torch.isfinite(y).all()
    y.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_negative_gates_track_parity():
    """a = 1 - 2z reaches -1 when z -> 1, so the state's sign is the running parity of the input bits."""
    layer = MinGRU(1, mode="linear", negative_gates=True).double()
    with torch.no_grad():
        layer.proj_in.weight.zero_()
        layer.proj_in.bias.zero_()
        layer.proj_in.weight[0, 0] = 80.0  # gate pre-activation k = 80 * (2 bit - 1)
        layer.proj_in.bias[0] = -40.0
    bits = torch.randint(0, 2, (4, 25, 1), generator=torch.Generator().manual_seed(3)).double()
    h, final = layer(bits * 1.0, torch.ones(4, 1, dtype=torch.float64))
    parity = bits.cumsum(dim=1) % 2
    torch.testing.assert_close(h, 1 - 2 * parity, rtol=0, atol=1e-12)
    assert final.shape == (4, 1)


def test_positive_gates_cannot_flip_sign():
    torch.manual_seed(4)
    layer = MinGRU(3, mode="linear").double()
    x = torch.randn(2, 20, 3, dtype=torch.float64)
    with torch.no_grad():
        layer.proj_in.weight[3:].zero_()
        layer.proj_in.bias[3:].zero_()  # h_tilde = 0: only the transition acts
    _, final = layer(x, torch.ones(2, 3, dtype=torch.float64))
    assert (final > 0).all()


@pytest.mark.parametrize(
    ("expansion", "hidden", "has_out"), [(1.0, 8, False), (2.0, 16, True), (0.5, 4, True), (1.04, 8, False)]
)
def test_expansion_sets_hidden_width(expansion, hidden, has_out):
    for cls in (MinGRU, MinLSTM):
        layer = cls(8, expansion=expansion)
        assert layer.hidden == hidden and layer.state_shape == (hidden,)
        assert isinstance(layer.proj_out, nn.Linear) is has_out


def test_bias_flag():
    layer = MinGRU(4, expansion=2.0, bias=False)
    assert layer.proj_in.bias is None and layer.proj_out.bias is None


def test_extra_repr():
    assert "mode='linear', negative_gates=True" in repr(MinGRU(4, mode="linear", negative_gates=True))
    assert "hidden=8, mode='log'" in repr(MinLSTM(4, expansion=2))


@pytest.mark.parametrize("cls", [MinGRU, MinLSTM], ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "exp"}, r"mode must be one of 'log', 'linear'; got 'exp'"),
        ({"mode": None}, r"mode must be one of 'log', 'linear'; got None"),
        ({"expansion": 0}, r"expansion must be a finite number > 0; got 0"),
        ({"expansion": -1.0}, r"expansion must be a finite number > 0; got -1.0"),
        ({"expansion": math.nan}, r"expansion must be a finite number > 0; got nan"),
        ({"expansion": "2"}, r"expansion must be a finite number > 0; got '2'"),
        (
            {"expansion": 0.01},
            r"expansion must give a hidden width round\(dim \* expansion\) >= 1; got dim=8",
        ),
        ({"bias": 1}, r"bias must be a bool; got 1"),
    ],
    ids=[
        "mode-unknown",
        "mode-none",
        "expansion-zero",
        "expansion-negative",
        "expansion-nan",
        "expansion-str",
        "expansion-rounds-to-zero",
        "bias-int",
    ],
)
def test_argument_errors(cls, kwargs, message):
    with pytest.raises(ValueError, match=rf"{cls.__name__}: {message}"):
        cls(8, **kwargs)


def test_negative_gates_need_linear_mode():
    with pytest.raises(
        ValueError, match=r"MinGRU: negative_gates=True requires mode='linear'; got mode='log'"
    ):
        MinGRU(4, negative_gates=True)
    with pytest.raises(ValueError, match=r"MinGRU: negative_gates must be a bool; got 'yes'"):
        MinGRU(4, mode="linear", negative_gates="yes")
