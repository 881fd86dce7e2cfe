"""Gradient compression for the wire (Horovod's ``horovod.<framework>.compression``), written once
for krug.torch, krug.tensorflow (and its Keras frontends) and krug.jax.

A compressor turns a tensor into the tensor that travels (``compress`` returns it together with
a context) and turns the reduced result back (``decompress(tensor, ctx)``). A framework makes
its ``Compression`` with :func:`compression_for`, giving only its float16 dtype, its test for a
floating-point dtype and its cast.
"""


class Compressor:
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
    """Communicates floating-point tensors as float16 and casts the result back to the original
    dtype (the context). Other dtypes travel unchanged.

    A framework's subclass (made by compression_for) sets ``float16``, ``is_floating(dtype)``
    and ``cast(tensor, dtype)``."""

    float16 = None

    @staticmethod
    def is_floating(dtype):
        raise NotImplementedError

    @staticmethod
    def cast(tensor, dtype):
        raise NotImplementedError

    @classmethod
    def compress(cls, tensor):
        dtype = tensor.dtype
        if cls.is_floating(dtype) and dtype != cls.float16:
            return cls.cast(tensor, cls.float16), dtype
        return tensor, dtype

    @classmethod
    def decompress(cls, tensor, ctx):
        if ctx is not None and tensor.dtype != ctx:
            return cls.cast(tensor, ctx)
        return tensor


class Compression:
    """The compressors a DistributedOptimizer or allreduce takes as ``compression=``:
    ``Compression.none`` and ``Compression.fp16``."""

    none = NoneCompressor
    fp16 = None  # the framework's FP16Compressor


def compression_for(module, float16, is_floating, cast):
    """A framework's ``Compression``, whose ``fp16`` casts with ``cast(tensor, dtype)`` the
    tensors whose dtype passes ``is_floating(dtype)`` to ``float16``. The module that publishes
    the classes (``module``: its ``__name__``) must hold them as ``Compression`` and
    ``FP16Compressor``: pickle finds classes by module and name."""
    fp16 = type("FP16Compressor", (FP16Compressor,), {
        "__module__": module, "__doc__": FP16Compressor.__doc__.split("\n\n")[0],
        "float16": float16, "is_floating": staticmethod(is_floating),
        "cast": staticmethod(cast)})
    return type("Compression", (Compression,), {
        "__module__": module, "__doc__": Compression.__doc__, "fp16": fp16})
