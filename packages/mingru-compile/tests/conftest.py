"""Reset the dispatch environment (MINGRU_SCAN, TRITON_INTERPRET) and the Dynamo caches around every test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def default_dispatch(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("MINGRU_SCAN", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
