"""Gradient compression for the allreduce of DistributedOptimizer (horovod.torch.compression API):
krug.common.compression with torch's cast."""

import torch

from krug.common.compression import Compressor, NoneCompressor, compression_for  # noqa: F401

Compression = compression_for(__name__, torch.float16, lambda dtype: dtype.is_floating_point,
                              lambda tensor, dtype: tensor.to(dtype))
FP16Compressor = Compression.fp16
