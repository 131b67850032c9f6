"""Exact eager references of every scan family, one module each (see each module's docstring for the math)."""

from mingru.scans.affine import affine_scan_bwd_ref, affine_scan_fwd_ref, affine_scan_ref
from mingru.scans.angle import (
    angle_scan_ref,
    angle_transition_ref,
    apply_rotation_layers,
    default_angle_layout,
    validate_angle_layout,
)
from mingru.scans.diag import diag_scan_bwd_ref, diag_scan_fwd_ref, diag_scan_ref
from mingru.scans.linear import linear_scan_bwd_ref, linear_scan_fwd_ref, linear_scan_ref
from mingru.scans.log import (
    parallel_scan_log_bwd_ref,
    parallel_scan_log_fwd_ref,
    parallel_scan_log_ref,
    safe_log,
)

__all__ = [
    "affine_scan_bwd_ref",
    "affine_scan_fwd_ref",
    "affine_scan_ref",
    "angle_scan_ref",
    "angle_transition_ref",
    "apply_rotation_layers",
    "default_angle_layout",
    "diag_scan_bwd_ref",
    "diag_scan_fwd_ref",
    "diag_scan_ref",
    "linear_scan_bwd_ref",
    "linear_scan_fwd_ref",
    "linear_scan_ref",
    "parallel_scan_log_bwd_ref",
    "parallel_scan_log_fwd_ref",
    "parallel_scan_log_ref",
    "safe_log",
    "validate_angle_layout",
]
