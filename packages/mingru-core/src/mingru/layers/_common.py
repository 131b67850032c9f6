"""Shared pieces of the recurrent layers: argument checks, dtype rules and the state-handling base class.

Dtype rule for every layer: gates and values are computed from the projections in the *state dtype*
``promote_types(x.dtype, float32)`` (float32 for half/bfloat16/float32 inputs, float64 for float64), the
recurrence runs and the carried state is kept in that dtype, and the output is cast back to ``x.dtype``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.modules import module as _module
from torch.nn.utils import parametrize

from mingru.dispatch import ScanFallback, _dispatch_gated, _gated_without_autograd
from mingru.layers._recompute import chunked_forward
from mingru.min_gru import linear_recurrence, log_recurrence

MODES = ("log", "linear")
RECOMPUTE_CHUNK_BYTES = 32 * 2**20
"""With ``recompute=True`` and no ``chunk_len``: the bytes of projections and states one chunk may hold."""
MIN_CHUNK_LEN = 64


def check_positive_int(owner: str, name: str, value: object) -> int:
    """Return ``value`` if it is an int > 0. Raises ValueError naming ``owner.name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{owner}: {name} must be a positive int; got {value!r}")
    return value


def check_positive_float(owner: str, name: str, value: object) -> float:
    """Return ``float(value)`` if it is a finite real number > 0. Raises ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
        raise ValueError(f"{owner}: {name} must be a finite number > 0; got {value!r}")
    return float(value)


def check_choice(owner: str, name: str, value: object, choices: Sequence[str]) -> str:
    """Return ``value`` if it is one of ``choices``. Raises ValueError listing the choices otherwise."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{owner}: {name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
    return value


def check_bool(owner: str, name: str, value: object) -> bool:
    """Return ``value`` if it is a bool. Raises ValueError otherwise."""
    if not isinstance(value, bool):
        raise ValueError(f"{owner}: {name} must be a bool; got {value!r}")
    return value


def hidden_width(owner: str, dim: int, expansion: object) -> int:
    """``round(dim * expansion)``; ValueError when ``expansion`` is not > 0 or the width rounds to 0."""
    expansion = check_positive_float(owner, "expansion", expansion)
    hidden = round(dim * expansion)
    if hidden < 1:
        raise ValueError(
            f"{owner}: expansion must give a hidden width round(dim * expansion) >= 1; "
            f"got dim={dim}, expansion={expansion!r} -> {hidden}"
        )
    return hidden


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the recurrence runs and the state is kept in: float64 for float64 input, else float32."""
    return torch.promote_types(dtype, torch.float32)


class RecurrentLayer(nn.Module):
    """Base class: input/state validation and the ``forward`` / ``step`` / ``init_state`` contract.

    Subclasses set ``self.dim`` and ``self.proj_in`` (the input projection), call ``_init_recompute`` and
    implement ``state_shape`` (per example), ``_forward(x, h0)`` and ``_step(x_t, h)``; ``h0`` and ``h``
    arrive validated and in the state dtype (``h0`` is None for zeros).
    """

    dim: int
    proj_in: nn.Linear
    recompute: bool = False
    chunk_len: int | None = None

    def _init_recompute(self, owner: str, recompute: object, chunk_len: object) -> None:
        """Validate and keep ``recompute`` (a bool) and ``chunk_len`` (None or an int > 0, with recompute)."""
        self.recompute = check_bool(owner, "recompute", recompute)
        if chunk_len is not None:
            self.chunk_len = check_positive_int(owner, "chunk_len", chunk_len)
            if not recompute:
                raise ValueError(
                    f"{owner}: chunk_len applies only with recompute=True; got chunk_len={chunk_len}, "
                    "recompute=False"
                )

    def recompute_chunk_len(self, batch: int, dtype: torch.dtype = torch.float32) -> int:
        """Steps per chunk under ``recompute=True``: ``chunk_len`` if set, else the most steps (a multiple of
        64, at least 64) whose projections and states, ``batch * steps * (proj_in.out_features +
        prod(state_shape))`` elements of the state dtype, fit in ``RECOMPUTE_CHUNK_BYTES``."""
        if self.chunk_len is not None:
            return self.chunk_len
        width = self.proj_in.out_features + math.prod(self.state_shape)
        step_bytes = max(1, batch) * width * state_dtype(dtype).itemsize
        steps = RECOMPUTE_CHUNK_BYTES // step_bytes
        return max(MIN_CHUNK_LEN, steps - steps % MIN_CHUNK_LEN)

    @property
    def state_shape(self) -> tuple[int, ...]:
        """Shape of one example's state (the batch dimension excluded)."""
        raise NotImplementedError

    def _forward_chunks(self, x: Tensor) -> int:
        """How many chunks of ``recompute=True`` one :meth:`_chunk_forward` call may take (1 here)."""
        return 1

    def _chunk_forward(self, x: Tensor, h0: Tensor | None, y: Tensor, chunk_len: int) -> list[Tensor]:
        """``recompute=True``'s forward over ``x (B, L, dim)``, at most :meth:`_forward_chunks` chunks of
        ``chunk_len`` steps: ``_forward(x, h0)`` with its output written into ``y`` (a view ``(B, L, dim)``);
        returns the state after each chunk (here one chunk: the final state)."""
        y_chunk, final = self._forward(x, h0)
        y.copy_(y_chunk)
        return [final]

    def _chunk_adjoint_ok(self) -> bool:
        """Whether :meth:`_chunk_adjoint` may stand in for autograd over a recomputed chunk (False here: the
        chunks of ``recompute=True`` run autograd over ``_forward``)."""
        return False

    def _chunk_adjoint(
        self,
        x: Tensor,
        h0: Tensor | None,
        d_y: Tensor,
        d_final: Tensor,
        need_x: bool,
        need_h0: bool,
        params: Sequence[Tensor],
    ) -> tuple[Tensor | None, Tensor | None, list[Tensor | None]]:
        """The gradients of one chunk of ``recompute=True``, recomputed from its input ``x (B, L, dim)`` and
        initial state ``h0`` (None: zeros) against ``d_y (B, L, dim)`` and ``d_final`` (the final state's
        gradient): ``(d x or None, d h0 or None, the gradient of each of params or None)``."""
        raise NotImplementedError

    def init_state(
        self, batch: int, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32
    ) -> Tensor:
        """Zero state ``(batch, *state_shape)`` (float32 by default). Raises ValueError unless batch >= 0."""
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 0:
            raise ValueError(f"{type(self).__name__}.init_state: batch must be an int >= 0; got {batch!r}")
        return torch.zeros((batch, *self.state_shape), device=device, dtype=dtype)

    def forward(self, x: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Run the layer over a sequence.

        Args:
            x: ``(B, T, dim)`` floating input.
            state: initial state ``(B, *state_shape)`` or None for zeros; cast to the state dtype.

        Returns:
            ``(y, final_state)``: ``y`` is ``(B, T, dim)`` in ``x.dtype``; ``final_state`` is
            ``(B, *state_shape)`` in float32 (float64 for float64 ``x``). ``T == 0`` returns ``state``.
            With ``recompute=True`` the same values come from chunks of ``recompute_chunk_len`` steps, of
            which autograd keeps only the initial states (``mingru.layers._recompute``).

        Raises:
            ValueError: wrong rank, width or dtype of ``x``; wrong shape or device of ``state``.
        """
        self._check_input(x, "forward", "x", ("batch", "time"))
        h0 = self._prepare_state(state, x, "forward")
        if x.shape[1] == 0:
            final = h0 if h0 is not None else self.init_state(x.shape[0], x.device, state_dtype(x.dtype))
            return x.new_zeros(x.shape), final
        if self.recompute:
            return chunked_forward(self, x, h0, self.recompute_chunk_len(x.shape[0], x.dtype))
        return self._forward(x, h0)

    def step(self, x_t: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Advance the recurrence by one position in O(1): equal to ``forward`` on that position.

        Args:
            x_t: ``(B, dim)`` floating input of one position.
            state: ``(B, *state_shape)`` state before the position, or None for zeros.

        Returns:
            ``(y_t (B, dim)`` in ``x_t.dtype``, new state in float32 (float64 for float64 ``x_t``)).

        Raises:
            ValueError: like ``forward``.
        """
        self._check_input(x_t, "step", "x_t", ("batch",))
        h = self._prepare_state(state, x_t, "step")
        if h is None:
            h = self.init_state(x_t.shape[0], x_t.device, state_dtype(x_t.dtype))
        return self._step(x_t, h)

    def _forward(self, x: Tensor, h0: Tensor | None) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def _step(self, x_t: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def _check_input(self, x: Tensor, method: str, name: str, leading: tuple[str, ...]) -> None:
        where = f"{type(self).__name__}.{method}"
        expected = "(" + ", ".join((*leading, str(self.dim))) + ")"
        if not isinstance(x, Tensor):
            raise ValueError(f"{where}: {name} must be a Tensor of shape {expected}; got {type(x).__name__}")
        if x.dim() != len(leading) + 1 or x.shape[-1] != self.dim:
            raise ValueError(f"{where}: {name} must have shape {expected}; got {tuple(x.shape)}")
        if not x.is_floating_point():
            raise ValueError(f"{where}: {name} must be a floating tensor; got dtype {x.dtype}")

    def _prepare_state(self, state: Tensor | None, x: Tensor, method: str) -> Tensor | None:
        if state is None:
            return None
        where = f"{type(self).__name__}.{method}"
        expected = (x.shape[0], *self.state_shape)
        if not isinstance(state, Tensor):
            raise ValueError(
                f"{where}: state must be a Tensor of shape {expected} or None; got {type(state).__name__}"
            )
        if tuple(state.shape) != expected:
            raise ValueError(f"{where}: state must have shape {expected}; got {tuple(state.shape)}")
        if state.device != x.device:
            raise ValueError(f"{where}: state must be on the input's device {x.device}; got {state.device}")
        return state.to(state_dtype(x.dtype))


def _flat(t: Tensor) -> Tensor:
    """``t (B, L, n)`` as ``(B L, n)``."""
    return t.reshape(-1, t.shape[-1])


def _has_hooks(module: nn.Module) -> bool:
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or module._backward_hooks
        or module._backward_pre_hooks
    )


def _global_module_hooks() -> bool:
    """Whether any global module hook is registered (``torch.nn.modules.module.register_module_*_hook``)."""
    names = (
        "_global_forward_hooks",
        "_global_forward_pre_hooks",
        "_global_backward_hooks",
        "_global_backward_pre_hooks",
    )
    return any(getattr(_module, name, None) for name in names)


def log_g(x: Tensor) -> Tensor:
    """``log g(x)`` for the paper's positive activation ``g(x) = x + 0.5 (x >= 0), sigmoid(x) (x < 0)``."""
    return torch.where(x >= 0, torch.log(torch.relu(x) + 0.5), -nn.functional.softplus(-x))


class _LogGates(torch.autograd.Function):
    """(k, v) -> (log a, log b) = (-softplus(k), -softplus(-k) + log g(v)), saving only k and v.

    Left to autograd, these elementwise maps save about five tensors of k's size (-k, -v, relu(v),
    relu(v) + 0.5, two masks); here the backward computes the derivatives from k and v:
    d k = sigmoid(-k) d log b - sigmoid(k) d log a and d v = d log b (1 / (v + 0.5) for v >= 0, else
    sigmoid(-v)). The forward runs the same operations as ``log_g`` does.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        return -nn.functional.softplus(k), -nn.functional.softplus(-k) + log_g(v)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, Tensor], output: Any) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx: Any, d_log_a: Tensor, d_log_b: Tensor) -> tuple[Tensor, Tensor]:
        k, v = ctx.saved_tensors
        d_k = torch.sigmoid(-k) * d_log_b - torch.sigmoid(k) * d_log_a
        d_log_g = torch.where(v >= 0, (torch.relu(v) + 0.5).reciprocal(), torch.sigmoid(-v))
        return d_k, d_log_b * d_log_g


def log_gates(k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """``(log a, log b) = (-softplus(k), -softplus(-k) + log g(v))``: the log-space coefficients of a gate
    ``z = sigmoid(k)`` (``a = 1 - z``, ``b = z g(v)``). Differentiable; saves only ``k`` and ``v``."""
    return _LogGates.apply(k, v)


class ScalarGatedLayer(RecurrentLayer):
    """Single-head layers with state ``(B, hidden)`` and ``h_t = a_t * h_{t-1} + b_t``.

    One input projection ``dim -> branches * hidden`` gives every pre-activation; an output projection
    ``hidden -> dim`` follows when ``hidden != dim``. Subclasses map the pre-activations (in the state
    dtype) to ``(log a, log b)`` for ``mode="log"`` and to ``(a, b)`` for ``mode="linear"``.
    """

    def __init__(
        self,
        dim: int,
        expansion: float,
        mode: str,
        bias: bool,
        branches: int,
        recompute: bool = False,
        chunk_len: int | None = None,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        self._init_recompute(owner, recompute, chunk_len)
        self.dim = check_positive_int(owner, "dim", dim)
        self.hidden = hidden_width(owner, dim, expansion)
        self.mode = check_choice(owner, "mode", mode, MODES)
        check_bool(owner, "bias", bias)
        self.proj_in = nn.Linear(dim, branches * self.hidden, bias=bias)
        self.proj_out: nn.Module = (
            nn.Linear(self.hidden, dim, bias=bias) if self.hidden != dim else nn.Identity()
        )

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (self.hidden,)

    @property
    def gated_kind(self) -> str:
        """The recurrence as the fused-gates kernels name it ("gru-log", "lstm-linear", ...)."""
        raise NotImplementedError

    def _log_coefficients(self, pre: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def _coefficients(self, pre: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def _unfused(self, pre: Tensor, h0: Tensor | None) -> Tensor:
        """The states from the pre-activations: the gates in the state dtype, then the dispatched recurrence
        (the reference of the fused kernels)."""
        pre = pre.to(state_dtype(pre.dtype))
        if self.mode == "log":
            return log_recurrence(*self._log_coefficients(pre), h0)
        return linear_recurrence(*self._coefficients(pre), h0)

    def _forward(self, x: Tensor, h0: Tensor | None) -> tuple[Tensor, Tensor]:
        pre = self.proj_in(x)
        h = _dispatch_gated(self.mode, self.gated_kind, self._unfused, pre, h0)
        return self.proj_out(h.to(x.dtype)), h[:, -1].clone()

    def _by_hand(self, x: Tensor) -> bool:
        return not torch.is_autocast_enabled(x.device.type) and self._chunk_adjoint_ok()

    def _forward_chunks(self, x: Tensor) -> int:
        """Two chunks per forward call where the chunks run by hand (:meth:`_chunk_adjoint_ok`, no autocast):
        the forward's temporaries for two chunks (projection and states) are as large as the adjoint's for one
        (those and their gradients), and the backward holds the output gradients besides, so the step's peak
        stays in the backward while the forward makes half the calls."""
        return 2 if self._by_hand(x) else 1

    def _chunk_forward(self, x: Tensor, h0: Tensor | None, y: Tensor, chunk_len: int) -> list[Tensor]:
        """``_forward`` writing into ``y`` without the projections' modules where the chunks run by hand (one
        cast-and-copy of the states into ``y`` with no output projection), over as many chunks as
        :meth:`_forward_chunks` gives; returns the state after each chunk."""
        if not self._by_hand(x):
            return super()._chunk_forward(x, h0, y, chunk_len)
        pre = nn.functional.linear(x, self.proj_in.weight, self.proj_in.bias)
        h = _dispatch_gated(self.mode, self.gated_kind, self._unfused, pre, h0)
        if isinstance(self.proj_out, nn.Linear):
            y.copy_(nn.functional.linear(h.to(x.dtype), self.proj_out.weight, self.proj_out.bias))
        else:
            y.copy_(h)
        # The state after each chunk: steps chunk_len - 1, 2 chunk_len - 1, ... and the last. A strided slice,
        # copied so that the states do not keep h alive (indexing with a list of steps would copy that list
        # to the device and wait for it, about 0.5 ms of host time per call on an H200 host), chunk-major so
        # that each state is contiguous (the next chunk's kernel then takes it as it is).
        picked = h[:, chunk_len - 1 :: chunk_len].transpose(0, 1)
        states = list(picked.clone(memory_format=torch.contiguous_format).unbind(0))
        if x.shape[1] % chunk_len:
            states.append(h[:, -1].clone())
        return states

    def _chunk_adjoint_ok(self) -> bool:
        """True for this class's ``_forward`` over plain ``nn.Linear`` / ``nn.Identity`` projections with no
        module hooks (their own or global) and no parametrization: then :meth:`_chunk_adjoint` computes
        what autograd over ``_forward`` would, without running the projections' modules."""
        if type(self)._forward is not ScalarGatedLayer._forward or type(self.proj_in) is not nn.Linear:
            return False
        if type(self.proj_out) not in (nn.Linear, nn.Identity):
            return False
        for module in (self.proj_in, self.proj_out):
            if parametrize.is_parametrized(module) or _has_hooks(module):
                return False
        return not _global_module_hooks()

    def _chunk_adjoint(
        self,
        x: Tensor,
        h0: Tensor | None,
        d_y: Tensor,
        d_final: Tensor,
        need_x: bool,
        need_h0: bool,
        params: Sequence[Tensor],
    ) -> tuple[Tensor | None, Tensor | None, list[Tensor | None]]:
        """One recomputed chunk's gradients (see the base class) by hand: ``pre = x W_in^T + b_in`` without a
        graph, ``h`` from ``pre`` and ``h0`` as ``_forward`` runs it, ``d h = d_y W_out`` (or ``d_y``) plus
        ``d_final`` at the last step, ``(d pre, d h0)`` from the recurrence's adjoint (the fused kernel's
        without autograd where the plugin gives it, else autograd over the recurrence alone:
        :meth:`_chunk_recurrence_grads`), ``d x = d pre W_in``, ``d W_in = d pre^T x``, ``d b_in`` the sum of
        ``d pre`` (and the output projection's likewise). The same products as autograd over ``_forward``
        takes, with fewer tensors and host operations per chunk."""
        proj_in, proj_out = self.proj_in, self.proj_out
        wanted = {id(p) for p in params}
        grads: dict[int, Tensor] = {}
        x = x.contiguous()  # a time slice: one copy, read by the projection and by d W_in as it is
        d_y = d_y.contiguous() if isinstance(proj_out, nn.Linear) else d_y
        with torch.no_grad():
            pre = nn.functional.linear(x, proj_in.weight, proj_in.bias)
        d_pre, d_state = self._chunk_recurrence_grads(pre, h0, d_y, d_final, need_h0, wanted, grads)
        if id(proj_in.weight) in wanted:
            grads[id(proj_in.weight)] = _flat(d_pre).t() @ _flat(x)
        if proj_in.bias is not None and id(proj_in.bias) in wanted:
            grads[id(proj_in.bias)] = d_pre.sum((0, 1))
        d_x = d_pre @ proj_in.weight if need_x else None
        return d_x, d_state, [grads.get(id(p)) for p in params]

    def _chunk_recurrence_grads(
        self,
        pre: Tensor,
        h0: Tensor | None,
        d_y: Tensor,
        d_final: Tensor,
        need_h0: bool,
        wanted: set[int],
        grads: dict[int, Tensor],
    ) -> tuple[Tensor, Tensor | None]:
        """``(d pre, d h0 or None)`` of one chunk, the output projection's gradients into ``grads``. Where
        the plugin gives the fused kernel and its adjoint (:func:`mingru.dispatch._gated_without_autograd`)
        they run without autograd: ``d h = d_y W_out`` (or the slice ``d_y`` itself) reaches the adjoint in
        x's dtype and ``d_final`` joins it inside the kernel. Elsewhere autograd over the dispatched
        recurrence, on ``d h`` in the state dtype with ``d_final`` added at the last step."""
        direct = _gated_without_autograd(self.mode, self.gated_kind, pre, h0)
        if direct is not None:
            h, state, adjoint = direct
            d_out = self._chunk_output_grads(d_y, h, pre.dtype, wanted, grads)
            try:
                d_pre, d_h0 = adjoint(pre, state, h, d_out, d_final)
            except ScanFallback:
                grads.clear()  # the autograd path below gives them again
            else:
                return d_pre, d_h0 if h0 is not None and need_h0 else None
        pre.requires_grad_()
        leaf = None if h0 is None else h0.detach().requires_grad_(need_h0)
        with torch.enable_grad():
            h = _dispatch_gated(self.mode, self.gated_kind, self._unfused, pre, leaf)
        d_out = self._chunk_output_grads(d_y, h.detach(), pre.dtype, wanted, grads)
        d_h = d_out.to(h.dtype, copy=d_out is d_y)  # written in place below
        d_h[:, -1] += d_final
        inputs = [pre] if leaf is None or not need_h0 else [pre, leaf]
        d_pre, *d_states = torch.autograd.grad(h, inputs, d_h)
        return d_pre, d_states[0] if d_states else None

    def _chunk_output_grads(
        self, d_y: Tensor, h: Tensor, dtype: torch.dtype, wanted: set[int], grads: dict[int, Tensor]
    ) -> Tensor:
        """The output projection's part of :meth:`_chunk_adjoint`: its parameters' gradients into
        ``grads`` (those ``wanted``) and ``d h = d_y W_out`` in ``dtype``, or ``d_y`` without a projection."""
        proj_out = self.proj_out
        if not isinstance(proj_out, nn.Linear):
            return d_y
        if id(proj_out.weight) in wanted:
            grads[id(proj_out.weight)] = _flat(d_y).t() @ _flat(h.to(dtype))
        if proj_out.bias is not None and id(proj_out.bias) in wanted:
            grads[id(proj_out.bias)] = d_y.sum((0, 1))
        return d_y @ proj_out.weight

    def _step(self, x_t: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        pre = self.proj_in(x_t).to(h.dtype)
        if self.mode == "log":
            log_a, log_b = self._log_coefficients(pre)
            a, b = log_a.exp(), log_b.exp()
        else:
            a, b = self._coefficients(pre)
        h = a * h + b
        return self.proj_out(h.to(x_t.dtype)), h


class MatrixStateLayer(RecurrentLayer):
    """Multi-head layers with a ``(B, heads, k, v)`` matrix state ``H_t = A_t(H_{t-1}) + B_t``.

    One input projection gives, per head, ``transition_width`` transition pre-activations, a query and a
    key (``k`` each) and a value (``v``); the read-out ``y_head = q_t^T H_t`` of all heads is concatenated
    and mapped back to ``dim`` by an output Linear. Subclasses give ``_transition_width(k)``, build
    ``(transition, B_t)``, run the scan and apply one transition in ``step``; their class docstrings describe
    the constructor's arguments.
    """

    def __init__(
        self,
        dim: int,
        *,
        heads: int = 4,
        head_dim: int = 8,
        value_dim: int | None = None,
        recompute: bool = False,
        chunk_len: int | None = None,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        self._init_recompute(owner, recompute, chunk_len)
        self.dim = check_positive_int(owner, "dim", dim)
        self.heads = check_positive_int(owner, "heads", heads)
        self.head_dim = check_positive_int(owner, "head_dim", head_dim)
        self.value_dim = head_dim if value_dim is None else check_positive_int(owner, "value_dim", value_dim)
        k, v = self.head_dim, self.value_dim
        self._split_sizes = (self._transition_width(k), k, k, v)
        self.proj_in = nn.Linear(dim, heads * sum(self._split_sizes))
        self.proj_out = nn.Linear(heads * v, dim)
        self._init_transition()

    @staticmethod
    def _transition_width(k: int) -> int:
        """Transition pre-activations per head for state size ``k``."""
        raise NotImplementedError

    def _init_transition(self) -> None:
        """Set the transition's initial parameters after the projections are built (default: as built)."""

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (self.heads, self.head_dim, self.value_dim)

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(transition (..., n, w), query, key (..., n, k), value (..., n, v))`` in the state dtype."""
        pre = self.proj_in(x).to(state_dtype(x.dtype))
        pre = pre.unflatten(-1, (self.heads, sum(self._split_sizes)))
        transition, query, key, value = pre.split(self._split_sizes, dim=-1)
        return transition, query, key, value

    def _readout(self, query: Tensor, h: Tensor, dtype: torch.dtype) -> Tensor:
        """``proj_out(concat_heads(q^T H))`` for ``query (..., n, k)`` and ``h (..., n, k, v)``."""
        y = torch.einsum("...nk,...nkv->...nv", query, h).flatten(-2)
        return self.proj_out(y.to(dtype))

    def _transition(self, transition: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def _scan(self, a: Tensor, b: Tensor, h0: Tensor | None) -> Tensor:
        raise NotImplementedError

    def _apply_transition(self, a: Tensor, h: Tensor) -> Tensor:
        raise NotImplementedError

    def _forward(self, x: Tensor, h0: Tensor | None) -> tuple[Tensor, Tensor]:
        transition, query, key, value = self._project(x)
        h = self._scan(*self._transition(transition, key, value), h0)
        return self._readout(query, h, x.dtype), h[:, -1].clone()

    def _step(self, x_t: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        transition, query, key, value = self._project(x_t)
        a, b = self._transition(transition, key, value)
        h = self._apply_transition(a, h) + b
        return self._readout(query, h, x_t.dtype), h

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.heads}, head_dim={self.head_dim}, value_dim={self.value_dim}"
