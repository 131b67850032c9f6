"""Input validation shared by the scans: every message names the argument, the expectation and what came."""

from __future__ import annotations

import torch
from torch import Tensor

_HALF = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a scan accumulates in: float32 for half types, the input dtype otherwise."""
    return torch.float32 if dtype in _HALF else dtype


def cast(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x`` in ``dtype``: ``x`` itself when it already has it, else a converted copy.

    ``Tensor.to`` with the tensor's own dtype returns an alias; returned from an autograd Function's
    forward, such an alias makes torch 2.11's torch.compile compute wrong input gradients.
    """
    return x if x.dtype == dtype else x.to(dtype)


def check_float_tensor(name: str, value: object, rank: int, layout: str) -> Tensor:
    """Check that ``value`` is a floating tensor of ``rank`` dims; ``layout`` names the dims ("(B, T, D)")."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {layout}, got {type(value).__name__}")
    if not value.is_floating_point():
        raise TypeError(
            f"{name} must be a floating tensor (float16, bfloat16, float32 or float64), "
            f"got dtype {value.dtype}"
        )
    if value.dim() != rank:
        raise ValueError(f"{name} must have {rank} dims {layout}, got shape {tuple(value.shape)}")
    return value


def check_int_tensor(name: str, value: object, rank: int, layout: str) -> Tensor:
    """Check that ``value`` is an int32 or int64 tensor of ``rank`` dims."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {layout}, got {type(value).__name__}")
    if value.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be an int32 or int64 tensor, got dtype {value.dtype}")
    if value.dim() != rank:
        raise ValueError(f"{name} must have {rank} dims {layout}, got shape {tuple(value.shape)}")
    return value


def check_shape(name: str, value: Tensor, expected: tuple[int, ...], layout: str) -> None:
    """Check that ``value.shape == expected``; ``layout`` spells the expected dims symbolically."""
    if tuple(value.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {layout} = {tuple(expected)}, got {tuple(value.shape)}")


def check_same_device_dtype(named: dict[str, Tensor]) -> None:
    """Check that the tensors share one device and one dtype (the first one named is the reference)."""
    items = list(named.items())
    first_name, first = items[0]
    for name, value in items[1:]:
        if value.device != first.device:
            raise ValueError(
                f"{name} must be on the same device as {first_name} ({first.device}), got {value.device}"
            )
        if value.dtype != first.dtype:
            raise TypeError(
                f"{name} must have the same dtype as {first_name} ({first.dtype}), got {value.dtype}"
            )
