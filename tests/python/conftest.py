"""Runs in every rank of `krugrun -np N python3 -m pytest tests/python/<file>`: one krug
initialization for the whole session. Tests must issue the same collectives in the same order
on every rank, and use names no other test uses."""

import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "common"))

import krug.torch as hvd  # noqa: E402
from krug_testing import session_fixture  # noqa: E402

krug_session = session_fixture(hvd, before_init=lambda: torch.manual_seed(0))
