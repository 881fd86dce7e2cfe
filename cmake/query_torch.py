"""Prints, as JSON, what cmake/find_torch.cmake needs to build against the torch of this
interpreter: its version, include and library directories, C++ ABI and pybind11 ABI tags.

It asks torch itself, as torch.utils.cpp_extension does, rather than using torch's CMake package:
a CUDA build of torch (every Linux wheel on PyPI) makes find_package(Torch) demand the CUDA
toolkit, which krug's CPU binding does not need.
"""
import os

from query_common import report


def describe():
    import torch
    root = os.path.dirname(torch.__file__)
    return {
        "version": torch.__version__.split("+")[0],
        "root": root,
        "include_dirs": [os.path.join(root, "include"),
                         os.path.join(root, "include", "torch", "csrc", "api", "include")],
        "library_dir": os.path.join(root, "lib"),
        "cxx11_abi": int(bool(torch._C._GLIBCXX_USE_CXX11_ABI)),
        "pybind11_abi": {k: getattr(torch._C, "_PYBIND11_" + k, None)
                         for k in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI")},
    }


report(describe)
