#!/opt/krug/venv/bin/python
"""Allreduces through krug's TensorFlow API in eager mode, the TensorFlow side of
krug_small_ops.py (same tensors, timing and output line).

    krugrun -np 2 /opt/krug/venv/bin/python bench/tf_small_ops.py --tensors 1 --tensor-bytes 4K
    krugrun -np 2 /opt/krug/venv/bin/python bench/tf_small_ops.py --sizes 4K,64K,1M,16M,64M

A step calls hvd.allreduce(t, op=hvd.Sum, name=...) eagerly for every tensor, one after the
other (an eager TensorFlow op returns its result), as a script that reduces a value outside a
tf.function does. With one tensor it is the time of one allreduce from eager TensorFlow: the
Python call, TensorFlow's eager dispatch, the asynchronous kernel, krug's engine and the
output tensor. TensorFlow runs with one intra-op and one inter-op thread per rank. One more
step checks the results.
"""
import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

import krug.tensorflow as hvd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pybench  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    pybench.add_step_arguments(p, tensors=1, tensor_bytes="4K")
    p.add_argument("--sizes", default=None,
                   help="comma-separated sizes: one tensor of each, a row each (e.g. 4K,64M)")
    return p.parse_args()


def main():
    args = parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    hvd.init()

    def slowest(v):
        t = hvd.allreduce(tf.constant([v], dtype=tf.float64), op=hvd.Max,
                          name="tf_small_ops.max")
        return float(t[0])

    wrong = 0
    if args.sizes:
        for i, size in enumerate(args.sizes.split(",")):
            args.tensors, args.tensor_bytes = 1, size
            wrong += measure(args, slowest, header=i == 0)
    else:
        wrong = measure(args, slowest, header=True)
    hvd.shutdown()
    return 0 if wrong == 0 else 1


def measure(args, slowest, header):
    """Times the step of args.tensors x args.tensor_bytes (or args.shapes), prints its row;
    returns the number of wrong elements over all ranks."""
    spec, what = pybench.step_tensors(args)
    # Zeros while timing (sums of zeros stay zero), as krug_small_ops.py.
    tensors = [tf.zeros(shape) for _, shape in spec]
    names = ["tf_small_ops.%s.%s" % (args.tensor_bytes, name) for name, _ in spec]
    results = []

    def once():
        results[:] = [hvd.allreduce(t, op=hvd.Sum, name=name) for t, name in zip(tensors, names)]

    if header and hvd.rank() == 0:
        pybench.print_step_header("tf_small_ops", what, hvd.size(),
                                  "eager hvd.allreduce one after the other (krug.tensorflow)")
    iters, secs = pybench.time_operation(once, slowest, hvd.barrier, iters=args.iters,
                                         target_seconds=args.target_seconds)
    tensors = [tf.fill(shape, hvd.rank() + 1.0) for _, shape in spec]
    once()
    n = hvd.size()
    wrong = sum(int(tf.reduce_sum(tf.cast(r != n * (n + 1) / 2, tf.int64))) for r in results)
    wrong = int(hvd.allreduce(tf.constant([wrong], dtype=tf.float64), op=hvd.Sum,
                              name="tf_small_ops.wrong")[0])
    if hvd.rank() == 0:
        pybench.print_step_row(len(tensors), 4 * sum(int(tf.size(t)) for t in tensors), iters,
                               secs, wrong)
    return wrong


if __name__ == "__main__":
    sys.exit(main())
