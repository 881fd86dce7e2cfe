"""The one place where Python calls the core's elastic functions.

Everything else calls these wrappers through this module (``_core_bridge.elastic_round()``,
never a copied reference), so tests can replace them with monkeypatch."""

import os

from krug.torch import _torch_core as _core


def _core_function(name):
    fn = getattr(_core, name, None)
    if fn is None:
        raise RuntimeError(
            "krug.torch._torch_core has no %s(): this build of krug's C++ core predates "
            "elastic training; rebuild krug" % name)
    return fn


def elastic_enabled():
    """Whether krugrun's elastic driver started this process (KRUG_ELASTIC=1)."""
    if not hasattr(_core, "elastic_enabled") and os.environ.get("KRUG_ELASTIC") != "1":
        return False  # a core without elastic support runs fixed jobs only
    return bool(_core_function("elastic_enabled")())


def elastic_round():
    """``(round, has_new_workers)`` of the current init(): the rendezvous round (0, 1, ...)
    and whether workers without state joined in it. ``(0, False)`` outside elastic mode."""
    round_, has_new_workers = _core_function("elastic_round")()
    return int(round_), bool(has_new_workers)


def elastic_host_update():
    """``(changed, only_removed)``: whether the hosts changed since this round began (asks
    krugrun over the network; rank-local, not collective), and whether every change was a
    removal. ``(False, False)`` outside elastic mode."""
    changed, only_removed = _core_function("elastic_host_update")()
    return bool(changed), bool(only_removed)
