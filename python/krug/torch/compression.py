"""Gradient compression for the allreduce of DistributedOptimizer (horovod.torch.compression API).

A compressor turns a tensor into the tensor that travels (``compress`` returns it together
with a context) and turns the reduced result back (``decompress(tensor, ctx)``).
"""

import torch


class Compressor(object):
    """Interface: compress a tensor before the collective, decompress the result after it."""

    @staticmethod
    def compress(tensor):
        """Returns (tensor to communicate, context needed by decompress)."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        """Returns the tensor restored from the communicated one and the context."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Communicates tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Communicates floating point tensors as float16 and casts the result back to the
    original dtype. Other dtypes travel unchanged."""

    @staticmethod
    def compress(tensor):
        dtype = tensor.dtype
        if dtype.is_floating_point and dtype != torch.float16:
            return tensor.to(torch.float16), dtype
        return tensor, dtype

    @staticmethod
    def decompress(tensor, ctx):
        dtype = ctx
        if dtype is not None and dtype.is_floating_point and tensor.dtype != dtype:
            return tensor.to(dtype)
        return tensor


class Compression(object):
    """The available compressors: ``Compression.none`` and ``Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
