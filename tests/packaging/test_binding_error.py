"""krug.torch's import error when its binding is missing or built for another torch: it says
what happened and how to rebuild (python/krug/common/binding.py)."""

from krug import _build_info
from krug.common import binding


def test_not_built_says_why_and_how_to_rebuild(monkeypatch):
    monkeypatch.setattr(_build_info, "torch_built", False)
    monkeypatch.setattr(_build_info, "torch_problem", "torch 1.12.1 is not supported")
    msg = binding.torch_core_error(ImportError("no module"), "1.12.1")
    assert "built without its PyTorch binding (torch 1.12.1 is not supported)" in msg
    assert "KRUG_WITH_PYTORCH=1" in msg and "pip install" in msg


def test_built_for_another_torch_names_both_versions(monkeypatch):
    monkeypatch.setattr(_build_info, "torch_built", True)
    monkeypatch.setattr(_build_info, "torch_version", "2.15.0")
    msg = binding.torch_core_error(ImportError("undefined symbol: _ZN3c10"), "2.16.0")
    assert "built against torch 2.15.0" in msg and "this environment has torch 2.16.0" in msg
    assert "undefined symbol" in msg and "KRUG_WITH_PYTORCH=1" in msg


def test_load_raises_the_explained_error(monkeypatch):
    def missing(name):
        raise ImportError("No module named %r" % name)

    monkeypatch.setattr(binding.importlib, "import_module", missing)
    monkeypatch.setattr(_build_info, "torch_built", False)
    monkeypatch.setattr(_build_info, "torch_problem", "torch was not found")
    try:
        binding.load_torch_core()
    except ImportError as e:
        assert "krug.torch is not available" in str(e) and "torch was not found" in str(e)
    else:
        raise AssertionError("no ImportError")
