"""Small inputs for every dispatched scan and every layer, shared by the compile and fake-tensor tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.nn import functional as F

from mingru import min_gru
from mingru.layers import MinGRU, MinGRUAngle, MinGRUDiag, MinGRULM, MinGRUMatrix, MinLSTM
from mingru.scans.angle import default_angle_layout

B, T, D = 2, 5, 3  # an odd length exercises the unaligned tail of the doubling scan
N, K, V = 2, 3, 2  # heads, state size, value columns
ANGLE_K, ANGLE_R = 4, 2
DIM = 8


@dataclass(frozen=True)
class ScanCase:
    """One scan call: ``fn(*make_args(dtype, generator), **kwargs)``; ``make_args`` marks what needs grad."""

    name: str
    fn: Callable[..., Any]
    make_args: Callable[[torch.dtype, torch.Generator], tuple[Any, ...]]
    kwargs: dict[str, Any] = field(default_factory=dict)

    def args(self, dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[Any, ...]:
        return self.make_args(dtype, torch.Generator().manual_seed(seed))


def _randn(generator: torch.Generator, dtype: torch.dtype, *shape: int) -> Tensor:
    return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)


def _leaf(x: Tensor) -> Tensor:
    return x.detach().requires_grad_(True)


def _log_args(dtype: torch.dtype, g: torch.Generator, *, zero_h0: bool) -> tuple[Tensor, Tensor]:
    log_coeffs = -F.softplus(_randn(g, dtype, B, T, D))
    log_values = _randn(g, dtype, B, T + 1, D)
    if zero_h0:
        log_values[:, 0] = float("-inf")
        log_values[:, 2, 0] = float("-inf")
    return _leaf(log_coeffs), _leaf(log_values)


def _log_recurrence_args(dtype: torch.dtype, g: torch.Generator, *, with_h0: bool) -> tuple[Any, ...]:
    log_coeffs = -F.softplus(_randn(g, dtype, B, T, D))
    log_b = _randn(g, dtype, B, T, D)
    h0 = _leaf(_randn(g, dtype, B, D)) if with_h0 else None  # signed: the negative part is carried linearly
    return _leaf(log_coeffs), _leaf(log_b), h0


def _linear(dtype: torch.dtype, g: torch.Generator, *, with_h0: bool = False) -> tuple[Tensor, ...]:
    a, b = _leaf(_randn(g, dtype, B, T, D)), _leaf(_randn(g, dtype, B, T, D))
    return (a, b, _leaf(_randn(g, dtype, B, D))) if with_h0 else (a, b)


def _affine(dtype: torch.dtype, g: torch.Generator, *, with_h0: bool = False) -> tuple[Tensor, ...]:
    A, Bm = _leaf(_randn(g, dtype, B, T, N, K, K) / K), _leaf(_randn(g, dtype, B, T, N, K, V))
    return (A, Bm, _leaf(_randn(g, dtype, B, N, K, V))) if with_h0 else (A, Bm)


def _diag(dtype: torch.dtype, g: torch.Generator, *, with_h0: bool = False) -> tuple[Tensor, ...]:
    a, Bm = _leaf(_randn(g, dtype, B, T, N, K)), _leaf(_randn(g, dtype, B, T, N, K, V))
    return (a, Bm, _leaf(_randn(g, dtype, B, N, K, V))) if with_h0 else (a, Bm)


def _angle(dtype: torch.dtype, g: torch.Generator) -> tuple[Tensor, ...]:
    theta = _randn(g, dtype, B, T, N, ANGLE_R, ANGLE_K // 2)
    scale = torch.tanh(_randn(g, dtype, B, T, N))
    gamma = torch.sigmoid(_randn(g, dtype, B, T, N))
    b = _randn(g, dtype, B, T, N, ANGLE_K)
    h0 = _randn(g, dtype, B, N, ANGLE_K)
    perm, sgn, p2p = default_angle_layout(ANGLE_K, ANGLE_R, reflect=True)
    return (*map(_leaf, (theta, scale, gamma, b, h0)), perm, sgn, p2p)


SCAN_CASES = [
    ScanCase("parallel_scan_log", min_gru.parallel_scan_log, partial(_log_args, zero_h0=False)),
    ScanCase("parallel_scan_log-neginf", min_gru.parallel_scan_log, partial(_log_args, zero_h0=True)),
    ScanCase("linear_scan", min_gru.linear_scan, _linear),
    ScanCase("affine_scan", min_gru.affine_scan, _affine),
    ScanCase("diag_scan", min_gru.diag_scan, _diag),
    ScanCase("angle_scan", min_gru.angle_scan, _angle, {"has_scale": True, "has_decay": True}),
    ScanCase("angle_scan-plain", min_gru.angle_scan, _angle, {"has_scale": False, "has_decay": False}),
    ScanCase("angle_scan-scale", min_gru.angle_scan, _angle, {"has_scale": True, "has_decay": False}),
    ScanCase("log_recurrence", min_gru.log_recurrence, partial(_log_recurrence_args, with_h0=True)),
    ScanCase("log_recurrence-zeros", min_gru.log_recurrence, partial(_log_recurrence_args, with_h0=False)),
    ScanCase("linear_recurrence", min_gru.linear_recurrence, partial(_linear, with_h0=True)),
    ScanCase("affine_recurrence", min_gru.affine_recurrence, partial(_affine, with_h0=True)),
    ScanCase("diag_recurrence", min_gru.diag_recurrence, partial(_diag, with_h0=True)),
]

LAYER_FACTORIES: dict[str, Callable[[], torch.nn.Module]] = {
    "MinGRU-log": lambda: MinGRU(DIM),
    "MinGRU-linear": lambda: MinGRU(DIM, mode="linear"),
    "MinGRU-linear-negative": lambda: MinGRU(DIM, mode="linear", negative_gates=True),
    "MinLSTM-log": lambda: MinLSTM(DIM),
    "MinLSTM-linear": lambda: MinLSTM(DIM, mode="linear"),
    "MinGRUMatrix": lambda: MinGRUMatrix(DIM, heads=2, head_dim=3),
    "MinGRUDiag": lambda: MinGRUDiag(DIM, heads=2, head_dim=3, value_dim=2),
    "MinGRUAngle": lambda: MinGRUAngle(DIM, heads=2, head_dim=4, rotation_layers=2),
    "MinGRUAngle-reflect-plain": lambda: MinGRUAngle(
        DIM, heads=2, head_dim=4, rotation_layers=3, use_scale=False, use_decay=False, reflect=True
    ),
}


def scan_params() -> list[Any]:
    return [pytest.param(case, id=case.name) for case in SCAN_CASES]


def layer_params() -> list[Any]:
    return [pytest.param(name, id=name) for name in LAYER_FACTORIES]


def make_layer(name: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return LAYER_FACTORIES[name]()


def layer_state(layer: torch.nn.Module, seed: int = 1) -> Tensor:
    """A random float32 initial state ``(B, *state_shape)`` that requires grad."""
    shape = (B, *layer.state_shape)  # type: ignore[attr-defined]
    return _leaf(torch.randn(shape, generator=torch.Generator().manual_seed(seed)))


def layer_input(dtype: torch.dtype = torch.float32, seed: int = 2, length: int = T) -> Tensor:
    return _leaf(_randn(torch.Generator().manual_seed(seed), dtype, B, length, DIM))


def make_lm(layer: str = "mingru") -> MinGRULM:
    torch.manual_seed(0)
    return MinGRULM(11, DIM, depth=2, layer=layer)
