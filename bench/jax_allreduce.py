#!/usr/bin/python3
"""krug.jax's jitted allreduce beside JAX's own multi-process CPU collectives (jax.distributed
with Gloo, a psum in shard_map), in the same job, on the same arrays.

    krugrun -np 2 /opt/krug/venv/bin/python bench/jax_allreduce.py

Every rank runs both, size by size and round by round in turn (--rounds), so both see the same
load. For each size rank 0 prints the median time of one allreduce (Sum, float32), the bus
bandwidth (2 (n-1)/n bytes / time) and the ratio krug/JAX of the times (below 1: krug is
faster). Each result is checked against the expected sum before it is timed.
"""
import argparse
import statistics
import sys
import time

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

import krug.jax as hvd  # noqa: E402

SIZES = {"4K": 4 << 10, "64K": 64 << 10, "1M": 1 << 20, "16M": 16 << 20, "64M": 64 << 20}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="4K,64K,1M,16M,64M", help="message sizes in bytes")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--min-seconds", type=float, default=0.3,
                   help="time of each measurement (at most 1000 calls)")
    p.add_argument("--coordinator-port", type=int, default=29517,
                   help="port of jax.distributed's coordinator on 127.0.0.1")
    return p.parse_args()


def timed(fn, x, min_seconds):
    """Median seconds per call. Every rank makes the same number of calls (both tools are
    collectives): the most any rank needs to fill min_seconds."""
    jax.block_until_ready(fn(x))
    start = time.perf_counter()
    jax.block_until_ready(fn(x))
    first = time.perf_counter() - start
    calls = int(hvd.allreduce(jnp.asarray([min(1000, max(5, int(min_seconds / first)))]),
                              op=hvd.Max, name="bench.calls")[0])
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        jax.block_until_ready(fn(x))
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def slowest(seconds):
    return float(hvd.allreduce(jnp.asarray([seconds]), op=hvd.Max, name="bench.max")[0])


def main():
    args = parse_args()
    hvd.init()
    n, me = hvd.size(), hvd.rank()
    jax.distributed.initialize("127.0.0.1:%d" % args.coordinator_port, num_processes=n,
                               process_id=me)
    mesh = jax.make_mesh((n,), ("ranks",))
    spread = NamedSharding(mesh, PartitionSpec("ranks"))
    jax_sum = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, "ranks"), mesh=mesh,
                                    in_specs=PartitionSpec("ranks"),
                                    out_specs=PartitionSpec("ranks")))
    krug_sum = jax.jit(lambda x: hvd.allreduce(x, op=hvd.Sum, name="bench.allreduce"))
    want = n * (n + 1) / 2
    rows = []
    for label in args.sizes.split(","):
        count = SIZES[label] // 4
        mine = np.full(count, me + 1, np.float32)
        local = jax.device_put(mine, jax.local_devices()[0])
        spread_x = jax.make_array_from_process_local_data(spread, mine)
        np.testing.assert_array_equal(np.asarray(krug_sum(local)), want)
        np.testing.assert_array_equal(
            np.asarray(jax_sum(spread_x).addressable_shards[0].data), want)
        times = {"krug": [], "jax": []}
        for _ in range(args.rounds):
            times["krug"].append(slowest(timed(krug_sum, local, args.min_seconds)))
            times["jax"].append(slowest(timed(jax_sum, spread_x, args.min_seconds)))
        krug_t, jax_t = statistics.median(times["krug"]), statistics.median(times["jax"])
        rows.append((label, krug_t, jax_t, SIZES[label]))
    if me == 0:
        print("allreduce, Sum, float32, %d ranks, median of %d rounds; busbw = 2(n-1)/n bytes / "
              "time" % (n, args.rounds))
        print("%6s %12s %12s %12s %12s %10s" % ("size", "krug us", "jax us", "krug GB/s",
                                                "jax GB/s", "krug/jax"))
        for label, kt, jt, size in rows:
            bus = 2.0 * (n - 1) / n * size / 1e9
            print("%6s %12.1f %12.1f %12.2f %12.2f %10.2f" % (label, kt * 1e6, jt * 1e6,
                                                              bus / kt, bus / jt, kt / jt))
    jax.distributed.shutdown()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
