#!/usr/bin/python3
"""krug next to its peers, on the same sizes in the same run (scripts/bench-suite runs this).

Runs, for each rank count: krug-bench, mpi_bench (Open MPI) and torch_gloo_bench (torch's
Gloo) over the same sweep of sizes for allreduce, allgather and broadcast; the small-message
measures (one 4 KiB allreduce, a step of 100 x 1 KiB, a step of ResNet-50's 161 gradients)
through krug's C++ and Python APIs, MPI and Gloo; the machine's memcpy and reduction bandwidth;
training throughput (examples/torch_synthetic_benchmark.py against DDP and one plain
process, with one thread per rank and with as many threads as cores); and TensorFlow (issue
19): allreduce from eager TensorFlow against krug.torch (bench/tf_small_ops.py,
bench/krug_small_ops.py) and a Keras model trained with krug, with
MultiWorkerMirroredStrategy and in one plain process (bench/keras_compare.py). With --horovod
(issue 30), Horovod 0.28.1 with its Gloo and with its MPI controller runs the krug.torch
scripts (the allreduce sweep, the small-message steps, the training example) beside krug.torch.

Every measure runs on an idle machine and under a fixed competing load that the suite starts
and stops around each run (--load; one busy process per core), in interleaved rounds: each
round runs every tool once under every load, and each figure is the median of its rounds.
Prints the tables side by side, a PASS/FAIL line per target of issues 6, 19 and 30 and per
peer (krug >= every peer), and writes results.json, every tool's raw output and a plot of bus
bandwidth against size.
"""
import argparse
import datetime
import json
import os
import platform
import re
import statistics
import shlex
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import pybench  # noqa: E402

# The ranks' interpreter: the one krug.torch was built for (scripts/bench-suite sets it), else
# Debian's, the one with python3-torch.
PYTHON = os.environ.get("KRUG_PYTHON") or "/usr/bin/python3"
DOCS_BEGIN = "<!-- bench-suite results: begin (written by scripts/bench-suite --update-docs) -->"
DOCS_END = "<!-- bench-suite results: end -->"
TOOLS = ("krug", "mpi", "gloo")
TOOL_TITLE = {"krug": "krug", "mpi": "Open MPI", "gloo": "torch Gloo",
              "krug_py": "krug.torch", "hvd_gloo": "Horovod Gloo", "hvd_mpi": "Horovod MPI"}
# Horovod's two controllers (issue 30): each with its own data plane for CPU tensors.
HOROVOD = (("hvd_gloo", "gloo"), ("hvd_mpi", "mpi"))
HOROVOD_VERSION = "0.28.1"
LOADS = ("idle", "loaded")
TRAIN_MODEL = ["--model", "resnet18", "--batch-size", "16", "--image-size", "64",
               "--threads", "1"]
# The TensorFlow comparison's allreduce sizes (one tensor each, TF eager against krug.torch).
TF_OP_SIZES = ["4K", "64K", "1M", "16M", "64M"]


def parse_args(argv=None):
    """The suite's options from argv (default sys.argv; bench/scaling.py passes its own)."""
    p = argparse.ArgumentParser(
        prog="scripts/bench-suite", description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Presets: --quick (factor 4 up to 256M, one round, shorter training), "
               "--smoke (allreduce up to 64K, no Python small ops but Horovod's, no training: "
               "checks that everything runs). The defaults aim to fit the whole suite, idle "
               "and loaded, in 25 minutes on 2 cores (issue 30); the summary ends with the "
               "time it took.")
    p.add_argument("--build-dir", default=os.path.join(ROOT, "build"),
                   help="where krugrun and build/bench/* are (default build/)")
    p.add_argument("--out", default=None,
                   help="results folder (default bench-results/<date>-<time>)")
    p.add_argument("--np", default="2",
                   help='rank counts, e.g. "2 4" (default 2: 4 ranks on 2 cores are '
                        'oversubscribed and have no targets)')
    p.add_argument("--ops", default="allreduce allgather broadcast",
                   help="collectives of the sweep (default all three)")
    p.add_argument("--min-bytes", default="4", help="smallest size (default 4)")
    p.add_argument("--max-bytes", default="256M", help="largest size (default 256M)")
    p.add_argument("--factor", type=int, default=None,
                   help="size step of every sweep (default 2 for krug-bench's allreduce, 4 "
                        "for allgather, broadcast and the Python API's allreduce)")
    p.add_argument("--target-seconds", type=float, default=0.1,
                   help="timed seconds per size and tool (default 0.1)")
    p.add_argument("--step-seconds", type=float, default=0.25,
                   help="timed seconds per small-op measure (default 0.25)")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds of the sweeps and small-op measures, the tools interleaved; "
                        "each figure is the median of its rounds (default 3)")
    p.add_argument("--train-iters", type=int, default=3,
                   help="timed iterations of 3 steps per training run, after 2 warm-up steps "
                        "(default 3)")
    p.add_argument("--train-ceilings", action="store_true",
                   help="also train two plain processes at once, two ranks in lock-step, and "
                        "1 rank of krug and DDP (the ceiling of synchronous training here)")
    p.add_argument("--train-rounds", type=int, default=3,
                   help="rounds of the training runs, interleaved; each figure is the median "
                        "of its rounds (default 3)")
    p.add_argument("--load", default="idle,loaded",
                   help="machine states to measure every row in, comma-separated: idle, loaded "
                        "(a competing load the suite starts and stops around every run: "
                        "--load-procs busy processes at normal priority); default both, "
                        "interleaved round by round")
    p.add_argument("--load-procs", type=int, default=os.cpu_count() or 1,
                   help="busy processes of the loaded runs (default one per core: %d)"
                        % (os.cpu_count() or 1))
    p.add_argument("--horovod", action="store_true",
                   help="Horovod %s as a peer of krug.torch, with its Gloo and its MPI "
                        "controller (scripts/bench-suite builds it once: scripts/install-horovod)"
                        % HOROVOD_VERSION)
    p.add_argument("--horovod-python",
                   default=os.environ.get("KRUG_HOROVOD_PYTHON") or
                   os.path.join(os.environ.get("KRUG_HOROVOD_VENV") or "/opt/krug/horovod-venv",
                                "bin", "python"),
                   help="Horovod's interpreter (default /opt/krug/horovod-venv/bin/python)")
    p.add_argument("--no-train", action="store_true", help="skip training throughput")
    p.add_argument("--no-python-ops", action="store_true",
                   help="skip the Python-API small ops (krug.torch, Gloo)")
    p.add_argument("--tensorflow", action="store_true",
                   help="also the TensorFlow comparison (eager allreduce, Keras training; "
                        "about 15 min idle and loaded)")
    p.add_argument("--no-tensorflow", action="store_true",
                   help="no TensorFlow comparison (the default without --tensorflow)")
    p.add_argument("--tensorflow-only", action="store_true",
                   help="only the TensorFlow comparison (no sweeps, small ops, torch training)")
    p.add_argument("--quick", action="store_true", help="the quick preset (see below)")
    p.add_argument("--smoke", action="store_true", help="the smoke preset (see below)")
    p.add_argument("--update-docs", action="store_true",
                   help="write the results section of docs/benchmarks.md and its plot")
    p.add_argument("--timeout", type=int, default=900, help="seconds per tool run")
    args = p.parse_args(argv)
    args.no_tensorflow = args.no_tensorflow or not args.tensorflow
    if args.quick:
        args.np, args.factor, args.train_iters, args.train_rounds = "2", 4, 2, 1
        args.rounds = 1
    if args.smoke:
        args.np, args.ops, args.max_bytes, args.factor = "2", "allreduce", "64K", 4
        args.target_seconds, args.step_seconds, args.rounds = 0.02, 0.05, 1
        args.no_train = args.no_tensorflow = True
        # The Python small ops only where they are Horovod's path (one 4 KiB allreduce).
        args.no_python_ops = not args.horovod
    if args.tensorflow_only:
        args.no_train, args.no_tensorflow = True, False
    args.nps = [int(n) for n in args.np.split()]
    args.train_nps = (1, 2) if args.train_ceilings else (2,)
    args.loads = [x for x in args.load.replace(",", " ").split()]
    for x in args.loads:
        if x not in LOADS:
            p.error("unknown load '%s' (idle, loaded)" % x)
    if not args.loads or len(set(args.loads)) != len(args.loads):
        p.error("--load: idle, loaded or both, each once")
    args.ops = args.ops.split()
    for op in args.ops:
        if op not in pybench.BUS_FACTOR:
            p.error("unknown op '%s' (allreduce, allgather, broadcast)" % op)
    if args.out is None:
        args.out = os.path.join(ROOT, "bench-results",
                                datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    return args


# ---- running the tools ------------------------------------------------------------------------

class Load:
    """The competing load of the loaded runs: `procs` processes that never sleep (a shell loop),
    at the suite's own priority (normal, unless the suite was started under nice), started just
    before a run and ended just after it, so that the idle runs in between find the cores free
    and nothing of the load outlives the suite."""

    def __init__(self, procs):
        self.n = procs
        self.procs = []

    def start(self):
        self.stop()
        self.procs = [subprocess.Popen(["/bin/sh", "-c", "while :; do :; done"],
                                       stdin=subprocess.DEVNULL) for _ in range(self.n)]

    def stop(self):
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()
        self.procs = []


class Runner:
    """Runs each tool with a deadline, keeps its raw output under <out>/raw/."""

    def __init__(self, args):
        self.args = args
        self.raw = os.path.join(args.out, "raw")
        os.makedirs(self.raw, exist_ok=True)
        self.errors = []
        self.load = Load(args.load_procs)
        # Horovod's interpreter and launcher (--horovod): horovodrun of the same environment.
        self.hvd_python = args.horovod_python
        self.horovodrun = os.path.join(os.path.dirname(self.hvd_python), "horovodrun")
        self.have_horovod = args.horovod and os.access(self.horovodrun, os.X_OK) and \
            subprocess.run([self.hvd_python, "-c", "import horovod.torch"],
                           capture_output=True).returncode == 0
        b = args.build_dir
        self.krugrun = os.path.join(b, "krugrun")
        self.bin = {name: os.path.join(b, "bench", name)
                    for name in ("krug-bench", "krug-step", "machine_limits", "mpi_bench")}
        self.mpirun = shutil.which("mpirun")
        self.have_mpi = self.mpirun is not None and os.access(self.bin["mpi_bench"], os.X_OK)
        self.have_torch = subprocess.run([PYTHON, "-c", "import torch.distributed"],
                                         capture_output=True).returncode == 0
        self.have_krug_torch = os.path.isdir(os.path.join(b, "python", "krug", "torch"))
        # TensorFlow runs in the ranks' interpreter when it has TensorFlow (the project's
        # environment), else in KRUG_TF_PYTHON (default that environment's).
        self.tf_python = None
        for py in [] if args.no_tensorflow else \
                (PYTHON, os.environ.get("KRUG_TF_PYTHON") or "/opt/krug/venv/bin/python"):
            if os.access(py, os.X_OK) and subprocess.run(
                    [py, "-c", "import tensorflow, tf_keras"], capture_output=True,
                    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")).returncode == 0:
                self.tf_python = py
                break
        self.have_krug_tf = self.tf_python is not None and os.path.isdir(
            os.path.join(b, "python", "krug", "tensorflow"))

    def run(self, tag, cmd, env=None, load="idle"):
        """Returns the tool's stdout, or None when it failed (the failure is recorded). Under
        load "loaded" the competing load runs for exactly as long as the tool does."""
        if load != "idle":
            tag += "." + load
        log = os.path.join(self.raw, tag + ".txt")
        print("  running %s" % tag, file=sys.stderr, flush=True)
        if load == "loaded":
            self.load.start()
        try:
                return self._run(tag, cmd, env, log, load)
        finally:
            self.load.stop()

    def _run(self, tag, cmd, env, log, load):
        t0 = time.monotonic()
        # Its own session, so that a run that overstays is ended with all of its ranks.
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, **(env or {})), cwd=ROOT,
                             start_new_session=True)
        try:
            out, err = p.communicate(timeout=self.args.timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            end_group(p)
            try:
                out, err = p.communicate(timeout=30)
            except subprocess.TimeoutExpired:  # a rank outside the group still holds a pipe
                out, err = "", ""
            err += "\ntimed out after %d s" % self.args.timeout
            rc = 124
        except BaseException:
            end_group(p)
            raise
        with open(log, "w") as f:
            f.write("$ %s\n%s%s\n# stderr:\n%s# exit %d, %.1f s\n"
                    % (" ".join(cmd), "# competing load: %d busy processes\n" % self.load.n
                       if load == "loaded" else "", out, err, rc, time.monotonic() - t0))
        if rc != 0:
            self.errors.append("%s: exit %d (see %s): %s" % (tag, rc, log, err.strip()[-300:]))
            return None
        return out

    def parsed(self, tag, cmd, parse, load="idle"):
        """Runs a tool and parses its table; a run that prints no row is a failure too."""
        out = self.run(tag, cmd, load=load)
        if out is None:
            return None
        rows = parse(untagged(out))
        if not rows:
            self.errors.append("%s: printed no result row (see %s)" % (tag, os.path.join(
                self.raw, tag + ("" if load == "idle" else "." + load) + ".txt")))
        return rows

    def krug(self, np_, prog, *argv):
        return [self.krugrun, "-np", str(np_), "--no-prefix", prog] + list(argv)

    def mpi(self, np_, *argv):
        cmd = [self.mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(np_)]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        return cmd + [self.bin["mpi_bench"]] + list(argv)

    def gloo(self, np_, *argv):
        return [PYTHON, os.path.join(HERE, "peers", "torch_gloo_bench.py"), "--np", str(np_)] + \
            list(argv)

    def horovod(self, controller, np_, script, *argv):
        """A krug.torch script run by Horovod (bench/peers/as_horovod.py) under horovodrun with
        the given controller, Horovod's CPU operations of the same kind, and its other knobs at
        their defaults."""
        return ["env", "HOROVOD_CONTROLLER=" + controller, "HOROVOD_CPU_OPERATIONS=" + controller,
                self.horovodrun, "-np", str(np_), "--" + controller, self.hvd_python,
                os.path.join(HERE, "peers", "as_horovod.py"), script] + list(argv)


def end_group(p):
    """SIGTERM to the run's process group (krugrun and mpirun pass it to their ranks), then
    SIGKILL to whatever is left of it."""
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, None)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=wait)
            if sig == signal.SIGTERM:
                os.killpg(p.pid, signal.SIGKILL)  # ranks that outlived their launcher
        except (subprocess.TimeoutExpired, ProcessLookupError):
            pass


_OUTPUT_TAG = re.compile(r"\[\d+(?:,\d+)?\]<std(?:out|err)>:")


def untagged(text):
    """The output without the rank tags horovodrun puts before every line ("[0]<stdout>:" with
    Gloo, "[1,0]<stdout>:" from mpirun --tag-output, which now and then lands at the end of the
    line before instead)."""
    return _OUTPUT_TAG.sub("", text or "")


def parse_rows(text, nfields):
    """The numeric rows (not '#' lines) of a table with nfields columns."""
    rows = []
    for line in (text or "").splitlines():
        f = line.split()
        if len(f) == nfields and not line.lstrip().startswith("#") and f[0].isdigit():
            rows.append(f)
    return rows


def sweep_rows(text):
    return [{"bytes": int(f[0]), "iters": int(f[5]), "time_us": float(f[6]),
             "algbw": float(f[7]), "busbw": float(f[8]), "wrong": int(f[9]) if f[9].isdigit()
             else None} for f in parse_rows(text, 10)]


def step_rows(text):
    """The last row of a step tool's table, as a list of one (or none)."""
    return all_step_rows(text)[-1:]  # an empty list: parsed() reports it


def all_step_rows(text):
    """Every row of a step tool's table (tf_small_ops.py --sizes prints one per size)."""
    return [{"tensors": int(f[0]), "bytes": int(f[1]), "iters": int(f[2]),
             "time_us": float(f[3]), "wrong": int(f[4])} for f in parse_rows(text, 5)]


def median_rows(rounds):
    """One row per size from the rows of every round: the round with the median time (its
    other fields with it), and every round's time under "rounds_us"."""
    by_size = {}
    for rows in rounds:
        for row in rows or []:
            by_size.setdefault(row["bytes"], []).append(row)
    out = []
    for size in sorted(by_size):
        rows = sorted(by_size[size], key=lambda row: row["time_us"])
        row = dict(rows[(len(rows) - 1) // 2])
        row["rounds_us"] = [x["time_us"] for x in by_size[size]]
        out.append(row)
    return out or None


def interleaved(r, args, tools, rounds=None, combine=median_rows):
    """tools: [(key, tag, cmd, parse)]. Every round runs every tool once under every load of
    --load (idle, then loaded), rounds interleaved, so that a slow spell of this shared machine
    hits the peers alike; {load: {key: combine(the parsed results of its rounds)}}."""
    results = {load: {key: [] for key, _, _, _ in tools} for load in args.loads}
    n = max(1, rounds or args.rounds)
    for i in range(n):
        for load in args.loads:
            for key, tag, cmd, parse in tools:
                got = r.parsed(tag if n == 1 else "%s.r%d" % (tag, i + 1), cmd, parse, load)
                if got:
                    results[load][key].append(got)
    return {load: {key: combine(v) for key, v in res.items()} for load, res in results.items()}


def sweep_sizes(args, fine):
    """The size options of a sweep: by default every factor 2 where fine (krug-bench's
    allreduce, which the targets read), every factor 4 elsewhere (the other collectives and the
    Python API's allreduce beside Horovod: 4 B, 16 B, ..., 256 MiB; half the time)."""
    return ["--min-bytes", args.min_bytes, "--max-bytes", args.max_bytes,
            "--factor", str(args.factor or (2 if fine else 4)),
            "--target-seconds", str(args.target_seconds)]


def run_sweeps(r, args, np_):
    """{load: {op: {tool: median rows}}}."""
    result = {load: {} for load in args.loads}
    for op in args.ops:
        sizes = sweep_sizes(args, op == "allreduce")
        tools = [("krug", "krug-bench.%s.np%d" % (op, np_),
                  r.krug(np_, r.bin["krug-bench"], op, *sizes), sweep_rows)]
        if r.have_mpi:
            tools.append(("mpi", "mpi_bench.%s.np%d" % (op, np_), r.mpi(np_, op, *sizes),
                          sweep_rows))
        if r.have_torch:
            tools.append(("gloo", "torch_gloo_bench.%s.np%d" % (op, np_), r.gloo(np_, op, *sizes),
                          sweep_rows))
        for load, res in interleaved(r, args, tools).items():
            recompute_bw(res, op, np_)
            result.setdefault(load, {})[op] = res
    return result


def recompute_bw(res, op, np_):
    """The tools print 3 decimals; recompute from the time so small sizes keep their value."""
    for rows in res.values():
        for row in [r for r in rows or [] if r["time_us"] > 0]:
            row["algbw"] = row["bytes"] / row["time_us"] / 1e3
            row["busbw"] = row["algbw"] * pybench.BUS_FACTOR[op](np_)


def run_horovod_sweep(r, args, np_):
    """The allreduce sweep through the Python API: bench/krug_torch_sweep.py under krugrun and
    the same script under Horovod with each controller; {load: {tool: median rows}}."""
    script = os.path.join(HERE, "krug_torch_sweep.py")
    sizes = sweep_sizes(args, False)
    tools = [("krug_py", "krug_torch_sweep.allreduce.np%d" % np_,
              r.krug(np_, PYTHON, script, *sizes), sweep_rows)]
    tools += [(key, "horovod_%s_sweep.allreduce.np%d" % (ctl, np_),
               r.horovod(ctl, np_, script, *sizes), sweep_rows) for key, ctl in HOROVOD]
    res = interleaved(r, args, tools)
    for v in res.values():
        recompute_bw(v, "allreduce", np_)
    return res


SMALL_MEASURES = [
    ("op_4k", "one 4 KiB allreduce", ["--tensors", "1", "--tensor-bytes", "4K"]),
    ("step_100x1k", "step of 100 x 1 KiB", ["--tensors", "100", "--tensor-bytes", "1K"]),
    ("step_resnet50", "step of ResNet-50's 161 gradients (97.5 MiB)",
     ["--shapes", os.path.join(HERE, "resnet50_gradients.txt")]),
]
# One synchronous allreduce at each of these sizes (issue 30, item 3): krug's C++ API
# (krug-step --sync: krug::allreduce, which meets the other ranks on the direct lane when it
# can) against MPI_Allreduce, the same blocking call.
SYNC_SIZES = ["4", "256", "4K", "16K", "64K"]


def step_spec_text(spec):
    """A measure's spec as one item of the Python tools' --steps (NxSIZE or a gradient list)."""
    if spec[0] == "--shapes":
        return spec[1]
    return "%sx%s" % (spec[1], spec[3])


def run_small_ops(r, args, np_, keys=None):
    """{load: {measure: {tool: row}}}; tools: krug C++, krug Python, MPI, Gloo, and with
    --horovod the krug Python script under Horovod with each controller. The C++ tools start
    once per measure (they start in milliseconds); each Python tool measures them all in turn
    in one process (--steps; importing torch takes seconds). `keys` (bench/scaling.py): only
    those measures of SMALL_MEASURES, through krug's C++ API, MPI and Gloo, without the
    synchronous sizes."""
    t = ["--target-seconds", str(args.step_seconds)]
    measures = [(key, spec) for key, _, spec in SMALL_MEASURES
                if (keys is None or key in keys) and not (args.smoke and key == "step_resnet50")]
    sync_sizes = SYNC_SIZES if keys is None else []
    tools = []
    for key, spec in measures:
        tools.append((("krug_cpp", key), "krug-step.%s.np%d" % (key, np_),
                      r.krug(np_, r.bin["krug-step"], *spec, *t), step_rows))
        if r.have_mpi:
            tools.append((("mpi", key), "mpi_bench.step.%s.np%d" % (key, np_),
                          r.mpi(np_, "step", *spec, *t), step_rows))
    # --step-seconds of calls too: a call takes 0.2-15 µs, and the fixed 20,000 calls used while
    # the timing loop stopped at 1,000 lasted 4 ms at 4 B, which one scheduler hiccup decided.
    for size in sync_sizes:
        key, spec = "sync_" + size, ["--tensors", "1", "--tensor-bytes", size]
        tools.append((("krug_cpp", key), "krug-step.%s.np%d" % (key, np_),
                      r.krug(np_, r.bin["krug-step"], "--sync", *spec, *t), step_rows))
        if r.have_mpi:
            tools.append((("mpi", key), "mpi_bench.step.%s.np%d" % (key, np_),
                          r.mpi(np_, "step", *spec, *t), step_rows))
    # --smoke --horovod: the Python small ops for one 4 KiB allreduce only.
    py_keys = [] if args.no_python_ops else \
        [key for key, _ in measures if not (args.smoke and key != "op_4k")]
    if py_keys:
        steps = ["--steps", ",".join(step_spec_text(spec) for key, spec in measures
                                     if key in py_keys)] + t

        def rows_of(keys):
            # Row i is measure i: mark each row with its measure, for the tables.
            return lambda text: [dict(row, measure=k)
                                 for k, row in zip(keys, all_step_rows(text))]

        script = os.path.join(HERE, "krug_small_ops.py")
        if r.have_krug_torch and keys is None:
            tools.append(("krug_py", "krug_small_ops.np%d" % np_,
                          r.krug(np_, PYTHON, script, *steps), rows_of(py_keys)))
            # Item 3's Python half: hvd.allreduce_ one after the other, the sizes of SYNC_SIZES.
            sync_keys = ["sync_" + x for x in SYNC_SIZES]
            sync_steps = ["--sync", "--steps", ",".join("1x" + x for x in SYNC_SIZES)] + t
            tools.append(("krug_py_sync", "krug_small_ops.sync.np%d" % np_,
                          r.krug(np_, PYTHON, script, *sync_steps), rows_of(sync_keys)))
        if r.have_torch:
            tools.append(("gloo", "torch_gloo_bench.step.np%d" % np_,
                          r.gloo(np_, "step", *steps), rows_of(py_keys)))
        if r.have_horovod and keys is None:
            tools += [(hkey, "horovod_%s_small_ops.np%d" % (ctl, np_),
                       r.horovod(ctl, np_, script, *steps), rows_of(py_keys))
                      for hkey, ctl in HOROVOD]
    out = {load: {key: {} for key in [k for k, _ in measures] + ["sync_" + x for x in sync_sizes]}
           for load in args.loads}
    for load in args.loads:  # a Python tool that failed: "—" in its column (see Errors)
        for tool in [tool for tool, _, _, _ in tools if not isinstance(tool, tuple)]:
            for key in py_keys:
                out[load][key][tool] = None
    for load, res in interleaved(r, args, tools).items():
        for tool, rows in res.items():
            if isinstance(tool, tuple):  # a C++ tool's one measure
                out[load][tool[1]][tool[0]] = rows[0] if rows else None
            else:
                for row in rows or []:
                    out[load][row["measure"]][tool] = row
    return out


def run_machine_limits(r, args):
    sizes = ["--min-bytes", "1M", "--max-bytes", "4M", "--repeats", "3"] if args.smoke else []
    return r.parsed("machine_limits", [r.bin["machine_limits"]] + sizes, lambda text: [
        {"bytes": int(f[0]), "memcpy": float(f[1]), "reduce": float(f[2]), "bound": float(f[3])}
        for f in parse_rows(text, 4)]) or []


_TOTAL = re.compile(r"Total img/sec on (\d+) rank\(s\): ([\d.]+)")


def median_value(samples):
    return statistics.median(samples) if samples else None


def with_rounds(res):
    """{key: median} and, under "rounds", every round's value: what the tables read."""
    out = {key: median_value(v) for key, v in res.items()}
    out["rounds"] = res
    return out


def run_training(r, args):
    """Every configuration once per round under every load, rounds interleaved, so a slow spell
    of this shared machine hits all of them alike; each figure is the median over rounds;
    {load: {run: images/s}}. "plain" is one process without distribution, the baseline of
    scaling efficiency. The "_tN" runs give each rank's torch as many threads as the machine
    has cores (N), as a script that does not set them gets. With --horovod: the krug example
    under Horovod with each controller, and one plain process in Horovod's interpreter when its
    torch is not krug's (the baseline of Horovod's scaling efficiency). With --train-ceilings:
    "plain_x2", two plain processes at once without communication (they share this machine's
    memory bandwidth and caches); "lockstep_np2", two ranks that also wait for each other once
    per step, with no gradients: the ceiling of any synchronous data-parallel training here;
    and 1 rank of krug and of DDP."""
    iters = ["--num-warmup-batches", "2", "--num-batches-per-iter", "3",
             "--num-iters", str(args.train_iters)]
    # N threads per rank oversubscribe the cores: a step takes 3-4 times as long, so fewer of
    # them (1 warm-up, 2 x 2 timed at the default --train-iters 3).
    iters_n = ["--num-warmup-batches", "1", "--num-batches-per-iter", "2",
               "--num-iters", str(max(1, args.train_iters - 1))]
    example = os.path.join(ROOT, "examples", "torch_synthetic_benchmark.py")
    ddp = os.path.join(HERE, "peers", "ddp_synthetic.py")
    cores = os.cpu_count() or 1
    model_n = TRAIN_MODEL[:-1] + [str(cores)]
    plain_cmd = [PYTHON, ddp, "--plain"] + TRAIN_MODEL + iters

    def total(text):
        found = [float(m.group(2)) for m in _TOTAL.finditer(text)]
        return sum(found) if found else None

    runs = {"plain": plain_cmd}
    if args.train_ceilings:
        # Both at once: the shell starts one in the background and waits for it.
        runs["plain_x2"] = ["/bin/sh", "-c", "%s & %s; wait" % (shlex.join(plain_cmd),
                                                                 shlex.join(plain_cmd))]
        runs["lockstep_np2"] = [PYTHON, ddp, "--np", "2", "--lockstep"] + TRAIN_MODEL + iters
    for np_ in args.train_nps:
        if r.have_krug_torch:
            runs["krug_np%d" % np_] = r.krug(np_, PYTHON, example, *TRAIN_MODEL, *iters)
        runs["ddp_np%d" % np_] = [PYTHON, ddp, "--np", str(np_)] + TRAIN_MODEL + iters
    if r.have_horovod:
        if horovod_torch_differs(r):
            runs["hvd_plain"] = [r.hvd_python, ddp, "--plain"] + TRAIN_MODEL + iters
        for key, ctl in HOROVOD:
            runs["%s_np2" % key] = r.horovod(ctl, 2, example, *TRAIN_MODEL, *iters)
    if cores > 1:
        runs["plain_tN"] = [PYTHON, ddp, "--plain"] + model_n + iters_n
        if r.have_krug_torch:
            runs["krug_np2_tN"] = r.krug(2, PYTHON, example, *model_n, *iters_n)
        runs["ddp_np2_tN"] = [PYTHON, ddp, "--np", "2"] + model_n + iters_n
        if r.have_horovod:
            for key, ctl in HOROVOD:
                runs["%s_np2_tN" % key] = r.horovod(ctl, 2, example, *model_n, *iters_n)
    tools = [(key, "train.%s" % key, cmd, total) for key, cmd in runs.items()]
    res = interleaved(r, args, tools, rounds=args.train_rounds, combine=lambda v: v)
    return {load: with_rounds(v) for load, v in res.items()}


def horovod_torch_differs(r):
    """Whether Horovod's interpreter has another torch than the ranks of krug (the build's)."""
    if not hasattr(r, "_hvd_torch_differs"):
        r._hvd_torch_differs = torch_version(PYTHON) != torch_version(r.hvd_python)
    return r._hvd_torch_differs


def torch_version(python):
    try:
        return subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                              capture_output=True, text=True, timeout=120).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def run_tf_ops(r, args):
    """Allreduce of one tensor per size from eager TensorFlow (one process for every size: its
    import takes seconds) and from krug.torch (a process per size), 2 ranks, in turn for --rounds
    rounds; {load: {size: {"tf": row, "torch": row}}}, each row the median round's."""
    t = ["--target-seconds", str(args.step_seconds)]
    tf_cmd = r.krug(2, r.tf_python, os.path.join(HERE, "tf_small_ops.py"),
                    "--sizes", ",".join(TF_OP_SIZES), *t)
    tools = [("tf", "tf_small_ops.np2", tf_cmd, all_step_rows)]
    if r.have_krug_torch:
        # One key for every size: median_rows keeps the sizes apart.
        tools += [("torch", "krug_small_ops.tf_sizes.%s.np2" % size,
                   r.krug(2, PYTHON, os.path.join(HERE, "krug_small_ops.py"), "--tensors", "1",
                          "--tensor-bytes", size, *t), step_rows) for size in TF_OP_SIZES]
    out = {}
    for load, res in interleaved(r, args, tools).items():
        out[load] = {}
        for tool, rows in res.items():
            for row in rows or []:
                out[load].setdefault(row["bytes"], {})[tool] = row
    return out


_WORKER = re.compile(r"Worker (\d+) of \d+: samples/sec ([\d.]+)")


def run_keras(r, args):
    """bench/keras_compare.py: krug (2 ranks), MultiWorkerMirroredStrategy (2 workers), one plain
    process and two at once, in turn for --train-rounds rounds; {load: {mode: median samples/s
    of all workers}}."""
    script = os.path.join(HERE, "keras_compare.py")
    epochs = ["--epochs", str(max(2, args.train_iters // 2 + 1))]
    plain = [r.tf_python, script, "--mode", "plain"] + epochs
    runs = {"plain": plain,
            # Both at once, no communication: what this machine gives two workers.
            "plain_x2": ["/bin/sh", "-c", "%s & %s; wait" % (shlex.join(plain),
                                                               shlex.join(plain))],
            "krug_np2": r.krug(2, r.tf_python, script, "--mode", "krug", *epochs),
            "mwms_np2": [r.tf_python, script, "--mode", "mwms", "--np", "2"] + epochs}
    expected = {"plain": 1, "plain_x2": 2, "krug_np2": 2, "mwms_np2": 2}

    def total(key):
        def parse(text):
            found = [float(m.group(2)) for m in _WORKER.finditer(text)]
            return sum(found) if len(found) == expected[key] else None
        return parse

    tools = [(key, "keras.%s" % key, cmd, total(key)) for key, cmd in runs.items()]
    res = interleaved(r, args, tools, rounds=args.train_rounds, combine=lambda v: v)
    return {load: with_rounds(v) for load, v in res.items()}


# ---- reporting ---------------------------------------------------------------------------------

def table(headers, rows):
    """An aligned Markdown table: readable in a terminal and in docs/benchmarks.md."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    line = lambda row: "| " + " | ".join(c.rjust(w) for c, w in zip(row, widths)) + " |"
    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] +
                     [line(row) for row in cells])


def fmt(v, spec="%.2f", missing="—"):
    return missing if v is None else spec % v


def fmt_us(v):
    # Three digits below a microsecond, where the tools' small calls are timed.
    if v is not None and v < 1:
        return fmt(v, "%.3f")
    return fmt(v, "%.2f" if v is not None and v < 10 else "%.1f")


def size_label(b):
    return pybench.human_bytes(b).replace(" ", "\u00a0") if b >= 1024 else "%d B" % b


def rounds_note(rows):
    """", median of N interleaved rounds" when the rows came from several rounds."""
    n = max([len(row.get("rounds_us", [])) for row in rows if row] or [1])
    return ", median of %d interleaved rounds; a ratio or difference: the median of each " \
        "round's own" % n if n > 1 else ""


def load_label(load, procs):
    """How a table's title names the machine state it was measured in."""
    return "idle machine" if load == "idle" else \
        "loaded machine (%d busy process%s)" % (procs, "" if procs == 1 else "es")


def fmt_ratio(v):
    """A ratio with 3 significant digits, without exponents (a busy-polling peer under load can
    be thousands of times slower)."""
    return fmt(v, "%.3g" if v is None or v < 1000 else "%.0f")


def paired_rounds(k, p):
    """Both rows' times round by round, where both have every round: a round runs the tools one
    after the other, so a slow spell of this shared machine that spans a round hits both, where
    the two medians could pair one tool's slow round with the other's fast one."""
    kr, pr = (k or {}).get("rounds_us") or [], (p or {}).get("rounds_us") or []
    return list(zip(kr, pr)) if len(kr) == len(pr) > 1 else []


def ratio_peer_over_krug(k, p):
    """krug busbw / peer busbw = peer time / krug time (same bytes): above 1 krug is faster;
    the median of the rounds' own ratios where both have every round."""
    if not (p and k and k["time_us"]):
        return None
    pairs = paired_rounds(k, p)
    if pairs and all(a > 0 for a, _ in pairs):
        return statistics.median(b / a for a, b in pairs)
    return p["time_us"] / k["time_us"]


def extra_time(k, p):
    """How much longer p takes than k (µs): the median of the rounds' own differences where
    both have every round."""
    if not (p and k):
        return None
    pairs = paired_rounds(k, p)
    if pairs:
        return statistics.median(b - a for a, b in pairs)
    return p["time_us"] - k["time_us"]


def sweep_table(title, res, tools=TOOLS, ref="krug"):
    """A sweep table: each tool's time and busbw per size and ref/peer for every other tool."""
    tools = [t for t in tools if res.get(t)]  # None: the tool failed (see Errors)
    by_size = {}
    for t in tools:
        for row in res[t]:
            by_size.setdefault(row["bytes"], {})[t] = row
    headers = ["size"]
    for t in tools:
        headers += ["%s µs" % TOOL_TITLE[t], "%s busbw" % TOOL_TITLE[t]]
    headers += ["%s/%s" % (TOOL_TITLE[ref], TOOL_TITLE[t]) for t in tools if t != ref]
    rows = []
    for b in sorted(by_size):
        cols = [size_label(b)]
        for t in tools:
            row = by_size[b].get(t)
            cols += [fmt_us(row and row["time_us"]), fmt(row and row["busbw"], "%.3f")]
        cols += [fmt_ratio(ratio_peer_over_krug(by_size[b].get(ref), by_size[b].get(t)))
                 for t in tools if t != ref]
        rows.append(cols)
    note = rounds_note([row for v in res.values() for row in v or []])
    return ("### %s (time per op in µs; busbw in GB/s; ratio = %s busbw / peer busbw, above 1 "
            "%s is faster%s)\n\n" % (title, TOOL_TITLE[ref], TOOL_TITLE[ref], note)) + \
        table(headers, rows)


SMALL_TOOLS = [("krug_cpp", "krug C++"), ("krug_py", "krug Python"), ("mpi", "Open MPI"),
               ("gloo", "torch Gloo"), ("hvd_gloo", "Horovod Gloo"), ("hvd_mpi", "Horovod MPI")]


def small_ops_table(np_, res, where):
    present = {t for v in res.values() for t, row in v.items() if row}
    tools = [(t, title) for t, title in SMALL_TOOLS
             if t in present or t in ("krug_cpp", "krug_py", "mpi", "gloo")]
    hvd = [(t, title) for t, title in tools if t.startswith("hvd_")]
    headers = ["measure (time per op or step, µs)"] + [title for _, title in tools] + \
        ["krug Python/%s" % title for _, title in hvd]
    rows = []
    for key, label, _ in SMALL_MEASURES:
        if key in res:
            m = res[key]
            rows.append([label] + [fmt_us(m.get(t) and m[t]["time_us"]) for t, _ in tools] +
                        [fmt_ratio(ratio_peer_over_krug(m.get("krug_py"), m.get(t)))
                         for t, _ in hvd])
    note = rounds_note([row for v in res.values() for row in v.values()])
    return ("### Small messages, %d ranks, %s (C++: krug-step, mpi_bench; Python: "
            "krug_small_ops.py%s, torch_gloo_bench.py; a step submits every tensor "
            "asynchronously and waits for all, MPI makes one blocking call per tensor; "
            "krug/Horovod = Horovod's time / krug's, above 1 krug is faster%s)\n\n"
            % (np_, where, " (krug.torch, and Horovod running the same script)" if hvd else "",
               note)) + table(headers, rows)


def sync_table(np_, res, where):
    """One synchronous allreduce per size: krug's C++ API against MPI_Allreduce (item 3)."""
    rows = []
    for size in SYNC_SIZES:
        m = res.get("sync_" + size) or {}
        k, p, py = m.get("krug_cpp"), m.get("mpi"), m.get("krug_py_sync")
        if not (k or p or py):
            continue
        rows.append([size_label(pybench.parse_size(size)), fmt_us(k and k["time_us"]),
                     fmt_us(p and p["time_us"]), fmt_ratio(ratio_peer_over_krug(k, p)),
                     fmt_us(py and py["time_us"]), fmt_us(extra_time(k, py))])
    if not rows:
        return ""
    note = rounds_note([m.get("krug_cpp") for key, m in res.items() if key.startswith("sync_")])
    return ("### One synchronous allreduce, %d ranks, %s (krug-step --sync: krug::allreduce; "
            "mpi_bench step: MPI_Allreduce; krug_small_ops.py --sync: hvd.allreduce_ of "
            "krug.torch; time per op in µs; krug/Open MPI = Open MPI's time / krug's, above 1 "
            "krug is faster%s)\n\n" % (np_, where, note)) + \
        table(["size", "krug C++ API µs", "Open MPI µs", "krug/Open MPI", "krug.torch µs",
               "krug.torch - C++ µs"], rows)


def at_size(rows, nbytes, key="busbw"):
    for row in rows or []:
        if row["bytes"] == nbytes:
            return row[key]
    return None


def limits_table(limits, sweeps):
    rows = [[size_label(l["bytes"]), "%.2f" % l["memcpy"], "%.2f" % l["reduce"],
             "%.2f" % l["bound"]] for l in limits]
    text = ("### Machine limits (single thread, best of 5; bound = 2/(1/reduce + 1/memcpy), the "
            "most allreduce busbw one core per rank allows; GB/s; idle machine)\n\n" +
            table(["size", "memcpy", "reduce a=b+c", "bound"], rows))
    frac = []
    for np_, res in sorted(sweeps.items()):
        krug_rows = res.get("allreduce", {}).get("krug")
        for l in limits:
            bw = at_size(krug_rows, l["bytes"])
            if bw is not None:
                frac.append(["%d" % np_, size_label(l["bytes"]), "%.3f" % bw,
                             "%.2f" % (bw / l["bound"]), "%.2f" % (bw / l["memcpy"])])
    if frac:
        text += ("\n\nFraction of the machine's limit that krug's allreduce reaches (idle "
                 "machine):\n\n" +
                 table(["ranks", "size", "krug busbw", "of bound", "of memcpy"], frac))
    return text


def n_rounds(res):
    return max([len(v) for v in res.get("rounds", {}).values()] or [0])


def training_table(res, where, hvd_torch=None):
    cores = os.cpu_count() or 1

    def eff(v, n, plain):
        return fmt(v / (n * plain) if v and plain else None)

    def ratio(a, b):
        return fmt(a / b if a and b else None)

    def block(sfx, threads):
        plain = res.get("plain" + sfx)
        # Horovod's efficiency against a plain process of its own torch, when that differs
        # (measured with 1 thread only).
        hvd_plain = res.get("hvd_plain" + sfx) if "hvd_plain" in res.get("rounds", {}) \
            else plain
        k2 = res.get("krug_np2" + sfx)
        rows = [["one plain process (no distribution)", threads, "1", fmt(plain, "%.1f"), "1.00",
                 ""]]
        for key, what in (("plain_x2", "two plain processes at once, no communication"),
                          ("lockstep_np2", "two ranks in lock-step: a barrier per step, no "
                           "gradients (synchronous training's ceiling)")):
            if key + sfx in res.get("rounds", {}):  # --train-ceilings
                rows.append([what, threads, "2", fmt(res.get(key + sfx), "%.1f"),
                             eff(res.get(key + sfx), 2, plain), ""])
        if res.get("hvd_plain" + sfx):
            rows.append(["one plain process in Horovod's interpreter (torch %s)"
                         % (hvd_torch or "?"), threads, "1", fmt(hvd_plain, "%.1f"), "1.00",
                         ""])
        nps = (1, 2) if sfx == "" else (2,)
        for np_ in nps:
            k, d = res.get("krug_np%d%s" % (np_, sfx)), res.get("ddp_np%d%s" % (np_, sfx))
            if k is None and d is None and np_ == 1:
                continue
            rows.append(["krug (examples/torch_synthetic_benchmark.py)", threads, str(np_),
                         fmt(k, "%.1f"), eff(k, np_, plain), ""])
            rows.append(["PyTorch DDP, gloo (bench/peers/ddp_synthetic.py)", threads, str(np_),
                         fmt(d, "%.1f"), eff(d, np_, plain), ratio(k, d)])
        for key, ctl in HOROVOD:
            h = res.get("%s_np2%s" % (key, sfx))
            if h is not None or "%s_np2%s" % (key, sfx) in res.get("rounds", {}):
                rows.append(["Horovod %s, %s controller (the same example)"
                             % (HOROVOD_VERSION, ctl.upper() if ctl == "mpi" else "Gloo"),
                             threads, "2", fmt(h, "%.1f"), eff(h, 2, hvd_plain), ratio(k2, h)])
        return rows

    rows = block("", "1")
    if any(k.endswith("_tN") for k in res.get("rounds", {})):
        rows += block("_tN", str(cores))
    note = ""
    if any(k.startswith("hvd_plain") for k in res.get("rounds", {})):
        note = ("; Horovod runs Debian's torch %s, krug and DDP the build's: compare scaling "
                "efficiency (each against a plain process of its own torch) more than images/s"
                % (hvd_torch or "?"))
    return ("### Training throughput, %s: ResNet-18, synthetic 64x64, batch 16 per rank "
            "(efficiency = images/s / (ranks x plain process with as many threads); krug/peer = "
            "krug's images/s (same ranks and threads) / the peer's; median of %d interleaved "
            "rounds%s)\n\n" % (where, n_rounds(res), note) +
            table(["run", "threads per rank", "ranks", "images/s (all ranks)",
                   "scaling efficiency", "krug/peer"], rows))


def tf_ops_table(res, where):
    rows = []
    for size in sorted(res):
        tf_row, torch_row = res[size].get("tf"), res[size].get("torch")
        tf_us = tf_row and tf_row["time_us"]
        torch_us = torch_row and torch_row["time_us"]
        busbw = lambda us: us and size / us / 1e3 * pybench.BUS_FACTOR["allreduce"](2)
        rows.append([size_label(size), fmt_us(tf_us), fmt_us(torch_us),
                     fmt(tf_us / torch_us if tf_us and torch_us else None),
                     fmt(busbw(tf_us), "%.3f"), fmt(busbw(torch_us), "%.3f")])
    note = rounds_note([row for v in res.values() for row in v.values()])
    return ("### Allreduce from eager TensorFlow against krug.torch, 2 ranks, %s (one tensor, "
            "time per op in µs; bench/tf_small_ops.py: hvd.allreduce, a new output each call; "
            "bench/krug_small_ops.py: hvd.allreduce_async_ in place and synchronize; busbw in "
            "GB/s%s)\n\n" % (where, note)) + \
        table(["size", "TF eager µs", "krug.torch µs", "TF/torch", "TF busbw", "torch busbw"],
              rows)


def keras_table(res, where):
    plain = res.get("plain")

    def eff(v, n):
        return fmt(v / (n * plain) if v and plain else None)

    k, m = res.get("krug_np2"), res.get("mwms_np2")
    rows = [["one plain process (no distribution)", "1", fmt(plain, "%.1f"), "1.00", ""],
            ["two plain processes at once, no communication", "2",
             fmt(res.get("plain_x2"), "%.1f"), eff(res.get("plain_x2"), 2), ""],
            ["krug (krug.tensorflow.keras.DistributedOptimizer, krugrun)", "2", fmt(k, "%.1f"),
             eff(k, 2), fmt(k / m if k and m else None)],
            ["tf.distribute.MultiWorkerMirroredStrategy (RING, gRPC on localhost)", "2",
             fmt(m, "%.1f"), eff(m, 2), ""]]
    return ("### Keras training (bench/keras_compare.py), %s: MLP 784-1024-1024-10 (1.86 M "
            "parameters), tf_keras model.fit, synthetic data, batch 64 per worker, TensorFlow "
            "intra-op and inter-op threads 1 per process (efficiency = samples/s / (workers x "
            "plain process); median of %d interleaved rounds)\n\n" % (where, n_rounds(res))) + \
        table(["run", "workers", "samples/s (all workers)", "scaling efficiency", "krug/MWMS"],
              rows)


def targets(results):
    """[(description, measured text, PASS/FAIL/SKIP)] for issue 6, item 5 (2 ranks)."""
    out = []
    sw = results["sweeps"].get(2, {}).get("allreduce", {})
    small = results["small_ops"].get(2, {})
    train = results.get("training") or {}

    def add(desc, value, ok, spec):
        if value is None:
            out.append((desc, "not measured", "SKIP"))
        else:
            # A miss by less than the last digit read as a pass ("1.30x" against 1.3x): one
            # more digit on a FAIL line shows by how much.
            shown = spec if ok else spec.replace("%.2f", "%.3f")
            out.append((desc, shown % value, "PASS" if ok else "FAIL"))

    for mib in (64, 256):
        k = at_size(sw.get("krug"), mib << 20)
        m = at_size(sw.get("mpi"), mib << 20)
        add("allreduce busbw %d MiB >= 3.3 GB/s" % mib, k, k is not None and k >= 3.3, "%.2f GB/s")
        ratio = k / m if k is not None and m else None
        add("allreduce busbw %d MiB >= 2x Open MPI" % mib, ratio,
            ratio is not None and ratio >= 2.0, "%.2fx")
    k = at_size(sw.get("krug"), 16 << 20)
    add("allreduce busbw 16 MiB >= 6.0 GB/s", k, k is not None and k >= 6.0, "%.2f GB/s")

    def step_time(key, tool):
        row = small.get(key, {}).get(tool)
        return row and row["time_us"]

    for key, tool, limit, desc in (
            ("op_4k", "krug_cpp", 15, "4 KiB allreduce per op, C++ API <= 15 us"),
            ("op_4k", "krug_py", 40, "4 KiB allreduce per op, Python API <= 40 us"),
            ("step_100x1k", "krug_cpp", 150, "step of 100 x 1 KiB, C++ API <= 150 us"),
            ("step_100x1k", "krug_py", 500, "step of 100 x 1 KiB, Python API <= 500 us")):
        v = step_time(key, tool)
        add(desc, v, v is not None and v <= limit, "%.1f us")
    k, d, plain = train.get("krug_np2"), train.get("ddp_np2"), train.get("plain")
    ratio = k / d if k and d else None
    add("ResNet-18 2 ranks: images/s >= 1.3x DDP", ratio, ratio is not None and ratio >= 1.3,
        "%.2fx")
    e = k / (2 * plain) if k and plain else None
    add("ResNet-18 2 ranks: scaling efficiency >= 0.90", e, e is not None and e >= 0.90, "%.2f")
    tf_ops = results.get("tf_ops") or {}
    tf_4k = (tf_ops.get(4096) or {}).get("tf")
    v = tf_4k and tf_4k["time_us"]
    add("(issue 19) 4 KiB allreduce from eager TensorFlow <= 100 us", v,
        v is not None and v <= 100, "%.1f us")
    keras = results.get("keras") or {}
    kk, mm = keras.get("krug_np2"), keras.get("mwms_np2")
    ratio = kk / mm if kk and mm else None
    add("(issue 19) Keras MLP 2 workers: samples/s >= 1.2x MultiWorkerMirroredStrategy", ratio,
        ratio is not None and ratio >= 1.2, "%.2fx")
    for key, what in (("plain_x2", "two plain processes at once, no communication"),
                      ("lockstep_np2", "two ranks in lock-step, no gradients")):
        ceiling = train.get(key)
        c = ceiling / (2 * plain) if ceiling and plain else None
        if c is not None:
            out.append(("ResNet-18 2 ranks: this machine's ceiling (%s)" % what,
                        "efficiency %.2f, %.2fx DDP; krug reaches %.0f%% of it"
                        % (c, ceiling / d if d else 0, 100 * k / ceiling if k else 0), "INFO"))
    return out


def peer_verdicts(view, np_=2):
    """[(description, measured text, PASS/FAIL/SKIP)]: krug >= every peer (issue 30), at np_
    ranks. Sweeps: krug's time per op against each peer's at every size both measured (krug's
    C++ API against Open MPI and torch Gloo, krug.torch against Horovod); small messages: krug's
    C++ API against Open MPI, its Python API against torch Gloo and Horovod; training: krug's
    images/s against each peer's with the same ranks and threads."""
    out = []

    def sweep_verdict(what, krug_rows, peer, peer_rows):
        desc = "krug >= %s: %s, every size" % (TOOL_TITLE[peer], what)
        k = {row["bytes"]: row for row in krug_rows or []}
        ratios = [(ratio_peer_over_krug(k[row["bytes"]], row), row["bytes"])
                  for row in peer_rows or [] if row["bytes"] in k]
        ratios = [(v, b) for v, b in ratios if v is not None]
        if not ratios:
            out.append((desc, "not measured", "SKIP"))
            return
        ahead = sum(1 for v, _ in ratios if v >= 1.0)
        worst = min(ratios)
        out.append((desc, "krug ahead at %d of %d sizes; worst %sx at %s"
                     % (ahead, len(ratios), fmt_ratio(worst[0]),
                        size_label(worst[1]).replace("\u00a0", " ")),
                     "PASS" if ahead == len(ratios) else "FAIL"))

    for op, res in sorted(view.get("sweeps", {}).get(np_, {}).items()):
        for peer in ("mpi", "gloo"):
            if peer in res:
                sweep_verdict("%s %d ranks (C++ API)" % (op, np_), res.get("krug"), peer,
                              res.get(peer))
    hsw = view.get("horovod_sweep", {}).get(np_)
    if hsw:
        for peer, _ in HOROVOD:
            sweep_verdict("allreduce %d ranks (krug.torch, the same script)" % np_,
                          hsw.get("krug_py"), peer, hsw.get(peer))
    small = view.get("small_ops", {}).get(np_, {})
    for key, label, _ in SMALL_MEASURES:
        m = small.get(key)
        if not m:
            continue
        for mine, peer, api in (("krug_cpp", "mpi", "C++"), ("krug_py", "gloo", "Python"),
                                ("krug_py", "hvd_gloo", "Python"),
                                ("krug_py", "hvd_mpi", "Python")):
            if peer not in m:
                continue
            v = ratio_peer_over_krug(m.get(mine), m.get(peer))
            desc = "krug >= %s: %s, %d ranks (%s API)" % (TOOL_TITLE[peer], label, np_, api)
            out.append((desc, "not measured", "SKIP") if v is None else
                       (desc, "%sx (%.1f against %.1f us)" % (fmt_ratio(v), m[mine]["time_us"],
                                                              m[peer]["time_us"]),
                        "PASS" if v >= 1.0 else "FAIL"))
    sync = [(ratio_peer_over_krug(small.get("sync_" + x, {}).get("krug_cpp"),
                                  small.get("sync_" + x, {}).get("mpi")), x) for x in SYNC_SIZES]
    sync = [(v, x) for v, x in sync if v is not None]
    desc = "krug >= Open MPI: one synchronous allreduce, 4 B to 64 KiB, %d ranks (C++ API)" % np_
    if sync:
        worst = min(sync)
        ahead = sum(1 for v, _ in sync if v >= 1.0)
        out.append((desc, "krug ahead at %d of %d sizes; worst %sx at %s"
                    % (ahead, len(sync), fmt_ratio(worst[0]),
                       size_label(pybench.parse_size(worst[1])).replace("\u00a0", " ")),
                    "PASS" if ahead == len(sync) else "FAIL"))
    elif small:
        out.append((desc, "not measured", "SKIP"))
    gaps = [(small.get("sync_" + x, {}).get("krug_py_sync"), small.get("sync_" + x, {})
             .get("krug_cpp"), x) for x in SYNC_SIZES]
    gaps = [(extra_time(k, py), x) for py, k, x in gaps if py and k]
    if gaps:
        worst = max(gaps)
        out.append(("krug.torch within 2 us of the C++ API: one synchronous allreduce, 4 B to "
                    "64 KiB, %d ranks" % np_, "worst %.2f us more at %s" % (
                        worst[0], size_label(pybench.parse_size(worst[1])).replace("\u00a0", " ")),
                    "PASS" if worst[0] <= 2.0 else "FAIL"))
    train = view.get("training") or {}
    rounds = train.get("rounds", {})
    for sfx, threads in (("", "1 thread"), ("_tN", "%d threads" % (os.cpu_count() or 1))):
        k = train.get("krug_np2" + sfx)
        for peer, title in (("ddp", "PyTorch DDP"), ("hvd_gloo", "Horovod Gloo"),
                            ("hvd_mpi", "Horovod MPI")):
            key = "%s_np2%s" % (peer, sfx)
            if key not in rounds:
                continue
            p = train.get(key)
            plain, own_plain = train.get("plain" + sfx), train.get("hvd_plain" + sfx)
            other_torch = peer.startswith("hvd_") and "hvd_plain" in rounds
            if other_torch and "hvd_plain" + sfx in rounds:
                # Horovod runs another torch than krug: images/s would compare the two torches
                # as much as the two frameworks, so compare scaling efficiency, each against a
                # plain process of its own torch.
                desc = "krug >= %s: ResNet-18 scaling efficiency, 2 ranks x %s (other torch)" \
                    % (title, threads)
                ke = k / (2 * plain) if k and plain else None
                pe = p / (2 * own_plain) if p and own_plain else None
                out.append((desc, "not measured", "SKIP") if not (ke and pe) else
                           (desc, "%.2f against %.2f (%.1f and %.1f images/s)" % (ke, pe, k, p),
                            "PASS" if ke >= pe else "FAIL"))
                continue
            desc = "krug >= %s: ResNet-18 images/s, 2 ranks x %s%s" % (
                title, threads, " (other torch)" if other_torch else "")
            out.append((desc, "not measured", "SKIP") if not (k and p) else
                       (desc, "%.2fx (%.1f against %.1f)" % (k / p, k, p),
                        "PASS" if k >= p else "FAIL"))
    return out


def machine_info(r):
    def cmd(c):
        try:
            return subprocess.run(c, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), platform.processor())
    mem = next((int(l.split()[1]) // (1 << 20) for l in open("/proc/meminfo")
                if l.startswith("MemTotal")), 0)
    osname = next((l.split("=", 1)[1].strip().strip('"') for l in open("/etc/os-release")
                   if l.startswith("PRETTY_NAME")), "") if os.path.exists("/etc/os-release") else ""
    # The commit of the sources krug was built from (the build's CMakeCache names them).
    build = os.path.dirname(os.path.realpath(r.krugrun))
    source = ROOT
    cache = os.path.join(build, "CMakeCache.txt")
    if os.path.exists(cache):
        source = next((l.split("=", 1)[1].strip() for l in open(cache)
                       if l.startswith("CMAKE_HOME_DIRECTORY")), ROOT)
    commit = "%s (built in %s)" % (cmd(["git", "-C", source, "describe", "--always", "--dirty"]),
                                   build)
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host": platform.node(), "cpu": cpu, "cores": os.cpu_count(), "memory_gib": mem,
        "os": osname, "kernel": platform.release(), "krug_commit": commit,
        "openmpi": cmd([r.mpirun, "--version"]).splitlines()[0] if r.mpirun else None,
        "torch": cmd([PYTHON, "-c", "import torch; print(torch.__version__)"]) or None,
        "gloo": cmd(["dpkg-query", "-W", "-f=${Version}", "libgloo-dev"]) or None,
        "python": cmd([PYTHON, "-c", "import platform; print(platform.python_version())"]),
        "load_average": os.getloadavg(),
        "horovod": cmd([r.hvd_python, "-c", "import horovod; print(horovod.__version__)"])
        if r.have_horovod else None,
        "horovod_torch": torch_version(r.hvd_python) if r.have_horovod else None,
    }


def plot(results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plot: python3-matplotlib is not installed (apt-get install python3-matplotlib)",
              file=sys.stderr)
        return False
    views = results["by_load"]
    # One panel per collective and rank count (the C++ API's sweeps), one for the Python API's
    # allreduce (krug.torch and Horovod); each tool a colour, each load a line style.
    cases = []
    for load, view in views.items():
        for np_, ops in view["sweeps"].items():
            cases += [(np_, op, "sweeps", TOOLS) for op in ops]
        for np_ in view.get("horovod_sweep", {}):
            cases.append((np_, "allreduce", "horovod_sweep", ("krug_py",) + tuple(
                k for k, _ in HOROVOD)))
    cases = sorted(set(cases), key=lambda c: (c[0], c[2], c[1]))
    if not cases:  # --tensorflow-only
        return False
    fig, axes = plt.subplots(len(cases), 1, figsize=(8, 3.2 * len(cases)), squeeze=False)
    # The bound of the largest buffers: those do not fit any cache, as large messages do not.
    limits = sorted(results["machine_limits"], key=lambda l: l["bytes"])
    bound = limits[-1]["bound"] if limits else None
    styles = {"idle": "-", "loaded": ":"}
    colours = {t: "C%d" % i for i, t in enumerate(TOOLS + ("krug_py", "hvd_gloo", "hvd_mpi"))}
    for ax, (np_, op, part, tools) in zip(axes[:, 0], cases):
        sizes = set()
        for load, view in views.items():
            res = view[part].get(np_, {})
            res = res.get(op, {}) if part == "sweeps" else res
            for tool in tools:
                rows = [r for r in res.get(tool) or [] if r["busbw"] > 0]
                if rows:
                    sizes.update(r["bytes"] for r in rows)
                    ax.plot([r["bytes"] for r in rows], [r["busbw"] for r in rows], marker=".",
                            color=colours[tool], linestyle=styles[load],
                            label="%s, %s" % (TOOL_TITLE[tool], load))
        if bound and op == "allreduce":
            ax.axhline(bound, color="grey", linestyle="--", label="machine bound")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ticks = [b for b in sorted(sizes) if (b.bit_length() - 1) % 4 == 0]
        ax.set_xticks(ticks, [pybench.human_bytes(b).replace(" ", "").replace("iB", "")
                              for b in ticks])
        ax.set_title("%s, %d ranks%s" % (op, np_, ", Python API (krug.torch, Horovod)"
                                         if part == "horovod_sweep" else ""))
        ax.set_xlabel("size")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="x-small", ncol=2)
    fig.suptitle("Bus bandwidth against size (%s; dotted: loaded machine)"
                 % results["machine"]["date"], fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def run_header(m, command):
    """The command, the machine (machine_info) and the versions: a report's first lines."""
    return [
        "Command: `%s`" % command,
        "Machine: %s, %s cores, %s GiB, %s, kernel %s; load average at start %.2f %.2f %.2f"
        % (m["cpu"], m["cores"], m["memory_gib"], m["os"], m["kernel"], *m["load_average"]),
        "Date: %s. Versions: krug %s, %s, torch %s (Python %s), libgloo %s%s."
        % (m["date"], m["krug_commit"], m["openmpi"] or "no Open MPI", m["torch"],
           m["python"], m["gloo"], ", Horovod %s (torch %s)" % (m["horovod"], m["horovod_torch"])
           if m.get("horovod") else ""),
    ]


def report(results, args, command):
    m = results["machine"]
    views = results["by_load"]
    where = {load: load_label(load, results["load_procs"]) for load in views}
    parts = run_header(m, command) + [
        "Machine states: %s. Loaded: %d processes that never sleep (`while :; do :; done`, "
        "normal priority), started by the suite just before each loaded run and ended just "
        "after it. Every round runs every tool once in each state, in turn; each figure is the "
        "median of its rounds." % (", ".join(views), results["load_procs"]),
    ]
    if m["load_average"][0] > 0.5 * (m["cores"] or 1):
        # A peer that busy-polls (Open MPI with one rank per core) loses whole scheduler ticks
        # to other work on the cores; such figures say little about a quiet machine.
        parts.insert(3, "**Warning: the machine was busy when the run started (load average "
                        "%.2f on %s cores): figures are not representative of a quiet machine; "
                        "busy-polling peers suffer most.**" % (m["load_average"][0], m["cores"]))
    if results["machine_limits"]:
        first = views.get("idle") or next(iter(views.values()))
        parts.append(limits_table(results["machine_limits"], first["sweeps"]))
    nps = sorted({np_ for v in views.values() for np_ in v["sweeps"]})
    for np_ in nps:
        ops = [op for op in args.ops if any(op in v["sweeps"].get(np_, {})
                                            for v in views.values())]
        for op in ops:
            for load, v in views.items():
                if op in v["sweeps"].get(np_, {}):
                    parts.append(sweep_table("%s, %d ranks, %s" % (op, np_, where[load]),
                                             v["sweeps"][np_][op]))
        for load, v in views.items():
            if v["horovod_sweep"].get(np_):
                parts.append(sweep_table(
                    "allreduce through the Python API, %d ranks, %s: bench/krug_torch_sweep.py "
                    "under krugrun (krug.torch) and under horovodrun (Horovod %s, Gloo and MPI "
                    "controllers); in place" % (np_, where[load], HOROVOD_VERSION),
                    v["horovod_sweep"][np_], tools=("krug_py",) + tuple(k for k, _ in HOROVOD),
                    ref="krug_py"))
        for load, v in views.items():
            if v["small_ops"].get(np_):
                parts.append(small_ops_table(np_, v["small_ops"][np_], where[load]))
                sync = sync_table(np_, v["small_ops"][np_], where[load])
                if sync:
                    parts.append(sync)
    for key, fn in (("training", lambda res, w: training_table(res, w, m.get("horovod_torch"))),
                    ("tf_ops", tf_ops_table), ("keras", keras_table)):
        for load, v in views.items():
            if v.get(key):
                parts.append(fn(v[key], where[load]))
    for load, v in views.items():
        lines = ["%s  %s: %s" % (status, desc, value) for desc, value, status in v["targets"]]
        parts.append("### Targets and verdicts, %s (issues 6, 19 and 30, 2 ranks, float32)\n\n"
                     "```\n%s\n```" % (where[load], "\n".join(lines)))
    if results["errors"]:
        parts.append("### Errors\n\n" + "\n".join("- " + e for e in results["errors"]))
    return "\n\n".join(parts) + "\n"


def update_docs(text, plot_path):
    rewrite_docs_block(DOCS_BEGIN, DOCS_END, "Suite results", text, plot_path,
                       "bench-suite-busbw.png", "Bus bandwidth against size")


def rewrite_docs_block(begin, end, title, text, plot_path, image, alt):
    """Puts `text` (and the plot, copied to docs/`image`) between the markers `begin` and `end`
    of docs/benchmarks.md, or at its end under `title` where they are not there yet."""
    doc = os.path.join(ROOT, "docs", "benchmarks.md")
    with open(doc) as f:
        content = f.read()
    section = begin + "\n\n" + text
    if plot_path:
        shutil.copyfile(plot_path, os.path.join(ROOT, "docs", image))
        section += "\n![%s](%s)\n" % (alt, image)
    section += "\n" + end
    if begin in content and end in content:
        head, rest = content.split(begin, 1)
        content = head + section + rest.split(end, 1)[1]
    else:
        content = content.rstrip("\n") + "\n\n## %s\n\n" % title + section + "\n"
    with open(doc, "w") as f:
        f.write(content)
    print("updated %s" % doc, file=sys.stderr)


def main():
    args = parse_args()
    command = " ".join(["scripts/bench-suite"] + sys.argv[1:])
    r = Runner(args)
    needed = [r.krugrun] if args.tensorflow_only else \
        [r.krugrun, r.bin["krug-bench"], r.bin["krug-step"], r.bin["machine_limits"]]
    for path in needed:
        if not os.access(path, os.X_OK):
            sys.exit("bench-suite: %s is missing: build it (ninja -C %s krugrun krug-bench "
                     "krug-step machine_limits)" % (path, args.build_dir))
    if not r.have_mpi:
        print("bench-suite: Open MPI peer skipped: %s" % (
            "mpirun not found (apt-get install openmpi-bin libopenmpi-dev)" if not r.mpirun else
            "%s not built (apt-get install libopenmpi-dev, then reconfigure the build)"
            % r.bin["mpi_bench"]), file=sys.stderr)
    if not r.have_torch:
        print("bench-suite: torch Gloo peer and training skipped: %s cannot import torch "
              "(apt-get install python3-torch)" % PYTHON, file=sys.stderr)
        args.no_train = True
    if args.horovod and not r.have_horovod:
        # An asked-for peer that is missing is a failure, not a silent skip.
        r.errors.append("--horovod: %s cannot import horovod.torch, or %s is missing "
                        "(scripts/install-horovod builds it)" % (r.hvd_python, r.horovodrun))
    if r.have_horovod and not r.have_krug_torch:
        r.errors.append("--horovod: krug.torch is not built in %s: nothing to compare Horovod "
                        "with" % args.build_dir)
        r.have_horovod = False
    t0 = time.monotonic()
    results = {"machine": machine_info(r), "command": command, "loads": args.loads,
               "load_procs": args.load_procs}
    views = {load: {"sweeps": {}, "small_ops": {}, "horovod_sweep": {}, "training": None,
                    "tf_ops": None, "keras": None} for load in args.loads}
    results["by_load"] = views
    # The machine's own limits: measured idle only (they are the bound of an idle machine).
    results["machine_limits"] = [] if args.tensorflow_only else run_machine_limits(r, args)

    def spread(part, got, np_=None):
        for load, v in got.items():
            if np_ is None:
                views[load][part] = v
            else:
                views[load][part][np_] = v

    for np_ in [] if args.tensorflow_only else args.nps:
        spread("sweeps", run_sweeps(r, args, np_), np_)
        if r.have_horovod:
            spread("horovod_sweep", run_horovod_sweep(r, args, np_), np_)
        spread("small_ops", run_small_ops(r, args, np_), np_)
    if not args.no_train:
        spread("training", run_training(r, args))
    if not args.no_tensorflow and not r.have_krug_tf:
        print("bench-suite: TensorFlow comparison skipped: %s" % (
            "no interpreter imports tensorflow and tf_keras (scripts/install-deps)"
            if r.tf_python is None else "krug.tensorflow is not built in %s" % args.build_dir),
            file=sys.stderr)
    elif not args.no_tensorflow:
        spread("tf_ops", run_tf_ops(r, args))
        spread("keras", run_keras(r, args))
    for v in views.values():
        v["targets"] = targets(v) + peer_verdicts(v)
    results["errors"] = r.errors
    results["seconds"] = round(time.monotonic() - t0, 1)
    text = report(results, args, command)
    text += "\nThe suite took %s.\n" % duration(results["seconds"])
    plot_path = write_results(args.out, results, text, plot, "busbw.png")
    if args.update_docs:
        update_docs(text, plot_path)
    if r.errors:
        print("bench-suite: %d run(s) failed:\n  %s" % (len(r.errors), "\n  ".join(r.errors)),
              file=sys.stderr)
        return 1
    return 0


def write_results(out, results, text, plot_fn, image):
    """results.json, summary.md (`text`) and the plot (plot_fn(results, path)) into `out`;
    prints the text and where it all went; returns the plot's path, None where it made none."""
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    plot_path = os.path.join(out, image)
    if not plot_fn(results, plot_path):
        plot_path = None
    print(text)
    print("results: %s (results.json, summary.md%s, raw/)"
          % (out, ", " + image if plot_path else ""))
    return plot_path


def duration(seconds):
    s = int(round(seconds))
    return "%d s" % s if s < 60 else "%d min %d s" % (s // 60, s % 60)


if __name__ == "__main__":
    sys.exit(main())
