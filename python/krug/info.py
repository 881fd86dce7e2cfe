"""``python -m krug.info``: what this krug was built with and what this environment has.

It prints krug's version and place, the interpreter, the torch importable here beside the one
the binding was built against (and whether the binding loads), the TensorFlow the TensorFlow
binding was built against and the one here, the same for JAX, then krugrun's build report
(``krugrun --check-build``: frameworks, controllers, tensor operations).
"""

import os
import re
import subprocess
import sys

import krug
from krug import _build_info
from krug._launcher import krugrun_path


def _torch_lines():
    try:
        import torch
        here = "torch %s (%s)" % (torch.__version__, os.path.dirname(torch.__file__))
    except ImportError as e:
        here = "no torch (%s)" % e
    lines = ["torch here:          " + here]
    if not _build_info.torch_built:
        lines.append("krug.torch:          not built: " + _build_info.torch_problem)
        return lines
    lines.append("krug.torch built:    against torch %s" % _build_info.torch_version)
    try:
        import krug.torch  # noqa: F401
        lines.append("krug.torch loads:    yes")
    except ImportError as e:
        lines.append("krug.torch loads:    no: %s" % e)
    return lines


def _binding_lines(binding, framework, module):
    """What ``binding`` (krug.tensorflow, krug.jax) was built against and what is here."""
    label = (binding + ":").ljust(21)
    if not getattr(_build_info, module + "_built"):
        return [label + "not built: " + getattr(_build_info, module + "_problem")]
    lines = [label + "built against %s %s" % (framework, getattr(_build_info,
                                                                  module + "_version"))]
    here = (module + " here:").ljust(21)
    try:
        lines.append(here + __import__(module).__version__)
    except ImportError as e:
        lines.append(here + "none (%s)" % e)
    return lines


def report():
    lines = ["krug %s (%s)" % (krug.__version__, os.path.dirname(krug.__file__)),
             "python:              %s %s" % (sys.executable, sys.version.split()[0])]
    lines += _torch_lines()
    lines += _binding_lines("krug.tensorflow", "TensorFlow", "tensorflow")
    lines += _binding_lines("krug.jax", "JAX", "jax")
    lines.append("krugrun:             " + krugrun_path())
    return "\n".join(lines) + "\n"


def check_build():
    """krugrun's build report (``krugrun --check-build``): what the C++ core was built with,
    e.g. the line ``[X] NCCL (2.28.9 (loaded: 2.28.9))``. Raises OSError or
    subprocess.CalledProcessError when krugrun does not answer."""
    return subprocess.run([krugrun_path(), "--check-build"], capture_output=True, text=True,
                          check=True).stdout


def nccl_version_code(report=None):
    """The NCCL version that the build report (``report``, else check_build()'s) names, as
    nccl.h's NCCL_VERSION_CODE encodes it and Horovod's ``hvd.nccl_built()`` returns it: 22809
    for 2.28.9 (major * 10000 + minor * 100 + patch since NCCL 2.9; major * 1000 + ... before),
    0 for a build without NCCL."""
    found = re.search(r"\[X\] NCCL \((\d+)\.(\d+)\.(\d+)",
                      check_build() if report is None else report)
    if found is None:
        return 0
    major, minor, patch = (int(part) for part in found.groups())
    return major * (10000 if (major, minor) >= (2, 9) else 1000) + minor * 100 + patch


def main():
    sys.stdout.write(report() + "\n")
    sys.stdout.flush()
    try:
        sys.stdout.write(check_build())
    except (OSError, subprocess.CalledProcessError) as e:
        sys.stderr.write("krug.info: cannot run krugrun (%s): %s\n" % (krugrun_path(), e))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
