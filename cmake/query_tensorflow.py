"""Prints, as JSON, what cmake/tensorflow.cmake needs to build krug's TensorFlow ops against the
TensorFlow of this interpreter: its version and its own compile and link flags
(tf.sysconfig), which carry the C++ ABI (_GLIBCXX_USE_CXX11_ABI) TensorFlow was built with.
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # no CUDA-stub chatter in the configure log
out = {"python": sys.executable}
try:
    import tensorflow as tf
except Exception as e:  # noqa: BLE001 (any failure means: no usable TensorFlow here)
    out["error"] = "%s: %s" % (type(e).__name__, e)
    print(json.dumps(out))
    sys.exit(0)

out["version"] = tf.__version__.split("+")[0]
out["compile_flags"] = tf.sysconfig.get_compile_flags()
out["link_flags"] = tf.sysconfig.get_link_flags()
try:
    import pybind11
    out["pybind11_cmake_dir"] = pybind11.get_cmake_dir()
except ImportError:
    pass
print(json.dumps(out))
