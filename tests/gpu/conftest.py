"""Runs in every rank of `krugrun -np N python -m pytest tests/gpu` (scripts/gpu-check runs it
with 1, 2 and 4 ranks sharing one GPU). Without a usable GPU every test is skipped with the
reason, and pytest's summary counts them as skipped: a CPU machine never claims them."""

import pytest
import torch

import krug.torch as hvd


def _why_no_gpu():
    if not hvd.cuda_built():
        return "krug was built without CUDA (krugrun --check-build says why)"
    if not torch.cuda.is_available():
        return "torch %s sees no CUDA device (torch CUDA %s)" % (torch.__version__,
                                                                 torch.version.cuda)
    return None


def pytest_report_header(config):
    why = _why_no_gpu()
    return "krug GPU tests: " + ("SKIPPED, no GPU: " + why if why else
                                 "on %s" % torch.cuda.get_device_name(0))


def pytest_collection_modifyitems(config, items):
    why = _why_no_gpu()
    if why:
        for item in items:
            item.add_marker(pytest.mark.skip(reason="no GPU: " + why))


@pytest.fixture(scope="session", autouse=True)
def krug_session():
    torch.manual_seed(0)
    hvd.init()
    if _why_no_gpu() is None:
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    yield
    hvd.shutdown()
