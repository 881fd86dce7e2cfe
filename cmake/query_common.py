"""What every cmake/query_*.py prints, as JSON: the interpreter, what `describe()` finds of its
framework (or the error that stops it: the framework is not usable here) and pybind11's CMake
directory, if pybind11 is installed. Each query is run as a script, so this module is found
next to it."""
import json
import sys


def report(describe):
    out = {"python": sys.executable}
    try:
        out.update(describe())
    except Exception as e:  # noqa: BLE001 (any failure means: no usable framework here)
        out["error"] = "%s: %s" % (type(e).__name__, e)
        print(json.dumps(out))
        return
    try:
        import pybind11
        out["pybind11_cmake_dir"] = pybind11.get_cmake_dir()
    except ImportError:
        pass
    print(json.dumps(out))
