"""Gradient compression for the wire (Horovod's ``horovod.tensorflow.compression``):
krug.common.compression with TensorFlow's cast."""

import tensorflow as tf

from krug.common.compression import Compressor, NoneCompressor, compression_for  # noqa: F401

Compression = compression_for(__name__, tf.float16, lambda dtype: dtype.is_floating, tf.cast)
FP16Compressor = Compression.fp16
