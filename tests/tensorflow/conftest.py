"""Runs in every rank of `krugrun -np N python -m pytest tests/tensorflow/<file>`: one krug
initialization for the whole session. Tests issue the same collectives in the same order on
every rank."""

import pathlib
import tempfile

import pytest

import krug.tensorflow as hvd


@pytest.fixture(scope="session", autouse=True)
def krug_session():
    hvd.init()
    yield
    hvd.shutdown()


@pytest.fixture
def tmp_path():
    """A directory of this rank's own: pytest's tmp_path lives under one numbered base that the
    ranks' pytest sessions create and clean up concurrently."""
    with tempfile.TemporaryDirectory(prefix="krug-test-rank%d-" % hvd.rank()) as path:
        yield pathlib.Path(path)
