#!/usr/bin/python3
"""krug.jax's broadcast_object, whose payloads travel rounded up to a power of two, beside the
same protocol sending each payload at its exact size, in the same job, on the same objects.

    krugrun -np 2 /opt/krug/venv/bin/python bench/jax_objects.py

krug.jax compiles one program per eager call signature, shapes included, so a payload of a new
size costs a compilation; rounded up, objects of many sizes share a few. Each pass broadcasts
--objects dicts that grow by --step bytes from rank 0, first in sizes not sent before (the
compilations), then the same again (cached). Rank 0 prints the mean milliseconds per call of
both ways and their ratio (below 1: rounding up is faster). Every received object is checked.
"""
import argparse
import time

import krug.jax as hvd
from krug.common import objects

# krug.jax's lengths are int32 (JAX without jax_enable_x64): the exact way sends them so too.
from krug.jax.functions import _int32


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--objects", type=int, default=20, help="objects per pass")
    p.add_argument("--step", type=int, default=7, help="bytes each object grows by")
    return p.parse_args()


def exact_size_broadcast(obj, name):
    """broadcast_object's protocol with every payload at its exact size."""
    def send(array, suffix):
        return hvd.broadcast(_int32(array), 0, name=name + suffix)

    return objects.broadcast_object(obj, 0, hvd.rank() == 0, lambda a: send(a, ".len"),
                                    lambda a: send(a, ".data"))


def one_pass(broadcast, args):
    """Mean seconds per call over --objects objects; each is checked."""
    start = time.perf_counter()
    for i in range(args.objects):
        want = {"i": i, "pad": "x" * (i * args.step)}
        got = broadcast(want if hvd.rank() == 0 else None)
        assert got == want, (i, got)
    return (time.perf_counter() - start) / args.objects


def main():
    args = parse_args()
    hvd.init()
    ways = {"rounded": lambda o: hvd.broadcast_object(o, 0, name="bench.rounded"),
            "exact": lambda o: exact_size_broadcast(o, "bench.exact")}
    if hvd.rank() == 0:
        print("%d ranks, %d objects of %d to %d bytes of padding per pass" % (
            hvd.size(), args.objects, 0, (args.objects - 1) * args.step))
        print("%-8s %12s %12s %8s" % ("pass", "rounded ms", "exact ms", "ratio"))
    # Both ways pass by pass, so that both see the same load: new sizes, then the same again.
    for label in ("new", "cached"):
        times = {way: one_pass(broadcast, args) for way, broadcast in ways.items()}
        if hvd.rank() == 0:
            print("%-8s %12.2f %12.2f %8.2f" % (label, 1e3 * times["rounded"],
                                                  1e3 * times["exact"],
                                                  times["rounded"] / times["exact"]))
    hvd.shutdown()


if __name__ == "__main__":
    main()
