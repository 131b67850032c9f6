"""MinGRULM: a small residual language model over any recurrent layer, with O(1)-per-token generation."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from mingru.layers._common import RecurrentLayer, check_choice, check_positive_float, check_positive_int
from mingru.layers.angle import MinGRUAngle
from mingru.layers.diag import MinGRUDiag
from mingru.layers.matrix import MinGRUMatrix
from mingru.layers.mingru import MinGRU
from mingru.layers.minlstm import MinLSTM

LAYERS: dict[str, type[RecurrentLayer]] = {
    "mingru": MinGRU,
    "minlstm": MinLSTM,
    "matrix": MinGRUMatrix,
    "diag": MinGRUDiag,
    "angle": MinGRUAngle,
}


class _Block(nn.Module):
    """``x + rnn(norm(x))`` then ``x + ff(norm(x))`` with ``ff = Linear -> GELU -> Linear``."""

    def __init__(self, dim: int, rnn: RecurrentLayer, ff_hidden: int) -> None:
        super().__init__()
        self.rnn_norm = nn.RMSNorm(dim)
        self.rnn = rnn
        self.ff_norm = nn.RMSNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, ff_hidden), nn.GELU(), nn.Linear(ff_hidden, dim))

    def forward(self, x: Tensor, state: Tensor | None, *, step: bool = False) -> tuple[Tensor, Tensor]:
        """``x (B, T, dim)`` through the layer's ``forward``, or ``x (B, dim)`` through its ``step``."""
        rnn = self.rnn.step if step else self.rnn
        y, state = rnn(self.rnn_norm(x), state)
        x = x + y
        return x + self.ff(self.ff_norm(x)), state


class MinGRULM(nn.Module):
    """Token embedding, ``depth`` residual blocks (RMSNorm -> recurrent layer, RMSNorm -> feed-forward),
    a final RMSNorm and an output head tied to the embedding weight.

    Args:
        num_tokens: vocabulary size V.
        dim: model width.
        depth: number of residual blocks.
        layer: recurrent layer per block, one of ``mingru``, ``minlstm``, ``matrix``, ``diag``, ``angle``.
        ff_mult: feed-forward hidden width factor (``round(dim * ff_mult)``).
        layer_kwargs: keyword arguments for every recurrent layer (e.g. ``{"mode": "linear"}``).

    Raises:
        ValueError: an argument of the wrong type or out of range; a bad ``layer_kwargs`` entry raises the
            layer's own ValueError (TypeError for an unknown keyword).
    """

    def __init__(
        self,
        num_tokens: int,
        dim: int,
        *,
        depth: int = 2,
        layer: str = "mingru",
        ff_mult: float = 4,
        layer_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        owner = "MinGRULM"
        self.num_tokens = check_positive_int(owner, "num_tokens", num_tokens)
        self.dim = check_positive_int(owner, "dim", dim)
        self.depth = check_positive_int(owner, "depth", depth)
        self.layer = check_choice(owner, "layer", layer, tuple(LAYERS))
        ff_hidden = max(1, round(dim * check_positive_float(owner, "ff_mult", ff_mult)))
        if layer_kwargs is not None and not isinstance(layer_kwargs, Mapping):
            raise ValueError(
                f"{owner}: layer_kwargs must be a mapping or None; got {type(layer_kwargs).__name__}"
            )
        kwargs = layer_kwargs or {}

        self.embed = nn.Embedding(num_tokens, dim)
        nn.init.normal_(self.embed.weight, std=dim**-0.5)
        self.blocks = nn.ModuleList(
            _Block(dim, LAYERS[layer](dim, **kwargs), ff_hidden) for _ in range(depth)
        )
        self.norm = nn.RMSNorm(dim)

    def forward(
        self, tokens: Tensor, states: Sequence[Tensor | None] | None = None
    ) -> tuple[Tensor, list[Tensor]]:
        """Logits for every position.

        Args:
            tokens: ``(B, T)`` integer token ids in ``[0, num_tokens)``.
            states: one state per block (each ``(B, *layer.state_shape)`` or None), or None for zeros.

        Returns:
            ``(logits (B, T, num_tokens), states)``: the final state of every block (float32).

        Raises:
            ValueError: ``tokens`` not a 2-D integer tensor, or ``states`` of the wrong length / shape.
        """
        self._check_tokens(tokens, "forward", "tokens", 2)
        return self._run(tokens, states, "forward")

    def step(
        self, token: Tensor, states: Sequence[Tensor | None] | None = None
    ) -> tuple[Tensor, list[Tensor]]:
        """One position in O(1): ``token (B,)`` -> ``(logits (B, num_tokens), new states)``, as ``forward``.

        Raises:
            ValueError: ``token`` not a 1-D integer tensor, or ``states`` of the wrong length / shape.
        """
        self._check_tokens(token, "step", "token", 1)
        return self._run(token, states, "step")

    @torch.no_grad()
    def generate(
        self,
        prompt: Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Continue ``prompt (B, T0)`` by ``max_new_tokens`` tokens -> ``(B, T0 + max_new_tokens)``.

        The prompt is consumed by one parallel ``forward``; each new token costs one ``step``.
        ``temperature == 0`` is greedy decoding (argmax, ``top_k`` and ``generator`` unused); otherwise
        tokens are sampled from ``softmax(logits / temperature)`` restricted to the ``top_k`` largest
        logits when ``top_k`` is given (values above ``num_tokens`` keep every token).

        Raises:
            ValueError: ``prompt`` not a non-empty ``(B, T0)`` integer tensor, ``max_new_tokens`` not an
                int >= 0, ``temperature`` not a finite number >= 0, ``top_k`` not a positive int or None.
        """
        owner = "MinGRULM.generate"
        self._check_tokens(prompt, "generate", "prompt", 2)
        if prompt.shape[1] == 0:
            raise ValueError(
                f"{owner}: prompt must hold at least one token per row; got shape {tuple(prompt.shape)}"
            )
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"{owner}: max_new_tokens must be an int >= 0; got {max_new_tokens!r}")
        if (
            isinstance(temperature, bool)
            or not isinstance(temperature, (int, float))
            or not (0 <= temperature < math.inf)
        ):
            raise ValueError(f"{owner}: temperature must be a finite number >= 0; got {temperature!r}")
        if top_k is not None:
            check_positive_int(owner, "top_k", top_k)

        logits, states = self(prompt)
        logits = logits[:, -1]
        tokens = [prompt]
        for position in range(max_new_tokens):
            token = self._sample(logits, temperature, top_k, generator)
            tokens.append(token[:, None])
            if position + 1 < max_new_tokens:
                logits, states = self.step(token, states)
        return torch.cat(tokens, dim=1)

    @staticmethod
    def _sample(
        logits: Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None
    ) -> Tensor:
        if temperature == 0:
            return logits.argmax(dim=-1)
        logits = logits.float() / temperature
        if top_k is not None and top_k < logits.shape[-1]:
            kth = logits.topk(top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, -math.inf)
        return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)

    def _run(self, tokens: Tensor, states: object, method: str) -> tuple[Tensor, list[Tensor]]:
        x = self.embed(tokens)
        new_states = []
        for block, state in zip(self.blocks, self._check_states(states, method), strict=True):
            x, state = block(x, state, step=method == "step")
            new_states.append(state)
        return F.linear(self.norm(x), self.embed.weight), new_states

    def _check_tokens(self, tokens: Tensor, method: str, name: str, rank: int) -> None:
        expected = "(batch, time)" if rank == 2 else "(batch,)"
        if not isinstance(tokens, Tensor) or tokens.dim() != rank:
            got = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
            raise ValueError(
                f"MinGRULM.{method}: {name} must be an integer tensor of shape {expected}; got {got}"
            )
        if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
            raise ValueError(f"MinGRULM.{method}: {name} must be an integer tensor; got dtype {tokens.dtype}")

    def _check_states(self, states: object, method: str) -> Sequence[Tensor | None]:
        if states is None:
            return [None] * self.depth
        if isinstance(states, Tensor) or not isinstance(states, Sequence) or len(states) != self.depth:
            got = f"length {len(states)}" if isinstance(states, Sequence) else type(states).__name__
            expected = f"a list of {self.depth} states (one per block) or None"
            raise ValueError(f"MinGRULM.{method}: states must be {expected}; got {got}")
        return states

    def extra_repr(self) -> str:
        return f"num_tokens={self.num_tokens}, dim={self.dim}, depth={self.depth}, layer={self.layer!r}"
