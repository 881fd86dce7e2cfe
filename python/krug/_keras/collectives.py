"""Horovod's Keras collectives (``horovod.keras.allreduce`` and the rest): the value, then an
optional name, where the TensorFlow ones take ``average`` / ``device_dense`` second. A ported
``hvd.allreduce(x, 'metric')`` would otherwise pass the name as ``average``."""

import tensorflow as tf

from krug.tensorflow import gradients as _gradients
from krug.tensorflow import mpi_ops as _mpi_ops
from krug.tensorflow.compression import Compression


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0,
              op=None, compression=Compression.none, process_set=_mpi_ops.global_process_set):
    """``value`` (a tensor, array or number) reduced over the ranks (default: averaged)."""
    return _gradients.allreduce(tf.convert_to_tensor(value), average=average,
                                compression=compression, op=op,
                                prescale_factor=prescale_factor,
                                postscale_factor=postscale_factor, name=name,
                                process_set=process_set)


def allgather(value, name=None, process_set=_mpi_ops.global_process_set):
    """Every rank's ``value`` concatenated along the first dimension, in rank order."""
    return _mpi_ops.allgather(tf.convert_to_tensor(value), name=name, process_set=process_set)


def broadcast(value, root_rank, name=None, process_set=_mpi_ops.global_process_set):
    """``root_rank``'s ``value`` on every rank."""
    return _mpi_ops.broadcast(tf.convert_to_tensor(value), root_rank, name=name,
                              process_set=process_set)


def reducescatter(value, name=None, op=_mpi_ops.Average,
                  process_set=_mpi_ops.global_process_set):
    """``value`` reduced over the ranks; this rank keeps its share of the first dimension."""
    return _gradients.reducescatter(tf.convert_to_tensor(value), op=op, name=name,
                                    process_set=process_set)
