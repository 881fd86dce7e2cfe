"""Runs in every rank of `krugrun -np N python -m pytest tests/jax/<file>`: one krug
initialization for the whole session. Tests issue the same collectives in the same order on
every rank."""

import pytest

import krug.jax as hvd


@pytest.fixture(scope="session", autouse=True)
def krug_session():
    hvd.init()
    yield
    hvd.shutdown()
