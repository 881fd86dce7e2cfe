"""Prints, as JSON, what cmake/find_torch.cmake needs to build against the torch of this
interpreter: its version, include and library directories, C++ ABI and pybind11 ABI tags.

It asks torch itself, as torch.utils.cpp_extension does, rather than using torch's CMake package:
a CUDA build of torch (every Linux wheel on PyPI) makes find_package(Torch) demand the CUDA
toolkit, which krug's CPU binding does not need.
"""
import json
import os
import sys

out = {"python": sys.executable}
try:
    import torch
except Exception as e:  # noqa: BLE001 (any failure means: no usable torch here)
    out["error"] = "%s: %s" % (type(e).__name__, e)
    print(json.dumps(out))
    sys.exit(0)

root = os.path.dirname(torch.__file__)
out["version"] = torch.__version__.split("+")[0]
out["root"] = root
out["include_dirs"] = [os.path.join(root, "include"),
                       os.path.join(root, "include", "torch", "csrc", "api", "include")]
out["library_dir"] = os.path.join(root, "lib")
out["cxx11_abi"] = int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))
out["pybind11_abi"] = {k: getattr(torch._C, "_PYBIND11_" + k, None)
                       for k in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI")}
try:
    import pybind11
    out["pybind11_cmake_dir"] = pybind11.get_cmake_dir()
except ImportError:
    pass
print(json.dumps(out))
