"""What the Python test suites of every frontend (tests/python, tests/tensorflow, tests/jax)
share: the session fixture that initializes krug once per rank, a per-rank temporary
directory, and the expected results of the reductions the op tests run.

Each suite's conftest.py puts this folder on sys.path, so its test files import it too.
"""
import math
import pathlib
import tempfile

import pytest

OP_NAMES = ("sum", "average", "min", "max", "product")


def reduce_ops(hvd):
    """{"sum": hvd.Sum, ...} for a frontend module."""
    return {name: getattr(hvd, name.capitalize()) for name in OP_NAMES}


def contribution(rank):
    """What rank r contributes to the op tests: 2r+1, so that over n ranks Sum = n^2,
    Average = n, Min = 1, Max = 2n-1 and Product = 1*3*5*..., exact in every dtype for n <= 3."""
    return 2 * rank + 1


def expected_reduction(op, size):
    values = [contribution(k) for k in range(size)]
    return {"sum": sum(values), "average": sum(values) // size, "min": min(values),
            "max": max(values), "product": math.prod(values)}[op]


def session_fixture(hvd, before_init=None):
    """An autouse, session-wide fixture: one hvd.init() / hvd.shutdown() per rank's pytest."""

    @pytest.fixture(scope="session", autouse=True)
    def krug_session():
        if before_init is not None:
            before_init()
        hvd.init()
        yield
        hvd.shutdown()

    return krug_session


def rank_tmp_path_fixture(hvd):
    """A tmp_path of this rank's own: pytest's lives under one numbered base that the ranks'
    pytest sessions create and clean up concurrently."""

    @pytest.fixture
    def tmp_path():
        with tempfile.TemporaryDirectory(prefix="krug-test-rank%d-" % hvd.rank()) as path:
            yield pathlib.Path(path)

    return tmp_path
