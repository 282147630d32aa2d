"""Tests that need no server: no Redis flush before each (the suite's ``clean_redis_state``
is overridden), no database unless a test asks for one (then SQLite, when no server runs)."""

import pytest


@pytest.fixture(autouse=True)
def clean_redis_state() -> None:
    """Overrides the suite's: unit tests use no Redis."""
