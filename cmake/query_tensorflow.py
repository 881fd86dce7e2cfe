"""Prints, as JSON, what cmake/tensorflow.cmake needs to build krug's TensorFlow ops against the
TensorFlow of this interpreter: its version and its own compile and link flags
(tf.sysconfig), which carry the C++ ABI (_GLIBCXX_USE_CXX11_ABI) TensorFlow was built with.
"""
import os

from query_common import report

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # no CUDA-stub chatter in the configure log


def describe():
    import tensorflow as tf
    return {"version": tf.__version__.split("+")[0],
            "compile_flags": tf.sysconfig.get_compile_flags(),
            "link_flags": tf.sysconfig.get_link_flags()}


report(describe)
