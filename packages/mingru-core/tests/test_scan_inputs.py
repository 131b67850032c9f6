"""Bad inputs to every scan raise TypeError/ValueError naming the argument, the expectation and what came."""

from __future__ import annotations

import re

import pytest
import torch

from mingru import affine_scan, angle_scan, diag_scan, linear_scan, log_recurrence, parallel_scan_log
from mingru.scans import default_angle_layout, validate_angle_layout

f32 = torch.float32


def _raises(exc, pattern, fn, *args, **kwargs):
    with pytest.raises(exc, match=pattern):
        fn(*args, **kwargs)


def test_linear_scan_bad_inputs():
    good = torch.zeros(2, 3, 4)
    _raises(TypeError, r"a must be a torch.Tensor \(B, T, D\), got list", linear_scan, [1.0], good)
    _raises(ValueError, r"a must have 3 dims \(B, T, D\), got shape \(3, 4\)", linear_scan, good[0], good)
    _raises(
        ValueError,
        re.escape("b must have shape like a (B, T, D) = (2, 3, 4), got (2, 3, 5)"),
        linear_scan,
        good,
        torch.zeros(2, 3, 5),
    )
    _raises(
        TypeError, r"b must be a floating tensor .* got dtype torch.int64", linear_scan, good, good.long()
    )
    _raises(
        TypeError,
        r"b must have the same dtype as a \(torch.float32\), got torch.float64",
        linear_scan,
        good,
        good.double(),
    )
    _raises(
        ValueError,
        r"b must be on the same device as a \(cpu\), got meta",
        linear_scan,
        good,
        good.to("meta"),
    )


def test_log_scan_bad_inputs():
    log_coeffs = torch.zeros(2, 3, 4)
    _raises(
        ValueError,
        re.escape("log_values must have shape (B, T+1, D) = (2, 4, 4), got (2, 3, 4)"),
        parallel_scan_log,
        log_coeffs,
        torch.zeros(2, 3, 4),
    )
    _raises(
        TypeError,
        r"log_coeffs must be a floating tensor .* got dtype torch.int32",
        parallel_scan_log,
        log_coeffs.int(),
        torch.zeros(2, 4, 4),
    )
    _raises(
        ValueError,
        re.escape("h0 must have 2 dims (B, D), got shape (4,)"),
        log_recurrence,
        log_coeffs,
        log_coeffs,
        torch.zeros(4),
    )
    _raises(
        ValueError,
        re.escape("log_b must have shape like log_coeffs (B, T, D) = (2, 3, 4), got (2, 3, 1)"),
        log_recurrence,
        log_coeffs,
        torch.zeros(2, 3, 1),
    )


def test_affine_and_diag_scan_bad_inputs():
    A = torch.zeros(1, 2, 3, 4, 4)
    _raises(
        ValueError,
        r"A must hold square k x k matrices \(B, T, n, k, k\), got shape \(1, 2, 3, 4, 5\)",
        affine_scan,
        torch.zeros(1, 2, 3, 4, 5),
        torch.zeros(1, 2, 3, 4, 2),
    )
    _raises(
        ValueError,
        re.escape("Bm must have shape (B, T, n, k, v) matching A = (1, 2, 3, 4, 2), got (1, 2, 3, 5, 2)"),
        affine_scan,
        A,
        torch.zeros(1, 2, 3, 5, 2),
    )
    _raises(
        ValueError,
        r"Bm must have 5 dims \(B, T, n, k, v\), got shape \(1, 2, 3, 4\)",
        affine_scan,
        A,
        A[..., 0],
    )
    _raises(
        ValueError,
        re.escape("Bm must have shape (B, T, n, k, v) matching a = (1, 2, 3, 4, 6), got (1, 2, 3, 3, 6)"),
        diag_scan,
        torch.zeros(1, 2, 3, 4),
        torch.zeros(1, 2, 3, 3, 6),
    )
    _raises(
        ValueError,
        r"a must have 4 dims \(B, T, n, k\), got shape \(1, 2, 3\)",
        diag_scan,
        torch.zeros(1, 2, 3),
        A,
    )


def _angle_args(k=4, layers=2):
    perm, sgn, p2p = default_angle_layout(k, layers)
    return [
        torch.zeros(2, 3, 1, layers, k // 2),
        torch.zeros(2, 3, 1),
        torch.zeros(2, 3, 1),
        torch.zeros(2, 3, 1, k),
        torch.zeros(2, 1, k),
        perm,
        sgn,
        p2p,
    ]


@pytest.mark.parametrize(
    ("index", "value", "exc", "pattern"),
    [
        (
            0,
            torch.zeros(2, 3, 1, 2, 3),
            ValueError,
            r"theta must have shape \(B, T, n, R, k/2\) = \(2, 3, 1, 2, 2\)",
        ),
        (
            1,
            torch.zeros(2, 3, 2),
            ValueError,
            r"scale must have shape \(B, T, n\) = \(2, 3, 1\), got \(2, 3, 2\)",
        ),
        (2, torch.zeros(2, 3), ValueError, r"gamma must have 3 dims \(B, T, n\), got shape \(2, 3\)"),
        (
            4,
            torch.zeros(2, 1, 6),
            ValueError,
            r"h0 must have shape \(B, n, k\) = \(2, 1, 4\), got \(2, 1, 6\)",
        ),
        (5, torch.zeros(2, 4), TypeError, r"perm must be an int32 or int64 tensor, got dtype torch.float32"),
        (6, torch.ones(2, 4, dtype=torch.int64), TypeError, r"sgn must be a floating tensor"),
        (
            7,
            torch.zeros(2, 5, dtype=torch.int64),
            ValueError,
            r"p2p must have shape like perm \(R, k\) = \(2, 4\)",
        ),
        (3, torch.zeros(2, 3, 1, 4, dtype=torch.float64), TypeError, r"theta must have the same dtype as b"),
    ],
    ids=["theta", "scale", "gamma", "h0", "perm-dtype", "sgn-dtype", "p2p-shape", "mixed-dtype"],
)
def test_angle_scan_bad_inputs(index, value, exc, pattern):
    args = _angle_args()
    args[index] = value
    _raises(exc, pattern, angle_scan, *args, has_scale=True, has_decay=True)


@pytest.mark.parametrize(
    ("edit", "pattern"),
    [
        (
            lambda p, s, q: p.__setitem__((0, 0), 0),
            r"perm\[0\] must have no fixed point, but perm\[0, 0\] = 0",
        ),
        (
            lambda p, s, q: p.__setitem__((1, 0), 3),
            r"perm\[1\] must be an involution: perm\[1, 0\] = 3 but perm\[1, 3\] = 1",
        ),
        (lambda p, s, q: p.__setitem__((0, 2), 9), r"perm\[0, 2\] must be a position in \[0, 4\), got 9"),
        (lambda p, s, q: q.__setitem__((0, 1), 1), r"p2p\[0\] must give both members of a pair one angle"),
        (lambda p, s, q: q.__setitem__((0, 0), 5), r"p2p\[0, 0\] must be an angle index in \[0, 2\), got 5"),
        (
            lambda p, s, q: q[0].fill_(0),
            r"p2p\[0\] must use each angle index by exactly one pair \(twice\), got index 0 4",
        ),
        (lambda p, s, q: s.__setitem__((1, 2), 0.5), r"sgn\[1\] must hold only \+1 or -1, got 0.5"),
    ],
    ids=[
        "fixed-point",
        "not-involution",
        "out-of-range",
        "pair-split",
        "angle-range",
        "angle-reused",
        "sgn-value",
    ],
)
def test_validate_angle_layout_messages(edit, pattern):
    perm, sgn, p2p = default_angle_layout(4, 2)
    validate_angle_layout(perm, sgn, p2p)
    edit(perm, sgn, p2p)
    with pytest.raises(ValueError, match=pattern):
        validate_angle_layout(perm, sgn, p2p)


def test_default_angle_layout_bad_args_and_int32_layouts():
    with pytest.raises(ValueError, match=r"k must be an even int >= 2, got 5"):
        default_angle_layout(5, 1)
    with pytest.raises(ValueError, match=r"layers must be an int >= 0, got -1"):
        default_angle_layout(4, -1)
    for k in (2, 4, 6, 8, 10, 16):
        perm, sgn, p2p = default_angle_layout(k, 5, reflect=True)
        validate_angle_layout(perm.int(), sgn.double(), p2p.int())
