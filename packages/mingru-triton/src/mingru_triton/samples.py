"""Small sample inputs for every ``torch.ops.mingru`` op: what ``torch.library.opcheck`` and the fake-tensor
tests of mingru-compile run each op on.

:func:`sample_inputs` returns, for one op, a list of ``(args, kwargs)`` calls on one device in one floating
dtype: ordinary sizes, odd and non-power-of-two ones, T = 1, B = 1, non-contiguous inputs, ``-inf`` in the
log-space inputs and, for the angle scan, both integer dtypes of the layout and every flag combination.
Inputs of the forward ops (those with a registered autograd formula) require grad, so that opcheck also
tests the autograd registration; inputs of the backward ops do not (they have no autograd formula).

:data:`OUTPUT_LIKE` states the fake-tensor contract of each op: output ``i`` has the shape, dtype and device
of argument ``OUTPUT_LIKE[op][i]`` and is contiguous.

Creating the samples runs no kernel (plain torch factories), so they also serve fake-tensor tests on a
machine without CUDA. This module does not need ``triton``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from mingru.scans.angle import default_angle_layout

__all__ = ["BACKWARD_OPS", "FORWARD_OPS", "OP_NAMES", "OUTPUT_LIKE", "Sample", "output_like", "sample_inputs"]

Sample = tuple[tuple[Any, ...], dict[str, Any]]
"""One call: ``op(*args, **kwargs)``."""

OUTPUT_LIKE: dict[str, tuple[int, ...]] = {
    "linear_scan_fwd": (0, 1),
    "linear_scan_bwd": (0, 2),
    "linear_recurrence_fwd": (1,),
    "linear_recurrence_bwd": (0, 2, 1),
    "parallel_scan_log_fwd": (0,),
    "parallel_scan_log_bwd": (0, 1),
    "log_recurrence_fwd": (0,),
    "log_recurrence_bwd": (0, 1, 2),
    "affine_scan_fwd": (0, 1),
    "affine_scan_bwd": (0, 2),
    "affine_recurrence_fwd": (1,),
    "affine_recurrence_bwd": (0, 2, 1),
    "diag_scan_fwd": (0, 1),
    "diag_scan_bwd": (0, 2),
    "diag_recurrence_fwd": (1,),
    "diag_recurrence_bwd": (0, 2, 1),
    "angle_scan_fwd": (3,),
    "angle_scan_bwd": (0, 1, 2, 3, 4),
    "gated_recurrence_fwd": (1,),
    "gated_recurrence_bwd": (0, 1),
}
"""Per op, for each output, the index of the argument whose shape, dtype and device it has; except the
states of ``gated_recurrence_fwd``, (B, T, H) with B and T of ``pre`` (argument 0) and H, dtype and device of
``h0`` (argument 1): see :func:`output_like`."""

OP_NAMES: tuple[str, ...] = tuple(sorted(OUTPUT_LIKE))
"""Every op of the ``mingru`` namespace (``torch.ops.mingru.<name>``)."""
FORWARD_OPS: tuple[str, ...] = tuple(name for name in OP_NAMES if name.endswith("_fwd"))
"""The ops with a registered autograd formula (their backward is the matching ``_bwd`` op)."""
BACKWARD_OPS: tuple[str, ...] = tuple(name for name in OP_NAMES if name.endswith("_bwd"))


OutputSpec = tuple[tuple[int, ...], torch.dtype, torch.device]


def output_like(op_name: str, args: tuple[Any, ...]) -> list[OutputSpec]:
    """(shape, dtype, device) of each output of ``op_name`` called on ``args`` (:data:`OUTPUT_LIKE`)."""
    outs = []
    for source in OUTPUT_LIKE[op_name]:
        like = args[source]
        shape = tuple(like.shape)
        if op_name == "gated_recurrence_fwd":
            shape = (*args[0].shape[:2], like.shape[-1])
        outs.append((shape, like.dtype, like.device))
    return outs


class _Maker:
    """Random CPU tensors in one dtype, drawn in float64 from one seeded generator (moved to the device
    at the end, strides kept)."""

    def __init__(self, dtype: torch.dtype, seed: int) -> None:
        self.dtype = dtype
        self.generator = torch.Generator().manual_seed(seed)

    def randn(self, *shape: int, scale: float = 1.0) -> Tensor:
        x = torch.randn(shape, generator=self.generator, dtype=torch.float64) * scale
        return x.to(self.dtype)

    def rand(self, *shape: int, low: float = 0.0, high: float = 1.0) -> Tensor:
        x = low + (high - low) * torch.rand(shape, generator=self.generator, dtype=torch.float64)
        return x.to(self.dtype)

    def strided(self, *shape: int) -> Tensor:
        """A non-contiguous (B, T, ...) tensor: a transposed copy with T and the last dim swapped."""
        swapped = (*shape[:1], shape[-1], *shape[2:-1], shape[1])
        return self.randn(*swapped).transpose(1, -1)


def _placed(args: tuple[Any, ...], device: torch.device, differentiable: int) -> tuple[Any, ...]:
    """``args`` moved to ``device`` (strides kept); the floating tensors among the first ``differentiable``
    arguments become leaves that require grad."""

    def place(i: int, arg: Any) -> Any:
        if not isinstance(arg, Tensor):
            return arg
        moved = arg.to(device)
        return moved.requires_grad_(i < differentiable and moved.is_floating_point())

    return tuple(place(i, arg) for i, arg in enumerate(args))


# -- k = 1 linear ---------------------------------------------------------------------------------------

_BTD = ((2, 5, 3), (1, 1, 1), (3, 17, 4))  # odd sizes, T = 1, a length past one tile of small sizes


def _linear(m: _Maker, op: str) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for i, (b, t, d) in enumerate(_BTD):
        make = m.strided if i == 2 else m.randn
        a, x = make(b, t, d), make(b, t, d)
        if op == "linear_scan_fwd":
            out.append((a, x))
        elif op == "linear_scan_bwd":
            out.append((a, m.randn(b, t, d), m.randn(b, t, d), make(b, t, d), m.randn(b, t, d)))
        elif op == "linear_recurrence_fwd":
            out.append((a, x, m.randn(b, d)))
        else:
            out.append((a, m.randn(b, d), m.randn(b, t, d), make(b, t, d)))
    return out


# -- log space ------------------------------------------------------------------------------------------


def _log(m: _Maker, op: str) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for i, (b, t, d) in enumerate(_BTD):
        log_coeffs = -F.softplus(m.strided(b, t, d) if i == 2 else m.randn(b, t, d))
        if op.startswith("parallel_scan_log"):
            log_values = m.randn(b, t + 1, d)
            if i == 0:  # h_0 = 0 and one b_t = 0: -inf inputs must give no NaN
                log_values[:, 0] = float("-inf")
                log_values[0, 2, 0] = float("-inf")
            if op == "parallel_scan_log_fwd":
                out.append((log_coeffs, log_values))
            else:
                out.append((log_coeffs, log_values, m.rand(b, t, d, low=0.1, high=2.0), m.randn(b, t, d)))
        else:
            log_b = m.randn(b, t, d)
            if i == 0:
                log_b[0, 1] = float("-inf")
            h0 = m.randn(b, d)  # any sign: the negative part decays linearly
            if op == "log_recurrence_fwd":
                out.append((log_coeffs, log_b, h0))
            else:
                out.append((log_coeffs, log_b, h0, m.randn(b, t, d), m.randn(b, t, d)))
    return out


# -- matrix affine and diagonal -------------------------------------------------------------------------

_AFFINE = ((2, 5, 2, 3, 2), (1, 1, 1, 1, 1), (2, 9, 1, 5, 3))  # (B, T, n, k, v): non-powers of two, k = 1
_DIAG = ((2, 5, 2, 3, 2), (1, 1, 1, 1, 1), (2, 9, 3, 4, 5))


def _affine(m: _Maker, op: str) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for i, (b, t, n, k, v) in enumerate(_AFFINE):
        A = m.randn(b, t, n, k, k, scale=1.0 / k)
        if i == 2:
            A = A.transpose(-1, -2)  # non-contiguous
        Bm = m.randn(b, t, n, k, v)
        if op == "affine_scan_fwd":
            out.append((A, Bm))
        elif op == "affine_scan_bwd":
            out.append((A, m.randn(b, t, n, k, k), m.randn(b, t, n, k, v), m.randn(b, t, n, k, k), Bm))
        elif op == "affine_recurrence_fwd":
            out.append((A, Bm, m.randn(b, n, k, v)))
        else:
            out.append((A, m.randn(b, n, k, v), m.randn(b, t, n, k, v), Bm))
    if op == "affine_scan_bwd":  # a grad that autograd leaves out arrives as None
        b, t, n, k, v = _AFFINE[0]
        A = m.randn(b, t, n, k, k, scale=1.0 / k)
        out.append((A, m.randn(b, t, n, k, k), m.randn(b, t, n, k, v), None, m.randn(b, t, n, k, v)))
    return out


def _diag(m: _Maker, op: str) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for i, (b, t, n, k, v) in enumerate(_DIAG):
        a = m.rand(b, t, n, k, low=-1.0, high=1.0)
        if i == 2:
            a = m.randn(b, k, n, t).permute(0, 3, 2, 1)  # non-contiguous
        Bm = m.randn(b, t, n, k, v)
        if op == "diag_scan_fwd":
            out.append((a, Bm))
        elif op == "diag_scan_bwd":
            out.append((a, m.randn(b, t, n, k), m.randn(b, t, n, k, v), m.randn(b, t, n, k), Bm))
        elif op == "diag_recurrence_fwd":
            out.append((a, Bm, m.randn(b, n, k, v)))
        else:
            out.append((a, m.randn(b, n, k, v), m.randn(b, t, n, k, v), Bm))
    return out


# -- angle ----------------------------------------------------------------------------------------------

# (B, T, n, k, R, reflect, layout index dtype, has_scale, has_decay)
_ANGLE = (
    (2, 5, 2, 4, 2, True, torch.int64, 1, 1),
    (1, 1, 1, 2, 1, False, torch.int32, 0, 0),
    (2, 7, 3, 6, 3, True, torch.int32, 1, 0),  # k not a power of two, odd R
    (1, 3, 1, 4, 0, False, torch.int64, 0, 1),  # no rotation layer
)


def _angle(m: _Maker, op: str) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for b, t, n, k, layers, reflect, index_dtype, has_scale, has_decay in _ANGLE:
        theta = m.randn(b, t, n, layers, k // 2)
        scale = torch.tanh(m.randn(b, t, n))
        gamma = m.rand(b, t, n, low=0.5, high=1.0)
        x = m.randn(b, t, n, k)
        h0 = m.randn(b, n, k)
        perm, sgn, p2p = default_angle_layout(k, layers, reflect=reflect)
        layout = (perm.to(index_dtype), sgn.to(m.dtype), p2p.to(index_dtype))
        if op == "angle_scan_fwd":
            out.append((theta, scale, gamma, x, h0, *layout, has_scale, has_decay))
        else:
            states, grad = m.randn(b, t, n, k), m.randn(b, t, n, k)
            out.append((theta, scale, gamma, x, h0, states, grad, *layout, has_scale, has_decay))
    return out


# -- MinGRU / MinLSTM, gates fused ---------------------------------------------------------------------

_GATED = ((2, 5, 3, 0), (1, 1, 1, 1), (2, 9, 4, 2), (3, 6, 5, 3), (2, 7, 2, 4))  # (B, T, H, kind): every kind


def _gated(m: _Maker, op: str) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    state = torch.promote_types(m.dtype, torch.float32)
    for i, (b, t, h, kind) in enumerate(_GATED):
        g = 3 if kind >= 3 else 2
        pre = m.strided(b, t, g * h) if i == 2 else m.randn(b, t, g * h, scale=2.0)
        h0 = m.randn(b, h).to(state)
        if op == "gated_recurrence_fwd":
            out.append((pre, h0, kind))
        else:
            out.append((pre, h0, m.randn(b, t, h).to(state), m.randn(b, t, h).to(state), kind))
    return out


_FAMILIES: dict[str, Callable[[_Maker, str], list[tuple[Any, ...]]]] = {
    "linear": _linear,
    "parallel_scan_log": _log,
    "log": _log,
    "affine": _affine,
    "diag": _diag,
    "angle": _angle,
    "gated": _gated,
}


def sample_inputs(
    op_name: str, device: torch.device | str, dtype: torch.dtype = torch.float32, *, seed: int = 0
) -> list[Sample]:
    """Sample calls ``(args, kwargs)`` of ``torch.ops.mingru.<op_name>`` on ``device`` in ``dtype``.

    Shapes are small (a few hundred elements at most). Forward ops get inputs that require grad (the floating
    ones; not the angle layout); backward ops get plain tensors. The same ``seed`` gives the same values. The
    values are drawn on the CPU and moved to ``device`` (strides kept), so ``"meta"`` works too; for fake
    tensors of a device whose runtime is absent, draw on ``"cpu"`` and make fake copies.

    Raises:
        ValueError: ``op_name`` is not one of :data:`OP_NAMES`, or ``dtype`` is not a floating dtype.
    """
    if op_name not in OUTPUT_LIKE:
        raise ValueError(f"unknown mingru op {op_name!r}; the ops are {', '.join(OP_NAMES)}")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating dtype, got {dtype}")
    family = next(prefix for prefix in _FAMILIES if op_name.startswith(prefix + "_"))
    calls = _FAMILIES[family](_Maker(dtype, seed), op_name)
    # The differentiable inputs of a forward op: all its tensors but the angle layout (perm, sgn, p2p).
    differentiable = (5 if family == "angle" else 3) if op_name in FORWARD_OPS else 0
    target = torch.device(device)
    return [(_placed(args, target, differentiable), {}) for args in calls]
