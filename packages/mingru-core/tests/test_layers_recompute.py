"""recompute=True: the chunked forward equals the single pass (values and every gradient), autograd keeps only
the input, the parameters and one state per chunk, and the options are validated."""

from __future__ import annotations

import copy

import pytest
import torch

from mingru.layers import MinGRU, MinGRUAngle, MinGRUDiag, MinGRULM, MinGRUMatrix, MinLSTM
from mingru.layers._common import MIN_CHUNK_LEN, RECOMPUTE_CHUNK_BYTES, ScalarGatedLayer

DIM = 6
CASES = {
    "mingru-log": (MinGRU, {"mode": "log"}),
    "mingru-linear": (MinGRU, {"mode": "linear"}),
    "mingru-linear-negative-nobias": (MinGRU, {"mode": "linear", "negative_gates": True, "bias": False}),
    "mingru-log-expansion1.5": (MinGRU, {"mode": "log", "expansion": 1.5}),
    "minlstm-log": (MinLSTM, {"mode": "log"}),
    "minlstm-linear-expansion0.5": (MinLSTM, {"mode": "linear", "expansion": 0.5}),
    "matrix-h2-k3": (MinGRUMatrix, {"heads": 2, "head_dim": 3}),
    "diag-h3-k2-v4": (MinGRUDiag, {"heads": 3, "head_dim": 2, "value_dim": 4}),
    "angle-h2-k4-R2": (MinGRUAngle, {"heads": 2, "head_dim": 4}),
    "angle-h2-k6-R3-reflect-plain": (
        MinGRUAngle,
        {
            "heads": 2,
            "head_dim": 6,
            "rotation_layers": 3,
            "reflect": True,
            "use_scale": False,
            "use_decay": False,
        },
    ),
}
case = pytest.mark.parametrize("name", list(CASES))


def pair(name: str, chunk_len: int | None, dtype: torch.dtype = torch.float64):
    """The same layer twice (same weights): plain, and with recompute=True."""
    cls, kwargs = CASES[name]
    torch.manual_seed(0)
    plain = cls(DIM, **kwargs).to(dtype)
    torch.manual_seed(0)
    lean = cls(DIM, recompute=True, chunk_len=chunk_len, **kwargs).to(dtype)
    lean.load_state_dict(plain.state_dict())
    return plain, lean


def outputs_and_grads(layer, x, h0, y_weight, h_weight):
    y, final = layer(x, h0)
    loss = (y * y_weight).sum() + (final * h_weight).sum()
    wrt = [t for t in (x, h0, *layer.parameters()) if t is not None and t.requires_grad]
    return y, final, torch.autograd.grad(loss, wrt)


def assert_same_run(plain, lean, x, h0, *, rtol=1e-10, atol=1e-10):
    y_weight = torch.randn(x.shape, dtype=torch.float64).to(x.dtype)
    state_shape = (x.shape[0], *plain.state_shape)
    h_weight = torch.randn(state_shape, dtype=torch.float64).to(torch.promote_types(x.dtype, torch.float32))
    want = outputs_and_grads(plain, x, h0, y_weight, h_weight)
    got = outputs_and_grads(lean, x, h0, y_weight, h_weight)
    assert len(got[2]) == len(want[2])
    for g, w in zip((got[0], got[1], *got[2]), (want[0], want[1], *want[2]), strict=True):
        # on the scale of the largest entry (parameter gradients sum over all steps)
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol * max(1.0, w.abs().max().item()))


@case
@pytest.mark.parametrize(
    ("steps", "chunk_len"),
    [(13, 4), (12, 4), (7, 1), (1, 3), (5, 5), (9, 64)],
    ids=lambda v: str(v),
)
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "given-state"])
def test_recompute_equals_one_pass_fp64(name, steps, chunk_len, with_state):
    plain, lean = pair(name, chunk_len)
    x = torch.randn(3, steps, DIM, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(3, *plain.state_shape, dtype=torch.float64, requires_grad=True) if with_state else None
    assert_same_run(plain, lean, x, h0)


@pytest.mark.parametrize("name", ["mingru-log", "matrix-h2-k3", "angle-h2-k4-R2"])
def test_recompute_gradcheck(name):
    _, lean = pair(name, 2)
    x = torch.randn(2, 5, DIM, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2, *lean.state_shape, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, h0: lean(x, h0), (x, h0))


@case
def test_recompute_bf16_input_fp32_state(name):
    plain, lean = pair(name, 3, torch.float32)
    plain, lean = plain.to(torch.bfloat16), lean.to(torch.bfloat16)
    x = torch.randn(2, 10, DIM).to(torch.bfloat16).requires_grad_()
    h0 = 0.5 * torch.randn(2, *plain.state_shape).requires_grad_()
    y, final = lean(x, h0)
    assert y.dtype == torch.bfloat16 and final.dtype == torch.float32
    # the same bf16 projections per row; the chunks only change where the float32 scan restarts
    assert_same_run(plain, lean, x, h0, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("name", ["mingru-linear", "minlstm-log", "diag-h3-k2-v4"])
def test_recompute_partial_requires_grad(name):
    """A frozen weight, an input without grad, a state without grad, all parameters frozen: only what is
    asked for is computed."""
    plain, lean = pair(name, 4)
    for layer in (plain, lean):
        layer.proj_in.weight.requires_grad_(False)
    x = torch.randn(2, 9, DIM, dtype=torch.float64)
    h0 = torch.randn(2, *plain.state_shape, dtype=torch.float64)
    assert_same_run(plain, lean, x, h0)
    x.requires_grad_()
    assert_same_run(plain, lean, x, h0)
    for layer in (plain, lean):
        layer.requires_grad_(False)
    assert_same_run(plain, lean, x, h0)  # the input's gradient alone


@case
def test_recompute_without_grad_runs_the_single_pass(name):
    """Nothing to recompute without autograd (as torch.utils.checkpoint): one projection over all steps."""
    plain, lean = pair(name, 4)
    calls: list[tuple[int, ...]] = []
    lean.proj_in.register_forward_hook(lambda module, args, out: calls.append(tuple(out.shape[:2])))
    x = torch.randn(2, 11, DIM, dtype=torch.float64)
    with torch.no_grad():
        y, final = lean(x)
        y_plain, final_plain = plain(x)
    lean.requires_grad_(False)
    lean(x)  # grad mode on, but nothing requires grad
    assert calls == [(2, 11), (2, 11)]
    torch.testing.assert_close(y, y_plain, rtol=0, atol=0)
    torch.testing.assert_close(final, final_plain, rtol=0, atol=0)


GATED = [name for name, (cls, _) in CASES.items() if issubclass(cls, ScalarGatedLayer)]


def _count_by_hand(monkeypatch) -> list[str]:
    """Record each call of the scalar layers' chunk forward and chunk adjoint that runs without autograd's
    graph over the projections (by hand), and each that falls back to ``_forward``."""
    calls: list[str] = []
    forward, adjoint = ScalarGatedLayer._chunk_forward, ScalarGatedLayer._chunk_adjoint
    fallback = ScalarGatedLayer._forward

    def counted_forward(self, *args):
        calls.append("forward")
        return forward(self, *args)

    def counted_adjoint(self, *args):
        calls.append("adjoint")
        return adjoint(self, *args)

    def counted_fallback(self, *args):
        calls.append("_forward")
        return fallback(self, *args)

    monkeypatch.setattr(ScalarGatedLayer, "_chunk_forward", counted_forward)
    monkeypatch.setattr(ScalarGatedLayer, "_chunk_adjoint", counted_adjoint)
    monkeypatch.setattr(ScalarGatedLayer, "_forward", counted_fallback)
    return calls


@pytest.mark.parametrize("name", GATED)
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "given-state"])
def test_recompute_by_hand_equals_autograd_over_the_chunks(name, with_state, monkeypatch):
    """The scalar layers' chunks run without autograd's graph over the projections (two chunks per forward
    call: 2 calls for 3 chunks; 3 adjoints; no ``_forward``) and give what autograd over ``_forward`` gives,
    in float64 to 1e-12."""
    plain, lean = pair(name, 4)
    x = torch.randn(3, 11, DIM, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(3, *plain.state_shape, dtype=torch.float64, requires_grad=True) if with_state else None
    y_weight, h_weight = torch.randn(3, 11, DIM, dtype=torch.float64), torch.randn(3, *plain.state_shape)
    calls = _count_by_hand(monkeypatch)
    by_hand = outputs_and_grads(lean, x, h0, y_weight, h_weight)
    assert calls == ["forward"] * 2 + ["adjoint"] * 3
    monkeypatch.setattr(ScalarGatedLayer, "_chunk_adjoint_ok", lambda self: False)
    calls.clear()
    autograd = outputs_and_grads(lean, x, h0, y_weight, h_weight)
    assert calls == ["forward", "_forward"] * 3 + ["_forward"] * 3  # the fallbacks ran
    single = outputs_and_grads(plain, x, h0, y_weight, h_weight)
    for got, want, one in zip(
        (*by_hand[:2], *by_hand[2]), (*autograd[:2], *autograd[2]), (*single[:2], *single[2]), strict=True
    ):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12 * max(1.0, want.abs().max().item()))
        torch.testing.assert_close(got, one, rtol=1e-10, atol=1e-10 * max(1.0, one.abs().max().item()))


@pytest.mark.parametrize("steps", [8, 7, 4, 3])
def test_recompute_forward_call_returns_small_states(steps):
    """A forward call over two chunks (or what is left) returns the state after each chunk, equal to the
    states of the sequence, in storage of their own (not views of the call's (B, L, H) states)."""
    _, lean = pair("mingru-log-expansion1.5", 4)
    x = torch.randn(2, steps, DIM, dtype=torch.float64)
    y = torch.empty_like(x)
    with torch.no_grad():
        states = lean._chunk_forward(x, None, y, 4)
        ends = [min(steps, 4), *([steps] if steps > 4 else [])]
        for state, end in zip(states, ends, strict=True):
            want = lean._forward(x[:, :end], None)[1]
            torch.testing.assert_close(state, want, rtol=1e-12, atol=1e-12)
            assert state.untyped_storage().nbytes() <= len(states) * state.numel() * state.element_size()
            assert state.is_contiguous()  # the next chunk's kernel takes it as it is
        torch.testing.assert_close(y, lean._forward(x, None)[0], rtol=1e-12, atol=1e-12)


class _Halve(torch.nn.Module):
    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return 0.5 * weight


class _Doubled(MinGRU):
    """A subclass with its own ``_forward``: the chunks must run it."""

    def _forward(self, x, h0):
        y, final = super()._forward(2.0 * x, h0)
        return y, final


@pytest.mark.parametrize("change", ["hook", "global-hook", "parametrization", "subclass"])
def test_recompute_falls_back_to_autograd_where_the_projections_are_not_plain(change, monkeypatch):
    """Module hooks (the projection's own or global), a parametrized weight or a subclass's ``_forward``:
    every chunk runs ``_forward`` (hooks fire in the backward's recomputation too) and the gradients are the
    single pass's, also those of a parametrization's original weight."""
    cls = _Doubled if change == "subclass" else MinGRU
    torch.manual_seed(0)
    plain = cls(DIM, expansion=1.5).double()
    lean = cls(DIM, expansion=1.5, recompute=True, chunk_len=4).double()
    lean.load_state_dict(plain.state_dict())
    seen: list[int] = []
    handles = []
    for layer in (plain, lean):
        if change == "hook":
            handles.append(layer.proj_out.register_forward_hook(lambda m, a, out: seen.append(out.shape[1])))
        if change == "parametrization":
            torch.nn.utils.parametrize.register_parametrization(layer.proj_in, "weight", _Halve())
    if change == "global-hook":
        handles.append(torch.nn.modules.module.register_module_forward_hook(lambda m, a, out: None))
    calls = _count_by_hand(monkeypatch)
    try:
        x = torch.randn(2, 10, DIM, dtype=torch.float64, requires_grad=True)
        y_weight, h_weight = torch.randn(2, 10, DIM, dtype=torch.float64), torch.randn(2, plain.hidden)
        want = outputs_and_grads(plain, x, None, y_weight, h_weight)
        calls.clear()
        seen.clear()
        got = outputs_and_grads(lean, x, None, y_weight, h_weight)
    finally:
        for handle in handles:
            handle.remove()
    assert "adjoint" not in calls and calls.count("_forward") == 6, calls
    if change == "hook":
        assert seen == [4, 4, 2, 2, 4, 4]  # three chunks forward, then recomputed last to first
    for g, w in zip((got[0], got[1], *got[2]), (want[0], want[1], *want[2]), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10 * max(1.0, w.abs().max().item()))


def _saved_during_forward(layer, x, h0):
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y, final = layer(x, h0)
    return saved, y, final


@case
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "given-state"])
def test_recompute_saves_only_input_parameters_and_chunk_states(name, with_state):
    batch, steps, chunk_len = 2, 40, 8
    plain, lean = pair(name, chunk_len, torch.float32)
    x = torch.randn(batch, steps, DIM, requires_grad=True)
    h0 = torch.randn(batch, *plain.state_shape, requires_grad=True) if with_state else None
    kept = {t.untyped_storage().data_ptr() for t in (x, *lean.parameters())}

    saved, _, _ = _saved_during_forward(lean, x, h0)
    extra = [t for t in saved if t.untyped_storage().data_ptr() not in kept]
    chunks = steps // chunk_len
    states = chunks if with_state else chunks - 1
    assert [tuple(t.shape) for t in extra] == [(states, batch, *plain.state_shape)]

    # the check can fail: the single pass keeps (B, T, ...) activations beyond the input
    saved_plain, _, _ = _saved_during_forward(plain, x, h0)
    per_step = [t for t in saved_plain if t.dim() >= 3 and t.shape[:2] == (batch, steps)]
    assert any(t.untyped_storage().data_ptr() not in kept for t in per_step)


def test_recompute_runs_the_backward_under_the_forward_autocast():
    plain, lean = pair("mingru-log", 5, torch.float32)
    projected: list[torch.dtype] = []
    lean.proj_in.register_forward_hook(lambda module, args, out: projected.append(out.dtype))
    x = torch.randn(2, 16, DIM, requires_grad=True)
    grads = []
    for layer in (plain, lean):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y, final = layer(x)
        grads.append(torch.autograd.grad(y.sum() + final.sum(), [x, *layer.parameters()]))
    # 4 chunks forward, 4 recomputed in the backward (outside the autocast block), all in bfloat16
    assert projected == [torch.bfloat16] * 8
    for got, want in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * max(1.0, want.abs().max().item()))


def test_recompute_in_the_language_model():
    torch.manual_seed(0)
    plain = MinGRULM(17, DIM, depth=2)
    torch.manual_seed(0)
    lean = MinGRULM(17, DIM, depth=2, layer_kwargs={"recompute": True, "chunk_len": 3})
    lean.load_state_dict(plain.state_dict())
    tokens = torch.randint(0, 17, (2, 10))
    for model in (plain, lean):
        model.zero_grad()
        model(tokens)[0].logsumexp(-1).sum().backward()
    for (n, p), q in zip(plain.named_parameters(), lean.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=n)


def test_recompute_chunk_len_rule():
    layer = MinGRU(1024, recompute=True)
    width = 2 * 1024 + 1024  # projection outputs + state, per step and example
    steps = RECOMPUTE_CHUNK_BYTES // (8 * width * 4)
    assert layer.recompute_chunk_len(8) == steps - steps % MIN_CHUNK_LEN
    assert layer.recompute_chunk_len(8, torch.bfloat16) == layer.recompute_chunk_len(8)  # state dtype float32
    assert layer.recompute_chunk_len(8, torch.float64) < layer.recompute_chunk_len(8)
    assert layer.recompute_chunk_len(10**6) == MIN_CHUNK_LEN
    assert MinGRU(8, recompute=True, chunk_len=5).recompute_chunk_len(8) == 5


@pytest.mark.parametrize(
    "cls", [MinGRU, MinLSTM, MinGRUMatrix, MinGRUDiag, MinGRUAngle], ids=lambda c: c.__name__
)
def test_recompute_arguments_are_validated(cls):
    with pytest.raises(ValueError, match=rf"{cls.__name__}: recompute must be a bool; got 1"):
        cls(4, recompute=1)
    for bad in (0, -2, 2.0, True):
        message = rf"{cls.__name__}: chunk_len must be a positive int; got {bad!r}"
        with pytest.raises(ValueError, match=message):
            cls(4, recompute=True, chunk_len=bad)
    with pytest.raises(
        ValueError, match=rf"{cls.__name__}: chunk_len applies only with recompute=True; got chunk_len=8"
    ):
        cls(4, chunk_len=8)
    layer = cls(4, recompute=True, chunk_len=8)
    assert layer.recompute and layer.chunk_len == 8
    assert copy.deepcopy(layer).chunk_len == 8


def test_recompute_step_is_unchanged():
    plain, lean = pair("mingru-log", 2)
    x_t = torch.randn(3, DIM, dtype=torch.float64)
    torch.testing.assert_close(lean.step(x_t)[0], plain.step(x_t)[0], rtol=0, atol=0)
