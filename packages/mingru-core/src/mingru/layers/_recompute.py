"""Training with less memory: run a layer over time chunks and recompute each chunk in the backward.

``chunked_forward(layer, x, h0, chunk_len)`` returns what ``layer._forward(x, h0)`` returns, ``(y (B, T, dim),
final state)``, but autograd keeps only ``x``, the parameters and the state at the start of each chunk of
``chunk_len`` steps, ``(ceil(T / chunk_len), B, *state_shape)``. The backward walks the chunks from the last
to the first: it reruns the chunk's forward (projection, gates, scan) with autograd on, from the stored
state, and backpropagates ``dy`` of the chunk plus the carried ``d state`` through it; the chunk's ``d h0``
is the carry into the chunk before. ``dx`` is written chunk by chunk into one buffer and the parameter
gradients are summed, so the backward holds one chunk's activations and gradients at a time.

A layer may run its chunks itself (``RecurrentLayer._chunk_forward`` over one or more chunks per call,
``_chunk_adjoint`` for one chunk's gradients where ``_chunk_adjoint_ok``): ``MinGRU`` and ``MinLSTM`` with
plain projections recompute the projection without a graph and run autograd over the recurrence alone, and
their forward takes two chunks per call; the others run ``_forward`` and autograd over it.

Math: the chunks compose exactly (``h`` at the end of chunk c is the initial state of chunk c + 1), so the
outputs and gradients equal the single pass up to the rounding of a different order of operations. Under
``torch.compile`` the same chunks run through ``torch.utils.checkpoint`` (autograd cannot run inside a
traced backward); the compiler then plans the buffers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

if TYPE_CHECKING:
    from mingru.layers._common import RecurrentLayer


def chunk_starts(length: int, chunk_len: int) -> list[int]:
    """The first step of each chunk: ``0, chunk_len, 2 chunk_len, ...`` below ``length``. Under
    ``torch.compile`` with a symbolic ``length`` this guards the number of chunks, not the length."""
    count = (length + chunk_len - 1) // chunk_len
    return [index * chunk_len for index in range(count)]


def _autocast_state(device_type: str) -> tuple[bool, torch.dtype]:
    return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)


class _ChunkedRecompute(torch.autograd.Function):
    """``(x, h0, *params) -> (y, h_T)`` over time chunks, saving one state per chunk (see the module)."""

    @staticmethod
    def forward(
        ctx: Any, layer: RecurrentLayer, chunk_len: int, x: Tensor, h0: Tensor | None, *params: Tensor
    ) -> tuple[Tensor, Tensor]:
        starts = chunk_starts(x.shape[1], chunk_len)
        y = x.new_empty(x.shape)
        state = h0
        states: list[Tensor] = []
        span = layer._forward_chunks(x) * chunk_len  # steps per forward call: one or more whole chunks
        for start in range(0, x.shape[1], span):
            ends = layer._chunk_forward(
                x[:, start : start + span], state, y[:, start : start + span], chunk_len
            )
            for end in ends:
                if state is not None:
                    states.append(state)
                state = end
        assert state is not None and len(states) == len(starts) - (h0 is None)
        ctx.layer, ctx.chunk_len, ctx.has_h0 = layer, chunk_len, h0 is not None
        ctx.autocast = _autocast_state(x.device.type)
        ctx.save_for_backward(x, torch.stack(states) if states else None, *params)
        return y, state

    @staticmethod
    def backward(ctx: Any, d_y: Tensor, d_final: Tensor) -> tuple[Tensor | None, ...]:
        x, states, *params = ctx.saved_tensors
        layer: RecurrentLayer = ctx.layer
        chunk_len: int = ctx.chunk_len
        needs_x, needs_h0 = ctx.needs_input_grad[2], ctx.needs_input_grad[3]
        wanted = [i for i, p in enumerate(params) if ctx.needs_input_grad[4 + i]]
        d_x = torch.empty_like(x) if needs_x else None
        d_params: list[Tensor | None] = [None] * len(params)
        carry = d_final
        starts = chunk_starts(x.shape[1], chunk_len)
        autocast_enabled, autocast_dtype = ctx.autocast
        device_type = x.device.type
        # Layers that can (plain projections, no hooks, no autocast) give a chunk's gradients themselves:
        # autograd then runs over the recurrence alone, not over the projections and casts.
        by_hand = not autocast_enabled and layer._chunk_adjoint_ok()
        for index in reversed(range(len(starts))):
            start = starts[index]
            # states holds the initial state of every chunk, but for chunk 0 when h0 is None (zeros)
            state_index = index if ctx.has_h0 else index - 1
            if by_hand:
                need_state = state_index >= 0 and (index > 0 or needs_h0)
                if not (needs_x or need_state or wanted):
                    continue
                d_x_chunk, d_state, by_hand_grads = layer._chunk_adjoint(
                    x[:, start : start + chunk_len],
                    states[state_index] if state_index >= 0 else None,
                    d_y[:, start : start + chunk_len],
                    carry,
                    needs_x,
                    need_state,
                    [params[i] for i in wanted],
                )
                if d_x is not None and d_x_chunk is not None:
                    d_x[:, start : start + chunk_len] = d_x_chunk
                if need_state and d_state is not None:
                    carry = d_state
                _accumulate(d_params, params, wanted, tuple(by_hand_grads))
                del d_x_chunk, d_state, by_hand_grads
                continue
            with (
                torch.enable_grad(),
                torch.autocast(device_type, dtype=autocast_dtype, enabled=autocast_enabled),
            ):
                x_chunk = x[:, start : start + chunk_len].detach().requires_grad_(needs_x)
                state = None
                if state_index >= 0:
                    state = states[state_index].detach().requires_grad_(index > 0 or needs_h0)
                y_chunk, final = layer._forward(x_chunk, state)
            inputs = [t for t in (x_chunk, state) if t is not None and t.requires_grad]
            inputs += [params[i] for i in wanted]
            if not inputs:
                continue
            grads = torch.autograd.grad(
                (y_chunk, final), inputs, (d_y[:, start : start + chunk_len], carry), allow_unused=True
            )
            position = 0
            if x_chunk.requires_grad:
                if d_x is not None:
                    d_x[:, start : start + chunk_len] = _zeros_if_none(grads[0], x_chunk)
                position += 1
            if state is not None and state.requires_grad:
                carry = _zeros_if_none(grads[position], state)
                position += 1
            _accumulate(d_params, params, wanted, grads[position:])
            # free this chunk's output and gradients before the next chunk is recomputed
            del y_chunk, final, grads
        d_h0 = carry if ctx.has_h0 and needs_h0 else None
        d_params = [None if g is None else g.to(p.dtype) for g, p in zip(d_params, params, strict=True)]
        return (None, None, d_x, d_h0, *d_params)


def _accumulate(
    totals: list[Tensor | None], params: list[Tensor], wanted: list[int], grads: tuple[Tensor | None, ...]
) -> None:
    """``totals[i] += grad`` for the parameters ``wanted``, in place and in float32 at least (one pass sums
    over all steps in the projection's accumulator; the chunks should not round to bfloat16 in between)."""
    for i, grad in zip(wanted, grads, strict=True):
        if grad is None:
            continue
        total = totals[i]
        if total is None:
            total = totals[i] = torch.zeros_like(
                params[i], dtype=torch.promote_types(grad.dtype, torch.float32)
            )
        total.add_(grad)


def _zeros_if_none(grad: Tensor | None, like: Tensor) -> Tensor:
    return torch.zeros_like(like) if grad is None else grad


def _checkpointed(
    layer: RecurrentLayer, x: Tensor, h0: Tensor | None, chunk_len: int
) -> tuple[Tensor, Tensor]:
    outputs = []
    state = h0
    for start in chunk_starts(x.shape[1], chunk_len):
        y_chunk, state = checkpoint(
            layer._forward, x[:, start : start + chunk_len], state, use_reentrant=False
        )
        outputs.append(y_chunk)
    assert state is not None
    return torch.cat(outputs, dim=1), state


def chunked_forward(
    layer: RecurrentLayer, x: Tensor, h0: Tensor | None, chunk_len: int
) -> tuple[Tensor, Tensor]:
    """``layer._forward(x, h0)`` over chunks of ``chunk_len`` steps, recomputed in the backward (module doc).

    ``x (B, T, dim)``, ``h0 (B, *state_shape)`` in the state dtype or None; returns ``(y (B, T, dim),
    final state)`` like ``_forward``. With nothing to differentiate (grad mode off, or no input or parameter
    requiring grad) or a single chunk (``T <= chunk_len``) it runs ``_forward`` itself, as
    ``torch.utils.checkpoint`` does.
    """
    params = list(layer.parameters())
    differentiable = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, h0, *params)
    )
    if not differentiable or x.shape[1] <= chunk_len:
        return layer._forward(x, h0)
    if torch.compiler.is_compiling():
        return _checkpointed(layer, x, h0, chunk_len)
    y, final = _ChunkedRecompute.apply(layer, chunk_len, x, h0, *params)
    return y, final
