"""Loading a framework binding (a compiled module of krug) with an error that says how to fix it.

A binding is built only when its framework was importable while krug was built, and it works
only with the framework version it was built against; either failure ends in an ImportError
that names what happened and the command that rebuilds krug for this environment.
"""

import importlib
import sys

from krug import _build_info

REBUILD = ("KRUG_WITH_PYTORCH=1 {python} -m pip install --no-cache-dir --force-reinstall "
           "--no-deps <krug source: a clone or sdist>  (from a clone for development: "
           "scripts/build)")


def load_torch_core():
    """krug.torch._torch_core, or an ImportError that explains why it cannot be loaded."""
    try:
        return importlib.import_module("krug.torch._torch_core")
    except ImportError as e:
        raise ImportError(torch_core_error(e, _torch_version())) from e


def _torch_version():
    torch = sys.modules.get("torch")
    return getattr(torch, "__version__", "unknown")


def torch_core_error(cause, torch_here):
    rebuild = REBUILD.format(python=sys.executable)
    if not _build_info.torch_built:
        return ("krug.torch is not available: this krug was built without its PyTorch binding "
                "(%s). Install torch into this environment, then rebuild krug: %s"
                % (_build_info.torch_problem, rebuild))
    return ("krug.torch's binding does not load (%s). It was built against torch %s for %s; "
            "this environment has torch %s (%s). Rebuild krug against this torch: %s"
            % (cause, _build_info.torch_version, _build_info.python, torch_here,
               sys.executable, rebuild))
