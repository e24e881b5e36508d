"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest

import hora


@pytest.fixture
def one_rank(monkeypatch):
    """hora started on one rank in this process, as an elastic launcher's rank (HOROVOD_ELASTIC=1)."""
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    hora.init()
    yield
    hora.shutdown()
