"""Runs in every rank of `krugrun -np N python3 -m pytest tests/python/<file>`: one krug
initialization for the whole session. Tests must issue the same collectives in the same order
on every rank, and use names no other test uses."""

import pytest
import torch

import krug.torch as hvd


@pytest.fixture(scope="session", autouse=True)
def krug_session():
    torch.manual_seed(0)
    hvd.init()
    yield
    hvd.shutdown()
