"""Runs in every rank of `krugrun -np N python -m pytest tests/tensorflow/<file>`: one krug
initialization for the whole session. Tests issue the same collectives in the same order on
every rank."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "common"))

import krug.tensorflow as hvd  # noqa: E402
from krug_testing import rank_tmp_path_fixture, session_fixture  # noqa: E402

krug_session = session_fixture(hvd)
tmp_path = rank_tmp_path_fixture(hvd)
