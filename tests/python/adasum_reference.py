#!/usr/bin/python3
"""NumPy reference for krug's Adasum allreduce, and a check of the real thing against it.

The reference applies the Adasum rule of Maleki et al. (2020),

    Adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b    (a zero vector: weight 1)

as a binary tree over 2^k ranks (level l combines blocks of 2^l ranks pairwise, the lower block
as `a`), per tensor, in float64 on whole vectors.

Run as a script it launches `krugrun -np N krug_test_worker adasum`, parses the results every
rank prints ("ADASUM <dtype> <tensor> <count> <values...>"), and compares them with the
reference computed from the same closed-form inputs:

    /usr/bin/python3 tests/python/adasum_reference.py --krugrun build/krugrun \
        --worker build/tests/multiproc/krug_test_worker --np 4

(--mpi starts the ranks with `krugrun --mpi`, so Adasum runs over the MPI data plane.)

With a number of ranks that is not a power of two every rank must report the clear error.
Exit status 0 when everything matches. Under pytest, the test_* functions check the reference
itself, and test_against_krugrun runs the check when KRUGRUN and KRUG_TEST_WORKER are set.
"""
import argparse
import os
import re
import subprocess
import sys

import numpy as np

# Relative tolerance per dtype, to the largest magnitude of the expected tensor. The C++ rounds
# every level's result to the dtype; the reference does not.
TOLERANCE = {"float64": 1e-12, "float32": 2e-6, "float16": 8e-3, "bfloat16": 6e-2}

F32_COUNTS = [5, 1000, 1, 77]  # tensors 0..3, one fused group of float32
OTHER_COUNT = 300              # tensor 4, once per float64 / float16 / bfloat16


def adasum_pair(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    dot = float(np.dot(a, b))
    anorm2 = float(np.dot(a, a))
    bnorm2 = float(np.dot(b, b))
    ca = 1.0 - dot / (2.0 * anorm2) if anorm2 > 0 else 1.0
    cb = 1.0 - dot / (2.0 * bnorm2) if bnorm2 > 0 else 1.0
    return ca * a + cb * b


def adasum_reference(per_rank):
    """per_rank: one 1-D array per rank (a power-of-two count). Returns the Adasum of them."""
    vectors = [np.asarray(v, dtype=np.float64) for v in per_rank]
    n = len(vectors)
    if n & (n - 1):
        raise ValueError("Adasum needs a power-of-two number of ranks (got %d)" % n)
    d = 1
    while d < n:
        for r in range(0, n, 2 * d):
            vectors[r] = adasum_pair(vectors[r], vectors[r + d])
        d *= 2
    return vectors[0]


def worker_input(rank, tensor, count):
    """The closed form krug_test_worker's adasum scenario uses (exact in every float dtype)."""
    i = np.arange(count, dtype=np.int64)
    return ((7 * i + 13 * tensor) % 17 - 8) / 8.0 + ((i * (rank + 3) + tensor) % 11 - 5) / 16.0


def expected_results(np_):
    expected = {}
    for t, count in enumerate(F32_COUNTS):
        inputs = [worker_input(r, t, count).astype(np.float32) for r in range(np_)]
        expected[("float32", t)] = adasum_reference(inputs)
    for dtype in ("float64", "float16", "bfloat16"):
        # Inputs are multiples of 1/16 below 2 in magnitude: exact in all of these.
        expected[(dtype, 4)] = adasum_reference(
            [worker_input(r, 4, OTHER_COUNT) for r in range(np_)])
    return expected


LINE = re.compile(r"^\[(\d+)\]<stdout>:ADASUM (\w+) (\d+) (\d+)((?: \S+)*)$")


def parse(output):
    """{rank: {(dtype, tensor): np.array}} from krugrun's prefixed output."""
    results = {}
    for line in output.splitlines():
        m = LINE.match(line.strip())
        if not m:
            continue
        rank, dtype, tensor, count = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
        values = np.array([float(x) for x in m.group(5).split()], dtype=np.float64)
        if len(values) != count:
            raise ValueError("rank %d %s tensor %d: %d values, expected %d"
                             % (rank, dtype, tensor, len(values), count))
        results.setdefault(rank, {})[(dtype, tensor)] = values
    return results


def compare(results, np_):
    """Returns a list of problems (empty when every rank matches the reference)."""
    problems = []
    expected = expected_results(np_)
    if sorted(results) != list(range(np_)):
        return ["ranks that printed results: %s, expected 0..%d" % (sorted(results), np_ - 1)]
    for rank in range(np_):
        for key, want in expected.items():
            got = results[rank].get(key)
            if got is None:
                problems.append("rank %d printed no %s tensor %d" % (rank, key[0], key[1]))
                continue
            scale = max(float(np.max(np.abs(want))), 1e-30)
            err = float(np.max(np.abs(got - want))) / scale
            if err > TOLERANCE[key[0]]:
                worst = int(np.argmax(np.abs(got - want)))
                problems.append("rank %d %s tensor %d: relative error %.3g > %.3g (element %d: "
                                "got %r, expected %r)" % (rank, key[0], key[1], err,
                                                          TOLERANCE[key[0]], worst, got[worst],
                                                          want[worst]))
        if rank > 0 and any(not np.array_equal(results[rank][k], results[0][k])
                            for k in expected if k in results[rank] and k in results[0]):
            problems.append("rank %d's results are not bitwise equal to rank 0's" % rank)
    return problems


def run_and_check(krugrun, worker, np_, timeout=120, mpi=False):
    launch = [krugrun] + (["--mpi"] if mpi else [])
    proc = subprocess.run(launch + ["-np", str(np_), worker, "adasum"], capture_output=True,
                          text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    if np_ & (np_ - 1):
        want = "Adasum needs a power-of-two number of ranks (process set 0 has %d)" % np_
        problems = [] if proc.returncode == 0 else ["krugrun exited %d" % proc.returncode]
        for rank in range(np_):
            if not re.search(r"^\[%d\]<stdout>:ADASUM-ERROR .*%s" % (rank, re.escape(want)),
                             output, re.M):
                problems.append("rank %d did not report '%s'" % (rank, want))
        return problems, output
    if proc.returncode != 0:
        return ["krugrun exited %d" % proc.returncode], output
    return compare(parse(proc.stdout), np_), output


# ---- pytest: the reference itself

def test_orthogonal_vectors_add():
    a, b = np.array([1.0, 0.0]), np.array([0.0, 2.0])
    np.testing.assert_allclose(adasum_reference([a, b]), [1.0, 2.0])


def test_identical_vectors_stay():
    v = np.array([3.0, -1.0, 2.0])
    np.testing.assert_allclose(adasum_reference([v, v, v, v]), v)


def test_zero_vectors():
    v = np.array([3.0, -1.0])
    z = np.zeros(2)
    np.testing.assert_allclose(adasum_reference([z, v]), v)
    np.testing.assert_allclose(adasum_reference([z, z]), z)


def test_against_krugrun():
    krugrun, worker = os.environ.get("KRUGRUN"), os.environ.get("KRUG_TEST_WORKER")
    if not krugrun or not worker:
        import pytest
        pytest.skip("set KRUGRUN and KRUG_TEST_WORKER to the built binaries")
    for np_ in (2, 4, 3):
        problems, output = run_and_check(krugrun, worker, np_)
        assert not problems, "\n".join(problems) + "\n" + output


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--krugrun", required=True)
    parser.add_argument("--worker", required=True)
    parser.add_argument("--mpi", action="store_true",
                        help="start the ranks with krugrun --mpi (the MPI data plane)")
    parser.add_argument("--np", type=int, action="append", required=True,
                        help="number of ranks (repeat for several runs)")
    args = parser.parse_args()
    failed = False
    for np_ in args.np:
        problems, output = run_and_check(args.krugrun, args.worker, np_, mpi=args.mpi)
        if problems:
            failed = True
            print("adasum with %d ranks: FAILED\n  %s\n--- output ---\n%s"
                  % (np_, "\n  ".join(problems), output))
        else:
            print("adasum with %d ranks: matches the NumPy reference" % np_)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
