"""MinGRULM: logits from step equal the parallel forward, chunking, generation and argument checks."""

from __future__ import annotations

import pytest
import torch

from mingru.layers import MinGRU, MinGRUAngle, MinGRULM

VOCAB, DIM = 11, 8
LAYERS = {
    "mingru-log": ("mingru", None),
    "mingru-linear-negative": ("mingru", {"mode": "linear", "negative_gates": True}),
    "minlstm-log": ("minlstm", None),
    "matrix": ("matrix", {"heads": 2, "head_dim": 3}),
    "diag": ("diag", {"heads": 2, "head_dim": 3, "value_dim": 2}),
    "angle": ("angle", {"heads": 2, "head_dim": 4, "reflect": True}),
}
layers = pytest.mark.parametrize("name", list(LAYERS))


def make(name: str, dtype: torch.dtype = torch.float64, depth: int = 2) -> MinGRULM:
    layer, kwargs = LAYERS[name]
    torch.manual_seed(0)
    return MinGRULM(VOCAB, DIM, depth=depth, layer=layer, ff_mult=2, layer_kwargs=kwargs).to(dtype)


def tokens(batch: int, steps: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, steps), generator=torch.Generator().manual_seed(seed))


@layers
def test_forward_shapes_and_states(name):
    model = make(name, torch.float32)
    logits, states = model(tokens(3, 7))
    assert logits.shape == (3, 7, VOCAB) and logits.dtype == torch.float32
    assert len(states) == 2
    for block, state in zip(model.blocks, states, strict=True):
        assert state.shape == (3, *block.rnn.state_shape) and state.dtype == torch.float32


@layers
def test_step_logits_equal_forward(name):
    model = make(name)
    ids = tokens(2, 9)
    logits, final = model(ids)
    states = None
    for t in range(ids.shape[1]):
        step_logits, states = model.step(ids[:, t], states)
        torch.testing.assert_close(step_logits, logits[:, t], rtol=1e-10, atol=1e-10)
    for got, want in zip(states, final, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@layers
def test_chunked_forward_equals_one_pass(name):
    model = make(name)
    ids = tokens(2, 10)
    logits, final = model(ids)
    first, states = model(ids[:, :3])
    second, states = model(ids[:, 3:], states)
    torch.testing.assert_close(torch.cat((first, second), dim=1), logits, rtol=1e-10, atol=1e-10)
    for got, want in zip(states, final, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@layers
def test_greedy_generate_equals_rerunning_the_full_forward(name):
    model = make(name)
    prompt = tokens(3, 4)
    generated = model.generate(prompt, 6, temperature=0)
    expected = prompt
    for _ in range(6):
        logits, _ = model(expected)
        expected = torch.cat((expected, logits[:, -1].argmax(dim=-1, keepdim=True)), dim=1)
    assert torch.equal(generated, expected)


def test_generate_sampling_is_reproducible_and_top_k_one_is_greedy():
    model = make("mingru-log", torch.float32)
    prompt = tokens(2, 1)
    first = model.generate(prompt, 8, temperature=0.8, generator=torch.Generator().manual_seed(5))
    second = model.generate(prompt, 8, temperature=0.8, generator=torch.Generator().manual_seed(5))
    assert torch.equal(first, second) and first.shape == (2, 9)
    assert torch.equal(first[:, :1], prompt)
    assert ((first >= 0) & (first < VOCAB)).all()
    assert torch.equal(model.generate(prompt, 5, top_k=1), model.generate(prompt, 5, temperature=0))
    assert model.generate(prompt, 3, top_k=10 * VOCAB).shape == (2, 4)


def test_generate_top_k_restricts_the_support():
    model = make("diag", torch.float32)
    prompt = tokens(64, 2)
    logits, _ = model(prompt)
    allowed = logits[:, -1].topk(3, dim=-1).indices
    sampled = model.generate(prompt, 1, temperature=5.0, top_k=3, generator=torch.Generator().manual_seed(0))
    assert (sampled[:, -1:] == allowed).any(dim=-1).all()


def test_generate_zero_new_tokens_returns_the_prompt():
    model = make("mingru-log", torch.float32)
    prompt = tokens(2, 5)
    assert torch.equal(model.generate(prompt, 0), prompt)


def test_generate_runs_without_autograd():
    model = make("mingru-log", torch.float32)
    assert not model.generate(tokens(1, 2), 2).requires_grad


def test_output_head_is_tied_to_the_embedding():
    model = make("mingru-log", torch.float32, depth=1)
    vocab_sized = [name for name, p in model.named_parameters() if VOCAB in p.shape]
    assert vocab_sized == ["embed.weight"]
    logits, _ = model(tokens(1, 3))
    logits.sum().backward()
    assert model.embed.weight.grad is not None


def test_layer_kwargs_reach_every_layer_and_training_reduces_loss():
    model = MinGRULM(VOCAB, DIM, depth=3, layer="mingru", layer_kwargs={"mode": "linear", "expansion": 2.0})
    assert all(
        isinstance(b.rnn, MinGRU) and b.rnn.mode == "linear" and b.rnn.hidden == 16 for b in model.blocks
    )
    torch.manual_seed(0)
    ids = tokens(8, 12)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        logits, _ = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.75 * losses[0]


def test_angle_layer_by_name():
    model = MinGRULM(VOCAB, DIM, layer="angle", layer_kwargs={"head_dim": 4})
    assert isinstance(model.blocks[0].rnn, MinGRUAngle) and "layer='angle'" in repr(model)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((0, DIM), {}, r"num_tokens must be a positive int; got 0"),
        ((VOCAB, 2.0), {}, r"dim must be a positive int; got 2.0"),
        ((VOCAB, DIM), {"depth": 0}, r"depth must be a positive int; got 0"),
        (
            (VOCAB, DIM),
            {"layer": "gru"},
            r"layer must be one of 'mingru', 'minlstm', 'matrix', 'diag', 'angle'; got 'gru'",
        ),
        ((VOCAB, DIM), {"ff_mult": -1}, r"ff_mult must be a finite number > 0; got -1"),
        ((VOCAB, DIM), {"layer_kwargs": ["mode"]}, r"layer_kwargs must be a mapping or None; got list"),
        (
            (VOCAB, DIM),
            {"layer_kwargs": {"mode": "exp"}},
            r"MinGRU: mode must be one of 'log', 'linear'; got 'exp'",
        ),
    ],
    ids=["num_tokens", "dim", "depth", "layer", "ff_mult", "layer_kwargs-type", "layer_kwargs-value"],
)
def test_constructor_errors(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        MinGRULM(*args, **kwargs)


def test_input_errors():
    model = make("mingru-log", torch.float32)
    with pytest.raises(
        ValueError,
        match=r"MinGRULM.forward: tokens must be an integer tensor of shape \(batch, time\); got \(4,\)",
    ):
        model(tokens(1, 4)[0])
    with pytest.raises(
        ValueError, match=r"MinGRULM.forward: tokens must be an integer tensor; got dtype torch.float32"
    ):
        model(torch.zeros(1, 4))
    with pytest.raises(
        ValueError,
        match=r"MinGRULM.forward: states must be a list of 2 states \(one per block\) or None; got length 1",
    ):
        model(tokens(1, 4), [None])
    with pytest.raises(ValueError, match=r"states must be a list of 2 states .*; got Tensor"):
        model(tokens(1, 4), torch.zeros(2, 1, DIM))
    with pytest.raises(
        ValueError, match=r"MinGRULM.step: token must be an integer tensor of shape \(batch,\); got \(1, 4\)"
    ):
        model.step(tokens(1, 4))
    with pytest.raises(ValueError, match=r"MinGRU.forward: state must have shape \(1, 8\); got \(1, 3\)"):
        model(tokens(1, 4), [torch.zeros(1, 3), None])


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (
            (torch.zeros(2, 0, dtype=torch.long), 3),
            {},
            r"prompt must hold at least one token per row; got shape \(2, 0\)",
        ),
        ((torch.zeros(2, 1, dtype=torch.long), -1), {}, r"max_new_tokens must be an int >= 0; got -1"),
        ((torch.zeros(2, 1, dtype=torch.long), 2.0), {}, r"max_new_tokens must be an int >= 0; got 2.0"),
        (
            (torch.zeros(2, 1, dtype=torch.long), 2),
            {"temperature": -0.5},
            r"temperature must be a finite number >= 0; got -0.5",
        ),
        ((torch.zeros(2, 1, dtype=torch.long), 2), {"top_k": 0}, r"top_k must be a positive int; got 0"),
        ((torch.zeros(2, 1), 2), {}, r"prompt must be an integer tensor; got dtype torch.float32"),
    ],
    ids=[
        "prompt-empty",
        "max_new_tokens-negative",
        "max_new_tokens-float",
        "temperature-negative",
        "top_k-zero",
        "prompt-float",
    ],
)
def test_generate_errors(args, kwargs, message):
    model = make("mingru-log", torch.float32)
    with pytest.raises(ValueError, match=rf"MinGRULM.generate: {message}"):
        model.generate(*args, **kwargs)
