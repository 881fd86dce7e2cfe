#!/usr/bin/python3
"""Training throughput of a Keras application model on synthetic data with krug.tensorflow
(Horovod's tensorflow2_synthetic_benchmark.py flags).

    krugrun -np 2 /opt/krug/venv/bin/python examples/tensorflow2_synthetic_benchmark.py \
        --model MobileNetV2 --batch-size 8 --image-size 64 --num-iters 5

Every rank trains the model on one fixed random batch (no data loading) with a
DistributedGradientTape (gradients optionally compressed to float16 on the wire). After
--num-warmup-batches steps, --num-iters timed iterations of --num-batches-per-iter steps each
give img/sec samples; rank 0 prints the mean per rank with a 95% interval and the total.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from synthetic_common import benchmark_arguments, log_totals, time_steps  # noqa: E402

import krug.tensorflow as hvd  # noqa: E402


def parse_args():
    p = benchmark_arguments(__doc__, "ResNet50", "a tf.keras.applications model")
    p.add_argument("--fp16-allreduce", action="store_true",
                   help="compress gradients to float16 for the allreduce")
    p.add_argument("--eager", action="store_true", help="run the step eagerly (no tf.function)")
    return p.parse_args()


def log(message):
    if hvd.rank() == 0:
        print(message, flush=True)


def main():
    args = parse_args()
    hvd.init()
    if not hasattr(tf.keras.applications, args.model):
        raise SystemExit("unknown tf.keras.applications model '%s'" % args.model)
    model = getattr(tf.keras.applications, args.model)(
        weights=None, input_shape=(args.image_size, args.image_size, 3),
        classes=args.num_classes)
    optimizer = tf.keras.optimizers.SGD(0.01 * hvd.size())
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    rng = np.random.RandomState(hvd.rank())
    data = tf.constant(rng.rand(args.batch_size, args.image_size, args.image_size, 3),
                       tf.float32)
    target = tf.constant(rng.randint(0, args.num_classes, args.batch_size), tf.int64)

    def step(first_batch):
        with tf.GradientTape() as tape:
            loss = loss_fn(target, model(data, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables, root_rank=0)

    compiled = step if args.eager else tf.function(step)

    def benchmark_step(first_batch=False):
        # The broadcast after the first step runs eagerly (it makes a function of its own).
        if first_batch:
            step(True)
        else:
            compiled(False)

    log("Model: %s, batch size: %d, ranks: %d" % (args.model, args.batch_size, hvd.size()))
    benchmark_step(first_batch=True)
    mean, conf = time_steps(benchmark_step, args, log)
    log_totals(log, hvd.size(), mean, conf)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
