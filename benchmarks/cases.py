"""The registry of benchmark cases: op or layer, shape, dtypes, modes, and the implementations of each.

Every case builds *canonical* inputs (mingru's layout, e.g. a, b, h0 for the k = 1 recurrence). An
implementation turns them into its own native inputs with ``prepare`` (a transpose, a log: not timed, but
differentiable, so the correctness check compares gradients with respect to the canonical inputs) and maps its
outputs back with ``restore`` (only for the check). ``bytes_fwd`` / ``bytes_bwd`` are the least bytes the op
must move (the floor: forward reads a, b and writes h; backward reads dh, a, h and writes da, db).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import peers
import torch
from torch import Tensor
from torch.nn import functional as F

import mingru
from mingru.layers._common import log_gates
from mingru.min_gru import _compose_linear, _compose_log
from mingru.scans import (
    affine_scan_ref,
    angle_scan_ref,
    default_angle_layout,
    diag_scan_ref,
    linear_scan_ref,
    parallel_scan_log_ref,
)
from mingru.scans.angle import angle_transition_ref

Inputs = tuple[Any, ...]
Shape = tuple[int, ...]
MODES = ("fwd", "bwd", "fwdbwd")


def _ops() -> Any:
    return mingru.triton_scans


def _layers_path(op: str) -> Callable[..., Any]:
    """What the layers run for recurrence ``op``: ``RECURRENCE_IMPLS[op]`` (eagerly, the op's bodies in a
    ``torch.autograd.Function``, without the ``torch.library`` dispatch)."""
    return lambda *x: _ops().RECURRENCE_IMPLS[op](*x)


def _same(*x: Any) -> Inputs:
    return x


def _tuple(out: Any) -> tuple[Tensor, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


@dataclasses.dataclass(frozen=True)
class Impl:
    """One implementation of a case. ``fn`` takes the native inputs (``prepare(*canonical)``) and returns the
    tensors to time and differentiate; ``restore(outputs)`` maps them to the canonical outputs for the check.
    ``grad`` are the native input indices differentiated (None: the case's); ``no_grad`` canonical indices
    the implementation does not differentiate; ``zero_state`` a canonical index (the initial state) the
    implementation does not take, set to zeros for its check. ``layer`` builds a module for layer cases
    (``fn(module, x)``); ``skip(shape)`` returns why a shape does not apply."""

    name: str
    fn: Callable[..., Any]
    prepare: Callable[..., Inputs] = _same
    restore: Callable[[Any], tuple[Tensor, ...]] = _tuple
    grad: tuple[int, ...] | None = None
    no_grad: tuple[int, ...] = ()
    zero_state: int | None = None
    package: str | None = None
    ours: bool = False
    compiled: bool = False
    slow: bool = False
    gpu_only: bool = False
    modes: tuple[str, ...] = MODES
    dtypes: tuple[torch.dtype, ...] | None = None
    layer: Callable[[int], torch.nn.Module] | None = None
    skip: Callable[[Shape], str | None] | None = None
    full_lifts_skip: bool = True  # --full ignores skip (a time limit, not an envelope)
    note: str = ""


@dataclasses.dataclass(frozen=True)
class Case:
    """A case: ``make(shape, dtype, device)`` canonical inputs; ``reference`` the exact scan (run in float64);
    ``grad`` the canonical inputs differentiated; ``small`` the check shape, ``tiny`` the CPU smoke shape;
    ``stress`` builds inputs with gates near 1 for an extra (reported, not gating) check of every impl."""

    group: str
    op: str
    shape: Shape
    make: Callable[[Shape, torch.dtype, torch.device], Inputs]
    reference: Callable[..., Any] | None
    impls: tuple[Impl, ...]
    grad: tuple[int, ...]
    bytes_fwd: Callable[[Shape, int], int] | None
    bytes_bwd: Callable[[Shape, int], int] | None
    small: Shape
    tiny: Shape
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)
    modes: tuple[str, ...] = ("fwd", "fwdbwd")
    stress: Callable[[Shape, torch.dtype, torch.device], Inputs] | None = None
    stress_shape: Shape | None = None
    positive: bool = False  # outputs are positive: report element-wise relative error in accuracy runs
    quick: bool = True  # part of --quick

    @property
    def label(self) -> str:
        return f"{self.op} {'x'.join(map(str, self.shape))}"


# ------------------------------------------------------------------------------------------------ inputs


def _gates(shape: Sequence[int], device: torch.device, low: float = 0.5) -> Tensor:
    return torch.rand(shape, device=device) * (1 - low) + low


def make_k1(shape: Shape, dtype: torch.dtype, device: torch.device) -> Inputs:
    a = _gates(shape, device).to(dtype)
    return (
        a,
        torch.randn(shape, device=device, dtype=dtype),
        torch.randn(shape[0], shape[2], device=device).to(dtype),
    )


def make_k1_near_one(shape: Shape, dtype: torch.dtype, device: torch.device) -> Inputs:
    a = _gates(shape, device, low=0.999).clamp(max=1 - 2**-20).to(dtype)
    return (
        a,
        torch.randn(shape, device=device, dtype=dtype),
        torch.randn(shape[0], shape[2], device=device).to(dtype),
    )


def make_k1_seed(shape: Shape, dtype: torch.dtype, device: torch.device) -> Inputs:
    return make_k1(shape, dtype, device)[:2]


def make_log(shape: Shape, dtype: torch.dtype, device: torch.device) -> Inputs:
    batch, _, width = shape
    log_coeffs = -F.softplus(torch.randn(shape, device=device))
    log_b = torch.randn(shape, device=device) - 1.0
    h0 = torch.rand(batch, width, device=device) + 0.1
    return log_coeffs.to(dtype), log_b.to(dtype), h0.to(dtype)


def make_log_seed(shape: Shape, dtype: torch.dtype, device: torch.device) -> Inputs:
    batch, length, width = shape
    log_coeffs = -F.softplus(torch.randn(shape, device=device))
    log_values = torch.randn(batch, length + 1, width, device=device) - 1.0
    return log_coeffs.to(dtype), log_values.to(dtype)


def make_affine(shape: Shape, dtype: torch.dtype, device: torch.device) -> Inputs:
    batch, length, heads, k, v = shape
    # spectral norm about 0.9: the products stay finite over long sequences
    A = torch.randn(batch, length, heads, k, k, device=device) * (0.45 / math.sqrt(k))
    Bm = torch.randn(batch, length, heads, k, v, device=device)
    return A.to(dtype), Bm.to(dtype)


def make_affine_state(shape: Shape, dtype: torch.dtype, device: torch.device) -> Inputs:
    batch, _, heads, k, v = shape
    return (*make_affine(shape, dtype, device), torch.randn(batch, heads, k, v, device=device).to(dtype))


def make_diag(shape: Shape, dtype: torch.dtype, device: torch.device) -> Inputs:
    return _gates(shape[:4], device).to(dtype), torch.randn(shape, device=device).to(dtype)


def make_angle(shape: Shape, dtype: torch.dtype, device: torch.device) -> Inputs:
    batch, length, heads, k, rotations = shape
    perm, sgn, p2p = (t.to(device) for t in default_angle_layout(k, rotations))
    theta = torch.randn(batch, length, heads, rotations, k // 2, device=device).to(dtype)
    scale = _gates((batch, length, heads), device).to(dtype)
    gamma = _gates((batch, length, heads), device).to(dtype)
    b = torch.randn(batch, length, heads, k, device=device).to(dtype)
    h0 = torch.randn(batch, heads, k, device=device).to(dtype)
    return theta, scale, gamma, b, h0, perm, sgn.to(dtype), p2p


def make_gated(shape: Shape, dtype: torch.dtype, device: torch.device) -> Inputs:
    """MinGRU's pre-activations (B, T, 2 H) in ``dtype`` (gate logits, candidates), h0 (B, H) in float32."""
    batch, steps, hidden = shape
    pre = torch.randn(batch, steps, 2 * hidden, device=device) * 2.0
    return pre.to(dtype), torch.randn(batch, hidden, device=device)


def make_layer(shape: Shape, dtype: torch.dtype, device: torch.device) -> Inputs:
    return (torch.randn(shape, device=device).to(dtype),)


# ------------------------------------------------------------------------------------------------ references


def linear_recurrence_ref(a: Tensor, b: Tensor, h0: Tensor) -> Tensor:
    return _compose_linear(linear_scan_ref, a, b, h0)


def log_recurrence_ref(log_coeffs: Tensor, log_b: Tensor, h0: Tensor) -> Tensor:
    return _compose_log(parallel_scan_log_ref, log_coeffs, log_b, h0)


def gated_log_ref(pre: Tensor, h0: Tensor) -> Tensor:
    """MinGRU's log-mode states from its pre-activations: the layer's gates, then the log recurrence."""
    return log_recurrence_ref(*log_gates(*pre.to(h0.dtype).chunk(2, dim=-1)), h0)


def affine_recurrence_ref(A: Tensor, Bm: Tensor, H0: Tensor) -> Tensor:
    Abar, Bbar = affine_scan_ref(A, Bm)
    return Bbar + Abar @ H0.unsqueeze(1)


def angle_ref(*args: Any) -> Tensor:
    return angle_scan_ref(*args, has_scale=True, has_decay=True)


def angle_by_matrices(
    theta: Tensor, scale: Tensor, gamma: Tensor, b: Tensor, h0: Tensor, perm: Tensor, sgn: Tensor, p2p: Tensor
) -> Tensor:
    """The angle recurrence the long way: build c_t L_t as dense k x k matrices, run the matrix kernel."""
    transition = angle_transition_ref(theta, perm, sgn, p2p) * (scale * gamma)[..., None, None]
    return _ops().affine_recurrence_fwd(transition, b.unsqueeze(-1), h0.unsqueeze(-1)).squeeze(-1)


# ------------------------------------------------------------------------------------------------ bytes


def _n(shape: Sequence[int]) -> int:
    return math.prod(shape)


def k1_fwd(s: Shape, i: int) -> int:  # read a, b; write h
    return 3 * _n(s) * i


def k1_bwd(s: Shape, i: int) -> int:  # read dh, a, h; write da, db
    return 5 * _n(s) * i


def gated_fwd(s: Shape, i: int) -> int:  # read pre (gate, candidate); write h (float32)
    return _n(s) * (2 * i + 4)


def gated_bwd(s: Shape, i: int) -> int:  # read pre, h, dh (float32); write d pre
    return _n(s) * (4 * i + 8)


def seed_fwd(s: Shape, i: int) -> int:  # read a, b; write A, Bc
    return 4 * _n(s) * i


def seed_bwd(s: Shape, i: int) -> int:  # read gA, gBc, a, A, Bc; write ga, gb
    return 7 * _n(s) * i


def affine_fwd(s: Shape, i: int) -> int:  # read A, B; write Abar, Bbar
    k, v = s[3], s[4]
    return _n(s[:3]) * (2 * k * k + 2 * k * v) * i


def affine_bwd(s: Shape, i: int) -> int:  # read gAbar, gBbar, A, Abar, Bbar; write gA, gB
    k, v = s[3], s[4]
    return _n(s[:3]) * (4 * k * k + 3 * k * v) * i


def affine_rec_fwd(s: Shape, i: int) -> int:  # read A, B; write H
    k, v = s[3], s[4]
    return _n(s[:3]) * (k * k + 2 * k * v) * i


def affine_rec_bwd(s: Shape, i: int) -> int:  # read dH, A, H; write dA, dB
    k, v = s[3], s[4]
    return _n(s[:3]) * (2 * k * k + 3 * k * v) * i


def diag_fwd(s: Shape, i: int) -> int:  # read a, B; write abar, Bbar
    return _n(s[:4]) * (2 + 2 * s[4]) * i


def diag_bwd(s: Shape, i: int) -> int:
    return _n(s[:4]) * (4 + 3 * s[4]) * i


def angle_fwd(s: Shape, i: int) -> int:  # read theta, b, scale, gamma; write h
    k, rotations = s[3], s[4]
    return _n(s[:3]) * (rotations * k // 2 + 2 * k + 2) * i


def angle_bwd(s: Shape, i: int) -> int:  # read dh, theta, scale, gamma, h; write dtheta, db, dscale, dgamma
    k, rotations = s[3], s[4]
    return _n(s[:3]) * (rotations * k + 3 * k + 4) * i


# ------------------------------------------------------------------------------------------------ impls


def _to_bdt(*x: Tensor) -> Inputs:
    return tuple(t.transpose(1, 2).contiguous() for t in x)


def _from_bdt(out: Tensor) -> tuple[Tensor, ...]:
    return (out.transpose(1, 2),)


def _angle_layers_path(*x: Tensor) -> Tensor:
    """What the angle layers run: ``angle_scan_impl`` (checks, then the op's bodies eagerly in a
    ``torch.autograd.Function``, without the ``torch.library`` dispatch), scale and decay on."""
    return _ops().angle_scan_impl(*x, has_scale=1, has_decay=1)


def _mingru_k1() -> Impl:
    return Impl("mingru", _layers_path("linear"), ours=True, gpu_only=False)


K1_PEERS = (
    Impl(
        "accelerated-scan",
        peers.accel_scan,
        prepare=lambda a, b, h0: _to_bdt(a, b),
        restore=_from_bdt,
        grad=(0, 1),
        zero_state=2,
        package="accelerated-scan",
        gpu_only=True,
        note="no initial state; (B, D, T) layout",
    ),
    Impl(
        "fla chunk_hgrn",
        peers.fla_chunk,
        prepare=lambda a, b, h0: (b, a.log(), h0),
        grad=(0, 1),
        no_grad=(2,),
        package="fla-core",
        gpu_only=True,
        skip=lambda s: None if s[2] == 1024 else "D != 1024: fla autotunes per D (--full)",
        note="g = log a; no grad for h0",
    ),
    Impl(
        "fla fused_recurrent_hgrn",
        peers.fla_fused,
        prepare=lambda a, b, h0: (b, a.log(), h0),
        package="fla-core",
        gpu_only=True,
        dtypes=(torch.float32,),
        skip=lambda s: None if s == (8, 4096, 1024) else "one shape only: autotune time (--full)",
        note="g = log a",
    ),
    Impl("torch associative_scan", peers.assoc_k1, compiled=True, slow=True, note="torch.compile, static"),
)

LOG_PEERS = (
    Impl(
        "minGRU-pytorch scan",
        peers.heinsen_with_state,
        package="minGRU-pytorch",
        note="eager; h0 as its layer passes it",
    ),
    Impl(
        "fla chunk_hgrn",
        lambda lc, lb, h0: peers.fla_chunk(lb.exp(), lc, h0),
        no_grad=(2,),
        package="fla-core",
        gpu_only=True,
        skip=lambda s: None if s[2] == 1024 else "D != 1024: fla autotunes per D (--full)",
        note="x = exp(log_b) in the call; no grad for h0",
    ),
    Impl(
        "accelerated-scan",
        lambda lc, lb: peers.accel_scan(lc.exp(), lb.exp()),
        prepare=lambda lc, lb, h0: _to_bdt(lc, lb),
        restore=_from_bdt,
        grad=(0, 1),
        zero_state=2,
        package="accelerated-scan",
        gpu_only=True,
        note="exp of both in the call; no initial state",
    ),
)


def _gated_unfused(pre: Tensor, h0: Tensor) -> Tensor:
    """The layers' path without the fused kernel: the gates in PyTorch (float32), then the log kernel."""
    return _ops().RECURRENCE_IMPLS["log"](*log_gates(*pre.to(h0.dtype).chunk(2, dim=-1)), h0)


GATED_SHAPES = ((8, 4096, 1024), (8, 16384, 1024))
GATED_IMPLS = (
    Impl("mingru", lambda pre, h0: _ops().GATED_IMPLS["gru-log"](pre, h0), ours=True, note="gates fused"),
    Impl("mingru unfused", _gated_unfused, note="gates in PyTorch, then the log kernel"),
)


def _eager(ref: Callable[..., Any]) -> Impl:
    return Impl("eager (mingru.scans)", ref, slow=True, note="mingru's exact eager reference")


def _not_over(k_max: int) -> Callable[[Shape], str | None]:
    return lambda s: None if s[3] <= k_max else f"k={s[3]} > {k_max}: outside the matrix kernel's envelope"


def _layer_fn(module: torch.nn.Module, x: Tensor) -> Tensor:
    out = module(x)
    return out[0] if isinstance(out, tuple) else out


LAYER_IMPLS = (
    Impl(
        "mingru MinGRU(log)",
        _layer_fn,
        ours=True,
        layer=lambda dim: mingru.MinGRU(dim, bias=False),
        note="mode='log', no biases",
    ),
    Impl(
        "mingru MinGRU(linear)",
        _layer_fn,
        ours=True,
        layer=lambda dim: mingru.MinGRU(dim, mode="linear", bias=False),
        note="mode='linear', no biases",
    ),
    Impl(
        "mingru MinGRU(log, recompute)",
        _layer_fn,
        ours=True,
        layer=lambda dim: mingru.MinGRU(dim, bias=False, recompute=True),
        note="mode='log', no biases, recompute=True (default chunk length)",
    ),
    Impl(
        "mingru MinGRU(linear, recompute)",
        _layer_fn,
        ours=True,
        layer=lambda dim: mingru.MinGRU(dim, mode="linear", bias=False, recompute=True),
        note="mode='linear', no biases, recompute=True (default chunk length)",
    ),
    Impl(
        "minGRU-pytorch minGRU",
        _layer_fn,
        package="minGRU-pytorch",
        layer=peers.mingru_pytorch_layer,
        note="log-space, eager scan, no biases",
    ),
    Impl("nn.GRU (cuDNN)", _layer_fn, layer=peers.gru_layer, note="hidden = dim, 1 layer, biases"),
)

# ------------------------------------------------------------------------------------------------ registry

K1_SHAPES = (
    (8, 1024, 1024),
    (8, 4096, 1024),
    (8, 16384, 1024),
    (8, 65536, 1024),
    (1, 65536, 256),
    (1, 8192, 2048),
)
QUICK_K1 = {(8, 4096, 1024), (8, 65536, 1024), (1, 65536, 256)}
MATRIX_K = (2, 4, 8, 16, 32)
ANGLE = tuple((k, r) for k in (8, 16, 32, 64) for r in (1, 2, 4))
K1_SMALL, K1_TINY = (2, 300, 256), (2, 40, 8)
F32 = (torch.float32,)


def build(eager: bool = False, full: bool = False) -> list[Case]:
    """Every case, in run order (the headline cases first). eager adds mingru's eager references;
    full lifts the limits on slow-to-prepare peers (the compiled matrix associative_scan only at k = 16, fp32,
    forward: 15-36 s of compile per shape; fla only at D = 1024, its autotuning is per D and dtype)."""
    cases: list[Case] = []

    def extra(ref: Callable[..., Any]) -> tuple[Impl, ...]:
        return (_eager(ref),) if eager else ()

    for shape in K1_SHAPES:
        cases.append(
            Case(
                "k1",
                "linear_recurrence_fwd",
                shape,
                make_k1,
                linear_recurrence_ref,
                (_mingru_k1(), *K1_PEERS, *extra(linear_recurrence_ref)),
                (0, 1, 2),
                k1_fwd,
                k1_bwd,
                (2, 300, shape[2]),
                K1_TINY,
                stress=make_k1_near_one,
                stress_shape=(2, 4096, 1024),
                quick=shape in QUICK_K1,
            )
        )
    for shape in K1_SHAPES:
        cases.append(
            Case(
                "log",
                "log_recurrence_fwd",
                shape,
                make_log,
                log_recurrence_ref,
                (
                    Impl("mingru", _layers_path("log"), ours=True),
                    *LOG_PEERS,
                    *extra(log_recurrence_ref),
                ),
                (0, 1, 2),
                k1_fwd,
                k1_bwd,
                (2, 300, shape[2]),
                K1_TINY,
                positive=True,
                quick=shape in QUICK_K1,
            )
        )
    for shape in GATED_SHAPES:
        cases.append(
            Case(
                "gated",
                "MinGRU log gates + scan",
                shape,
                make_gated,
                gated_log_ref,
                (*GATED_IMPLS, *extra(gated_log_ref)),
                (0, 1),
                gated_fwd,
                gated_bwd,
                (2, 300, 256),
                K1_TINY,
                positive=True,
                quick=shape == GATED_SHAPES[0],
            )
        )
    # accuracy of the log scan at T = 65536 (no timing): fp32 relative error, bf16 against rounding
    for op, make, ref, impls in (
        (
            "log_recurrence_fwd",
            make_log,
            log_recurrence_ref,
            (Impl("mingru", _layers_path("log"), ours=True), *LOG_PEERS),
        ),
        (
            "parallel_scan_log_fwd",
            make_log_seed,
            parallel_scan_log_ref,
            (
                Impl("mingru", lambda lc, lv: _ops().parallel_scan_log_fwd(lc, lv), ours=True),
                Impl("minGRU-pytorch scan", peers.heinsen_seed, package="minGRU-pytorch"),
            ),
        ),
    ):
        cases.append(
            Case(
                "accuracy",
                op,
                (1, 65536, 256),
                make,
                ref,
                impls,
                (),
                None,
                None,
                K1_SMALL,
                K1_TINY,
                modes=("acc",),
                positive=True,
            )
        )
    cases.append(
        Case(
            "layer",
            "training step dim=1024",
            (8, 4096, 1024),
            make_layer,
            None,
            LAYER_IMPLS,
            (0,),
            None,
            None,
            (2, 50, 64),
            (2, 12, 16),
            modes=("fwd", "fwdbwd"),
        )
    )
    for k in MATRIX_K:
        shape = (4, 4096, 16, k, k)
        assoc_dtypes = None if full else F32
        assoc_modes = MODES if full else ("fwd",)
        assoc_skip = None if full or k == 16 else (lambda s: "compile time: only k = 16 (--full)")
        assoc = dict(compiled=True, slow=True, dtypes=assoc_dtypes, modes=assoc_modes, skip=assoc_skip)
        cases.append(
            Case(
                "affine",
                "affine_scan_fwd",
                shape,
                make_affine,
                affine_scan_ref,
                (
                    Impl("mingru", lambda A, Bm: _ops().affine_scan_fwd(A, Bm), ours=True),
                    Impl("torch associative_scan", peers.assoc_affine_scan, note="matrix combine", **assoc),
                    *extra(affine_scan_ref),
                ),
                (0, 1),
                affine_fwd,
                affine_bwd,
                (2, 37, 2, k, k),
                (1, 9, 2, min(k, 4), min(k, 4)),
                quick=k in (4, 16, 32),
            )
        )
        cases.append(
            Case(
                "affine",
                "affine_recurrence_fwd",
                shape,
                make_affine_state,
                affine_recurrence_ref,
                (
                    Impl("mingru", _layers_path("affine"), ours=True),
                    Impl(
                        "torch associative_scan",
                        peers.assoc_affine_recurrence,
                        note="then + Abar H0",
                        **assoc,
                    ),
                    *extra(affine_recurrence_ref),
                ),
                (0, 1, 2),
                affine_rec_fwd,
                affine_rec_bwd,
                (2, 37, 2, k, k),
                (1, 9, 2, min(k, 4), min(k, 4)),
                quick=k in (4, 16, 32),
            )
        )
    for k, rotations in ANGLE:
        cases.append(
            Case(
                "angle",
                f"angle_scan_fwd R={rotations}",
                (8, 4096, 16, k, rotations),
                make_angle,
                angle_ref,
                (
                    Impl("mingru", _angle_layers_path, ours=True),
                    Impl(
                        "matrices + affine kernel",
                        angle_by_matrices,
                        skip=_not_over(32),
                        full_lifts_skip=False,
                        note="dense c_t L_t built in eager, then affine_recurrence_fwd",
                    ),
                ),
                (0, 1, 2, 3, 4),
                angle_fwd,
                angle_bwd,
                (2, 37, 2, k, rotations),
                (1, 9, 2, min(k, 8), rotations),
                quick=rotations == 2,
            )
        )
    for shape in K1_SHAPES:
        cases.append(
            Case(
                "seed",
                "linear_scan_fwd",
                shape,
                make_k1_seed,
                linear_scan_ref,
                (
                    Impl("mingru", lambda a, b: _ops().linear_scan_fwd(a, b), ours=True),
                    *extra(linear_scan_ref),
                ),
                (0, 1),
                seed_fwd,
                seed_bwd,
                K1_SMALL,
                K1_TINY,
                quick=shape in QUICK_K1,
            )
        )
    for shape in ((8, 4096, 1024), (8, 65536, 1024), (1, 65536, 256)):
        cases.append(
            Case(
                "seed",
                "parallel_scan_log_fwd",
                shape,
                make_log_seed,
                parallel_scan_log_ref,
                (
                    Impl("mingru", lambda lc, lv: _ops().parallel_scan_log_fwd(lc, lv), ours=True),
                    Impl("minGRU-pytorch scan", peers.heinsen_seed, package="minGRU-pytorch", note="eager"),
                ),
                (0, 1),
                k1_fwd,
                k1_bwd,
                K1_SMALL,
                K1_TINY,
                positive=True,
                quick=shape == (8, 65536, 1024),
            )
        )
    cases.append(
        Case(
            "diag",
            "diag_scan_fwd",
            (4, 4096, 16, 16, 16),
            make_diag,
            diag_scan_ref,
            (Impl("mingru", lambda a, Bm: _ops().diag_scan_fwd(a, Bm), ours=True), *extra(diag_scan_ref)),
            (0, 1),
            diag_fwd,
            diag_bwd,
            (2, 37, 2, 16, 16),
            (1, 9, 2, 4, 4),
            dtypes=F32,
            quick=False,
        )
    )
    return cases
