"""What the synthetic benchmarks share (examples/torch_synthetic_benchmark.py,
examples/tensorflow2_synthetic_benchmark.py and their DDP peer, bench/peers/ddp_synthetic.py):
the options that fix the work of a step, and the timing loop, so that every tool's img/sec
means the same thing."""
import argparse
import timeit

import numpy as np


def benchmark_arguments(description, model, model_help):
    """A parser with the options of Horovod's synthetic benchmarks; each tool adds its own."""
    p = argparse.ArgumentParser(description=description.split("\n")[0])
    p.add_argument("--model", default=model, help=model_help)
    p.add_argument("--batch-size", type=int, default=32, help="images per rank per step")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--num-warmup-batches", type=int, default=10)
    p.add_argument("--num-batches-per-iter", type=int, default=10)
    p.add_argument("--num-iters", type=int, default=10)
    return p


def time_steps(step, args, log):
    """Runs the warm-up batches, then --num-iters timed iterations of
    --num-batches-per-iter steps; returns this rank's mean img/sec and its 1.96-sigma spread."""
    log("Running warmup...")
    timeit.timeit(step, number=args.num_warmup_batches)
    log("Running benchmark...")
    rates = []
    for i in range(args.num_iters):
        seconds = timeit.timeit(step, number=args.num_batches_per_iter)
        rates.append(args.batch_size * args.num_batches_per_iter / seconds)
        log("Iter #%d: %.1f img/sec per rank" % (i, rates[-1]))
    return float(np.mean(rates)), 1.96 * float(np.std(rates))


def log_totals(log, size, mean, conf):
    log("Img/sec per rank: %.1f +-%.1f" % (mean, conf))
    log("Total img/sec on %d rank(s): %.1f +-%.1f" % (size, size * mean, size * conf))
