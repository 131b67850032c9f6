"""The guard-free rewrite of Python indexing gives what Python indexing gives, on real tensors."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from mingru_compile._indexing import GuardFreeIndexing, assign_index, index_tensor

INDICES: list[Any] = [
    0,
    -1,
    slice(None),
    slice(1, None),
    slice(None, -1),
    slice(0, 4, 2),
    (slice(None), 1),
    (slice(None), slice(1, 3)),
    (slice(None), slice(-1, None)),
    (Ellipsis, 0),
    (Ellipsis, None),
    (None, Ellipsis, 1),
    (0, Ellipsis, slice(1, 3)),
    (slice(None), None, 2),
    torch.tensor([1, 0]),
    (slice(None), torch.tensor([2, 0, 1])),
    (torch.tensor([0, 1]), slice(None), torch.tensor([1, 2])),
    (slice(None), [0, 2]),
    (Ellipsis, torch.tensor([[0, 1], [2, 3]])),
    (1, slice(None), torch.tensor([0, 3]), None),
]


def _source() -> torch.Tensor:
    return torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)


@pytest.mark.parametrize("index", INDICES, ids=repr)
def test_index_matches_python_indexing(index: Any) -> None:
    x = _source()
    expected = x[index]
    torch.testing.assert_close(index_tensor(x, index), expected, rtol=0, atol=0)
    with GuardFreeIndexing():
        torch.testing.assert_close(x[index], expected, rtol=0, atol=0)


@pytest.mark.parametrize("index", INDICES, ids=repr)
def test_assignment_matches_python_assignment(index: Any) -> None:
    expected, actual = _source(), _source()
    values = torch.randn(expected[index].shape, generator=torch.Generator().manual_seed(0))
    expected[index] = values
    assign_index(actual, index, values)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    expected[index] = -1.0
    with GuardFreeIndexing():
        actual[index] = -1.0
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("index", "error"),
    [
        ((0, 0, 0, 0, 0), IndexError),
        ((Ellipsis, 0, Ellipsis), IndexError),
        (torch.tensor([True, False]), NotImplementedError),
    ],
    ids=["too-many", "two-ellipses", "bool-mask"],
)
def test_unsupported_or_invalid_indices_raise(index: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        index_tensor(_source(), index)
