"""Gradient compression for the wire (Horovod's ``horovod.tensorflow.compression``)."""

import tensorflow as tf


class Compressor:
    """Compresses a tensor before a collective and restores it afterwards."""

    @staticmethod
    def compress(tensor):
        """Returns (compressed tensor, context for decompress)."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Casts floating-point tensors to float16 for the collective and back afterwards."""

    @staticmethod
    def compress(tensor):
        dtype = tensor.dtype
        if dtype.is_floating and dtype != tf.float16:
            return tf.cast(tensor, tf.float16), dtype
        return tensor, dtype

    @staticmethod
    def decompress(tensor, ctx):
        if ctx is not None and ctx != tensor.dtype:
            return tf.cast(tensor, ctx)
        return tensor


class Compression:
    """The compressors a DistributedOptimizer or allreduce takes as ``compression=``."""
    none = NoneCompressor
    fp16 = FP16Compressor
