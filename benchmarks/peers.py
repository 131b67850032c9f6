"""The peers the benchmark compares mingru with, each called the way its own documentation describes.

Optional benchmark dependencies (PyPI; carried to a machine without network as wheels in ``.whl-peers/``):

- accelerated-scan 0.3.1: ``accelerated_scan.scalar.scan(forget, inputs)``, Triton, (B, C, T) contiguous
  layout, no initial state, no final state; gradients for both inputs.
- fla-core 0.6.0: ``fla.ops.hgrn.chunk_hgrn`` / ``fused_recurrent_hgrn(x, g, initial_state)``, (B, T, D)
  layout, ``h_t = exp(g_t) h_{t-1} + x_t`` (g is the log of the gate), compute in float32, returns
  ``(o, final_state)``. ``chunk_hgrn`` returns no gradient for the initial state; ``fused_recurrent_hgrn``
  does.
- minGRU-pytorch (lucidrains): ``minGRU_pytorch.minGRU.heinsen_associative_scan_log(log_coeffs, log_values)``
  (eager cumsum + logcumsumexp, both (B, T, D), zero initial state; its layer pads the coefficients and
  prepends ``log(prev_hidden)`` for an initial state) and the layer ``minGRU_pytorch.minGRU(dim)``.

And two that ship with torch: ``torch._higher_order_ops.associative_scan`` under ``torch.compile`` (static
shapes, ``fullgraph``; compile time is recorded and bounded by the runner), and cuDNN ``nn.GRU``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

# distribution name -> import name
PACKAGES = {
    "accelerated-scan": "accelerated_scan",
    "fla-core": "fla",
    "minGRU-pytorch": "minGRU_pytorch",
}


@functools.cache
def status(dist: str) -> str | None:
    """None when the peer distribution imports here, else why not ('not installed' or the import error)."""
    try:
        importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
    try:
        importlib.import_module(PACKAGES[dist])
    except Exception as exc:
        return f"import failed: {type(exc).__name__}: {exc}"
    return None


def versions() -> dict[str, str]:
    """Installed version of every peer distribution ('-' where absent)."""
    out = {}
    for dist in PACKAGES:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "-"
    return out


# ---------------------------------------------------------------------------------- accelerated-scan


def accel_scan(forget: Tensor, inputs: Tensor) -> Tensor:
    """accelerated-scan: forget, inputs (B, C, T) contiguous -> states (B, C, T); zero initial state."""
    from accelerated_scan.scalar import scan

    return scan(forget, inputs)


# ---------------------------------------------------------------------------------- fla-core (HGRN)


def fla_chunk(x: Tensor, g: Tensor, h0: Tensor | None) -> Tensor:
    """fla chunk_hgrn: x, g = log(gate) (B, T, D), h0 (B, D) -> o (B, T, D)."""
    from fla.ops.hgrn import chunk_hgrn

    return chunk_hgrn(x, g, h0)[0]


def fla_fused(x: Tensor, g: Tensor, h0: Tensor | None) -> Tensor:
    """fla fused_recurrent_hgrn: x, g = log(gate) (B, T, D), h0 (B, D) -> o (B, T, D)."""
    from fla.ops.hgrn import fused_recurrent_hgrn

    return fused_recurrent_hgrn(x, g, h0)[0]


# ---------------------------------------------------------------------------------- minGRU-pytorch


def heinsen(log_coeffs: Tensor, log_values: Tensor) -> Tensor:
    """minGRU-pytorch's log-space scan: both (B, T, D) -> h (B, T, D), h_t = a_t h_{t-1} + v_t, h_0 = 0."""
    from minGRU_pytorch.minGRU import heinsen_associative_scan_log

    return heinsen_associative_scan_log(log_coeffs, log_values)


def heinsen_with_state(log_coeffs: Tensor, log_b: Tensor, h0: Tensor) -> Tensor:
    """The initial state the way minGRU-pytorch's layer passes it: pad the coefficients, prepend log(h0)."""
    log_values = torch.cat((h0.log().unsqueeze(1), log_b), dim=1)
    return heinsen(F.pad(log_coeffs, (0, 0, 1, 0)), log_values)[:, 1:]


def heinsen_seed(log_coeffs: Tensor, log_values: Tensor) -> Tensor:
    """parallel_scan_log's contract (log_values (B, T+1, D), h_0 = exp(log_values_0)) on minGRU-pytorch."""
    return heinsen(F.pad(log_coeffs, (0, 0, 1, 0)), log_values)[:, 1:]


def mingru_pytorch_layer(dim: int) -> torch.nn.Module:
    """minGRU-pytorch's layer (log-space, expansion 1: no output projection, no biases)."""
    from minGRU_pytorch import minGRU

    return minGRU(dim)


# ---------------------------------------------------------------------------------- torch associative_scan

COMPILE = {"enabled": True}
"""Set ``enabled`` False (CPU smoke runs) to call associative_scan eagerly in its generic mode."""


def _k1_combine(x: tuple[Tensor, Tensor], y: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    # x is the earlier element: (a_y a_x, a_y b_x + b_y)
    return y[0] * x[0], y[0] * x[1] + y[1]


def _matrix_combine(x: tuple[Tensor, Tensor], y: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    return y[0] @ x[0], y[0] @ x[1] + y[1]


def _assoc_k1(a: Tensor, b: Tensor, h0: Tensor) -> Tensor:
    from torch._higher_order_ops import associative_scan

    mode = "pointwise" if a.is_cuda else "generic"
    A, Bc = associative_scan(_k1_combine, (a, b), dim=1, combine_mode=mode)
    return Bc + A * h0.unsqueeze(1)


def _assoc_affine(A: Tensor, Bm: Tensor) -> tuple[Tensor, Tensor]:
    from torch._higher_order_ops import associative_scan

    return associative_scan(_matrix_combine, (A, Bm), dim=1, combine_mode="generic")


@functools.cache
def _compiled(name: str) -> Callable[..., Any]:
    fn = {"k1": _assoc_k1, "affine": _assoc_affine}[name]
    if not COMPILE["enabled"]:
        return fn
    import torch._dynamo

    # every (shape, dtype) is its own static graph; the default limit (8) would fall back to eager silently
    for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    return torch.compile(fn, dynamic=False, fullgraph=True)


def assoc_k1(a: Tensor, b: Tensor, h0: Tensor) -> Tensor:
    """h_t = a_t h_{t-1} + b_t from h0 with the (A, Bc) scan of associative_scan (pointwise combine)."""
    return _compiled("k1")(a, b, h0)


def assoc_affine_scan(A: Tensor, Bm: Tensor) -> tuple[Tensor, Tensor]:
    """(Abar, Bbar) with associative_scan and a matrix combine (generic mode)."""
    return _compiled("affine")(A, Bm)


def assoc_affine_recurrence(A: Tensor, Bm: Tensor, H0: Tensor) -> Tensor:
    """H_t from H0: the compiled matrix scan, then Bbar + Abar H0 (eager)."""
    Abar, Bbar = _compiled("affine")(A, Bm)
    return Bbar + Abar @ H0.unsqueeze(1)


# ---------------------------------------------------------------------------------- cuDNN GRU


def gru_layer(dim: int) -> torch.nn.Module:
    """nn.GRU (cuDNN on CUDA) with hidden size dim, batch-first, one layer."""
    return torch.nn.GRU(dim, dim, batch_first=True)
