#!/opt/krug/venv/bin/python
"""The Hopsworks comparison: one Keras model trained with krug, with TensorFlow's
MultiWorkerMirroredStrategy and in one plain process (bench/suite.py runs all three in turn).

    /opt/krug/venv/bin/python bench/keras_compare.py --mode plain
    krugrun -np 2 /opt/krug/venv/bin/python bench/keras_compare.py --mode krug
    /opt/krug/venv/bin/python bench/keras_compare.py --mode mwms --np 2

The model is an MLP (784-1024-1024-10, 1.86 M float32 parameters, 7.5 MB of gradients per
step) on a synthetic data set, trained with tf_keras's model.fit (Keras 2, TF_USE_LEGACY_KERAS),
SGD, the same batch per worker in every mode. krug: krug.tensorflow.keras.DistributedOptimizer,
one rank per process under krugrun. mwms: tf.distribute.MultiWorkerMirroredStrategy with RING
collectives (TensorFlow's collective all-reduce over gRPC on localhost), one worker process per
rank with TF_CONFIG, spawned here. Keras 3 is not used because Keras 3.15's model.fit fails under
MultiWorkerMirroredStrategy with two workers (its symbolic build reduces the (x, y) batch with
strategy.reduce, which MultiWorkerMirroredStrategy rejects: "Attempt to convert a value
(PerReplica...) to a Tensor"). Every process runs TensorFlow with one intra-op and one inter-op
thread (--threads).

Each process prints `Worker R of N: samples/sec X` (its own samples, so the figures of
all workers add up), timed over --epochs epochs of --steps steps after one warm-up epoch.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=("plain", "krug", "mwms"), required=True)
    p.add_argument("--np", type=int, default=2, help="workers of --mode mwms (default 2)")
    p.add_argument("--batch-size", type=int, default=64, help="per worker (default 64)")
    p.add_argument("--hidden", type=int, default=1024, help="width of the hidden layers")
    p.add_argument("--steps", type=int, default=20, help="steps per epoch (default 20)")
    p.add_argument("--epochs", type=int, default=3, help="timed epochs (default 3)")
    p.add_argument("--threads", type=int, default=1,
                   help="TensorFlow intra-op and inter-op threads per process (default 1)")
    p.add_argument("--timeout", type=int, default=600, help="seconds for the mwms workers")
    # Set by --mode mwms for the workers it spawns.
    p.add_argument("--mwms-worker", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args()


def spawn_mwms(args):
    """Starts --np workers with TF_CONFIG (ports on localhost); returns the worst exit code."""
    sys.path.insert(0, HERE)
    import pybench
    ports = [pybench.free_port() for _ in range(args.np)]
    cluster = {"worker": ["localhost:%d" % p for p in ports]}
    procs = []
    for i in range(args.np):
        env = dict(os.environ, TF_CONFIG=json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": i}}))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + sys.argv[1:] +
                                      ["--mwms-worker", str(i)], env=env))
    return pybench.wait_for_all(procs, args.timeout, "keras_compare: the mwms workers")


class EpochTimer:
    """Wall time of every epoch (a Keras callback, built lazily: Keras is imported late)."""

    def __new__(cls):
        import tf_keras as keras

        class Timer(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.seconds = []

            def on_epoch_begin(self, epoch, logs=None):
                self.t0 = time.perf_counter()

            def on_epoch_end(self, epoch, logs=None):
                self.seconds.append(time.perf_counter() - self.t0)

        return Timer()


def main():
    args = parse_args()
    if args.mode == "mwms" and args.mwms_worker is None:
        return spawn_mwms(args)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    strategy, workers, rank, callbacks = None, 1, 0, []
    if args.mode == "mwms":
        # Created first: TensorFlow requires the strategy before any other op.
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=tf.distribute.experimental.CommunicationImplementation.RING))
        workers, rank = args.np, args.mwms_worker
    elif args.mode == "krug":
        import krug.tensorflow.keras as hvd
        hvd.init()
        workers, rank = hvd.size(), hvd.rank()
        callbacks.append(hvd.callbacks.BroadcastGlobalVariablesCallback(0))
    import tf_keras as keras

    def build():
        model = keras.Sequential([
            keras.Input((784,)),
            keras.layers.Dense(args.hidden, activation="relu"),
            keras.layers.Dense(args.hidden, activation="relu"),
            keras.layers.Dense(10)])
        opt = keras.optimizers.SGD(0.01)
        if args.mode == "krug":
            opt = hvd.DistributedOptimizer(opt)
        model.compile(optimizer=opt,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    if strategy is not None:
        with strategy.scope():
            model = build()
    else:
        model = build()
    rng = np.random.default_rng(rank)
    x = rng.standard_normal((args.batch_size, 784), dtype=np.float32)
    y = rng.integers(0, 10, args.batch_size)
    # One fixed batch per worker, repeated: the input pipeline costs nothing in any mode.
    global_batch = args.batch_size * (workers if strategy is not None else 1)
    data = tf.data.Dataset.from_tensors((np.tile(x, (global_batch // args.batch_size, 1)),
                                         np.tile(y, global_batch // args.batch_size)))
    data = data.unbatch().batch(global_batch).cache().repeat()
    if strategy is not None:
        # Every worker reads the whole data set; the strategy splits each global batch.
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        data = data.with_options(options)
    timer = EpochTimer()
    model.fit(data, steps_per_epoch=args.steps, epochs=args.epochs + 1, verbose=0,
              callbacks=callbacks + [timer])
    seconds = sorted(timer.seconds[1:])  # the first epoch traces and warms up
    per_epoch = seconds[(len(seconds) - 1) // 2]
    rate = args.steps * args.batch_size / per_epoch
    print("worker %d: samples/sec per epoch: %s" % (
        rank, " ".join("%.1f" % (args.steps * args.batch_size / s) for s in timer.seconds[1:])))
    print("Worker %d of %d: samples/sec %.1f" % (rank, workers, rate), flush=True)
    if args.mode == "krug":
        hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
