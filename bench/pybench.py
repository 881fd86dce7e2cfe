"""Pieces shared by the Python benchmarks of the suite (krug_small_ops.py, peers/*.py).

The timing loop and the output lines are those of the C++ tools (bench/common/bench_util.h,
bench/krug-bench.cc), so that every tool's columns mean the same thing and scripts/bench-suite
parses them alike.
"""
import argparse
import os
import re
import socket
import time

_SIZE = re.compile(r"^(\d+)([KMG]?)(I?B)?$", re.IGNORECASE)


def parse_size(text):
    """'4', '64K', '256M', '1G': binary multiples."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError("'%s' is not a size (e.g. 4, 64K, 256M)" % text)
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]


def sizes(min_bytes, max_bytes, factor=2):
    b = min_bytes
    while b <= max_bytes:
        yield b
        if b > max_bytes // factor:
            break
        b *= factor


def time_operation(once, slowest, barrier, iters=None, warmup=1, target_seconds=0.2,
                   min_iters=3, max_iters=1_000_000):
    """krug-bench's timing: warm up, estimate, ~target_seconds of operations, slowest rank.

    Returns (iterations, seconds per operation of the slowest rank). `slowest(v)` is the
    maximum of v over the ranks; every rank calls it the same number of times.
    """
    for _ in range(warmup):
        once()
    estimate = 0.0
    if iters is None:
        t0 = time.perf_counter()
        once()
        estimate = slowest(time.perf_counter() - t0)
        if estimate < 0.01:  # one short operation is mostly noise: estimate from ~20 ms
            batch = min(max_iters // 10, max(2, int(0.02 / max(estimate, 1e-6))))
            t0 = time.perf_counter()
            for _ in range(batch):
                once()
            estimate = slowest((time.perf_counter() - t0) / batch)
        iters = min(max_iters, max(min_iters, round(target_seconds / max(estimate, 1e-9))))
    barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        once()
    return iters, slowest((time.perf_counter() - t0) / iters)


def load_tensor_list(path):
    """(name, shape) of every line of a gradient list, in reverse file order (backward's)."""
    tensors = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip() or line.startswith("#"):
                continue
            fields = line.split()
            if len(fields) != 2:
                raise ValueError("%s:%d: expected 'name shape'" % (path, lineno))
            tensors.append((fields[0], tuple(int(d) for d in fields[1].split("x"))))
    if not tensors:
        raise ValueError("the tensor list '%s' names no tensor" % path)
    return list(reversed(tensors))


def step_tensors(args):
    """The step's tensors from --shapes, or --tensors x --tensor-bytes: [(name, shape)]."""
    if args.shapes:
        tensors = load_tensor_list(args.shapes)
        return tensors, "%s (%d tensors)" % (args.shapes, len(tensors))
    n = max(1, parse_size(args.tensor_bytes) // 4)
    return ([("step.%d" % i, (n,)) for i in range(args.tensors)],
            "%d x %s" % (args.tensors, human_bytes(parse_size(args.tensor_bytes))))


_STEP = re.compile(r"^(\d+)x(\d+[KMG]?(?:I?B)?)$", re.IGNORECASE)


def step_list(args):
    """The steps to measure: [args] itself, or with --steps one copy of args per item, with its
    --tensors and --tensor-bytes (NxSIZE) or --shapes (anything else: a gradient list)."""
    if not args.steps:
        return [args]
    steps = []
    for item in args.steps.split(","):
        step = argparse.Namespace(**vars(args))
        m = _STEP.match(item)
        if m:
            step.tensors, step.tensor_bytes, step.shapes = int(m.group(1)), m.group(2), None
        else:
            step.shapes = item
        steps.append(step)
    return steps


def human_bytes(b):
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if b >= (1 << shift) and b % (1 << shift) == 0:
            return "%d %s" % (b >> shift, unit)
    return "%d B" % b


def now_string():
    return time.strftime("%Y-%m-%d %H:%M:%S %Z")


def print_sweep_header(tool, collective, ranks, extra=""):
    print("# %s %s: %d ranks, dtype float32%s, %s, host %s%s"
          % (tool, collective, ranks, ", op sum" if collective == "allreduce" else "",
             now_string(), socket.gethostname(), extra))
    print("# time: average per operation of the slowest rank; GB/s = 1e9 bytes/s")
    print("# %12s %12s %9s %8s %5s %6s %12s %12s %12s %8s"
          % ("size(B)", "count", "type", "redop", "root", "iters", "time(us)", "algbw(GB/s)",
             "busbw(GB/s)", "#wrong"), flush=True)


BUS_FACTOR = {
    "allreduce": lambda n: 2.0 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}


def print_sweep_row(collective, ranks, nbytes, iters, seconds, wrong):
    algbw = nbytes / seconds / 1e9
    print("  %12d %12d %9s %8s %5d %6d %12.3f %12.3f %12.3f %8d"
          % (nbytes, nbytes // 4, "float32", "sum" if collective == "allreduce" else "none",
             0 if collective == "broadcast" else -1, iters, seconds * 1e6, algbw,
             algbw * BUS_FACTOR[collective](ranks), wrong), flush=True)


def print_step_header(tool, what, ranks, how):
    print("# %s: step of %s, %d ranks, float32 sum, %s" % (tool, what, ranks, now_string()))
    print("# %s; time: average per step of the slowest rank" % how)
    print("# %10s %14s %8s %14s %8s" % ("tensors", "bytes", "iters", "time(us)", "#wrong"),
          flush=True)


def print_step_row(tensors, nbytes, iters, seconds, wrong):
    print("  %10d %14d %8d %14.3f %8d" % (tensors, nbytes, iters, seconds * 1e6, wrong),
          flush=True)


def hard_exit(code):
    """Leaves without running interpreter teardown (torch 1.13's gloo teardown can hang)."""
    import sys
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(script, argv, nranks, timeout, extra_env=None):
    """Runs `python3 script argv` as ranks 0..n-1 with torch.distributed's env rendezvous
    (MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE). Returns the worst exit code; on a failure or
    after `timeout` seconds every rank still running is killed, so no rank is left behind."""
    import subprocess
    import sys
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(nranks), OMP_NUM_THREADS="1", **(extra_env or {}))
    procs = [subprocess.Popen([sys.executable, script] + list(argv),
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
             for r in range(nranks)]
    return wait_for_all(procs, timeout, os.path.basename(script))


def wait_for_all(procs, timeout, what):
    """Waits for every process; returns the worst exit code. On the first failure, or after
    `timeout` seconds (exit code 124), every process still running is killed, so none is left
    behind (a peer of a failed one would wait for it until its own timeout)."""
    import sys
    deadline = time.monotonic() + timeout
    worst = 0
    try:
        pending = list(procs)
        while pending:
            for p in list(pending):
                rc = p.poll()
                if rc is None:
                    continue
                pending.remove(p)
                worst = worst or rc
            if worst:
                break
            if time.monotonic() > deadline:
                print("%s: timed out after %d s" % (what, timeout), file=sys.stderr)
                worst = 124
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    return worst


def add_step_arguments(p, tensors, tensor_bytes):
    """The step options of krug_small_ops.py and tf_small_ops.py (krug-step's)."""
    p.add_argument("--tensors", type=int, default=tensors)
    p.add_argument("--tensor-bytes", default=tensor_bytes)
    p.add_argument("--shapes", default=None, help="a gradient list (bench/resnet50_gradients.txt)")
    p.add_argument("--steps", default=None,
                   help="several steps measured in turn in this one process, a row each: "
                        "comma-separated NxSIZE (N tensors of SIZE bytes) or gradient lists, "
                        "e.g. 1x4K,100x1K,bench/resnet50_gradients.txt (instead of --tensors, "
                        "--tensor-bytes, --shapes)")
    p.add_argument("--iters", type=int, default=None)
    p.add_argument("--target-seconds", type=float, default=0.5)
