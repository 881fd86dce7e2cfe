"""``compression=`` of allreduce_gradients and DistributedOptimizer: krug.common.compression
with JAX's cast. ``Compression.none`` sends arrays as they are; ``Compression.fp16`` sends
floating-point arrays as float16 and restores their dtype."""

import jax.numpy as jnp

from krug.common.compression import Compressor, NoneCompressor, compression_for  # noqa: F401

Compression = compression_for(__name__, jnp.float16,
                              lambda dtype: jnp.issubdtype(dtype, jnp.floating),
                              lambda array, dtype: array.astype(dtype))
FP16Compressor = Compression.fp16
