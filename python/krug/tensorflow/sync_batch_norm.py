"""SyncBatchNormalization: batch normalization with statistics over the whole global batch
(Horovod's ``hvd.SyncBatchNormalization``), for Keras 3 and for tf_keras."""

import tensorflow as tf

from krug.tensorflow.mpi_ops import Sum, _grouped_allreduce, global_process_set


def global_moments(x, axes, keepdims, process_set=global_process_set):
    """Mean and variance of `x` over `axes` and over every rank's batch (which may differ in
    size, or be empty). Differentiable: the allreduce's gradient sums over the ranks."""
    x32 = tf.cast(x, tf.float32) if x.dtype in (tf.float16, tf.bfloat16) else x
    count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x32), axes)), x32.dtype)
    total, squares, n = _grouped_allreduce(
        [tf.reduce_sum(x32, axis=axes, keepdims=keepdims),
         tf.reduce_sum(tf.square(x32), axis=axes, keepdims=keepdims),
         tf.reshape(count, [1])], op=Sum, process_set=process_set)
    n = tf.maximum(n[0], 1.0)
    mean = total / n
    variance = tf.maximum(squares / n - tf.square(mean), 0.0)
    return tf.cast(mean, x.dtype), tf.cast(variance, x.dtype)


def make_sync_batch_norm(base, process_set=global_process_set):
    """A subclass of the BatchNormalization layer class `base` (Keras 3's or tf_keras') whose
    training statistics are global."""
    if hasattr(base, "_calculate_mean_and_var"):  # tf_keras (Keras 2)
        class SyncBatchNormalization(base):
            """Batch normalization whose batch statistics cover every rank's batch."""

            def _calculate_mean_and_var(self, inputs, reduction_axes, keep_dims, mask=None):
                return global_moments(inputs, list(reduction_axes), keep_dims, process_set)
    else:  # Keras 3
        class SyncBatchNormalization(base):
            """Batch normalization whose batch statistics cover every rank's batch."""

            def _moments(self, inputs, mask):
                if mask is not None:
                    raise NotImplementedError("SyncBatchNormalization does not support masks")
                return global_moments(inputs, list(self._reduction_axes), False, process_set)
    return SyncBatchNormalization


SyncBatchNormalization = make_sync_batch_norm(tf.keras.layers.BatchNormalization)
