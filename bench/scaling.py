#!/usr/bin/python3
"""krug from 2 to 16 ranks, one per core, beside its peers (scripts/bench-scaling runs this).

For each rank count of --np (by default 2, 4, 8 and 16, those the machine has a core for), on
an idle machine and under the suite's competing load (one busy process per core), in
interleaved rounds: the allreduce sweep at 4 KiB, 64 KiB, 1 MiB and 16 MiB (krug-bench, Open
MPI's mpi_bench, torch.distributed's Gloo), one 4 KiB allreduce and a step of 100 x 1 KiB
(krug-step, mpi_bench step, torch_gloo_bench step), and ResNet-18 training throughput
(examples/torch_synthetic_benchmark.py under krugrun, PyTorch DDP over Gloo, and one plain
process, each rank with one torch thread). With --horovod, Horovod with its Gloo and MPI
controllers trains the same example. A peer that is not there (no Open MPI, no Horovod) is
left out and said so.

Prints how each measure scales: bus bandwidth (a bandwidth-optimal allreduce keeps it flat as
ranks grow: efficiency is busbw at N ranks / busbw at the fewest), time per small operation,
and training's scaling efficiency (images/s / (N x one plain process)); writes results.json, the
tables (summary.md), every tool's raw output and a plot of efficiency against ranks, idle
against loaded. --budget stops starting new runs once that many seconds have passed, so that a
machine lent for minutes still returns what ran (the tables say what was cut).
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import suite  # noqa: E402

ROOT = suite.ROOT
DOCS_BEGIN = ("<!-- bench-scaling results: begin (written by scripts/bench-scaling --update-docs) "
              "-->")
DOCS_END = "<!-- bench-scaling results: end -->"
SWEEP = ["--min-bytes", "4K", "--max-bytes", "16M", "--factor", "16"]  # 4K 64K 1M 16M
SMALL_KEYS = ("op_4k", "step_100x1k")
SMALL = [m for m in suite.SMALL_MEASURES if m[0] in SMALL_KEYS]
TRAIN_ITERS = ["--num-warmup-batches", "1", "--num-batches-per-iter", "2"]


def parse_args(argv=None):
    cores = os.cpu_count() or 1
    default_np = " ".join(str(n) for n in (2, 4, 8, 16) if n <= cores) or "2"
    p = argparse.ArgumentParser(prog="scripts/bench-scaling",
                                description=__doc__.split("\n")[0])
    p.add_argument("--np", default=default_np,
                   help="rank counts (default: 2 4 8 16, up to one rank per core: %s here)"
                        % default_np)
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    p.add_argument("--load", default="idle,loaded", help="idle, loaded or both (default)")
    p.add_argument("--train-iters", type=int, default=2,
                   help="timed iterations of 2 batches per training run (default 2)")
    p.add_argument("--no-train", action="store_true", help="skip training throughput")
    p.add_argument("--budget", type=float, default=float("inf"),
                   help="seconds after which no new run starts (default: none)")
    p.add_argument("--horovod", action="store_true", help="Horovod trains the example too")
    p.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    p.add_argument("--out", default=None, help="results folder (default bench-results/...)")
    p.add_argument("--timeout", type=int, default=300, help="seconds per tool run")
    p.add_argument("--update-docs", action="store_true",
                   help="also rewrite the scaling results in docs/benchmarks.md")
    p.add_argument("--smoke", action="store_true",
                   help="seconds, for the tests: 2 ranks, idle, one round, short runs; fails "
                        "unless krug's figure of every part is there")
    args = p.parse_args(argv)
    if args.smoke:
        args.np, args.rounds, args.load, args.train_iters = "2", 1, "idle", 1
    nps = sorted({int(n) for n in args.np.split()})
    if not nps or min(nps) < 2:
        p.error("--np: rank counts of 2 or more")
    args.np = " ".join(map(str, nps))  # efficiency is against the fewest
    over = [n for n in nps if n > cores]
    if over:
        print("bench-scaling: %s ranks oversubscribe this machine's %d cores: their figures "
              "measure the scheduler, not krug" % (" ".join(map(str, over)), cores),
              file=sys.stderr)
    # The suite's own settings for what it shares with this script: its runner, its load, its
    # rounds and its sweep and step tools.
    suite_argv = ["--np", args.np, "--ops", "allreduce", "--rounds", str(args.rounds),
                  "--train-rounds", str(args.rounds), "--load", args.load,
                  "--build-dir", args.build_dir, "--timeout", str(args.timeout)] + SWEEP
    if args.out:
        suite_argv += ["--out", args.out]
    if args.horovod:
        suite_argv.append("--horovod")
    if args.smoke:
        suite_argv += ["--target-seconds", "0.02", "--step-seconds", "0.05"]
    s = suite.parse_args(suite_argv)
    s.train_iters = args.train_iters
    return args, s


class Budget:
    """Whether a new run may start; remembers what it turned away."""

    def __init__(self, seconds):
        self.until = time.monotonic() + seconds
        self.cut = []

    def allows(self, what):
        if time.monotonic() < self.until:
            return True
        self.cut.append(what)
        print("bench-scaling: the budget is spent: %s not run" % what, file=sys.stderr)
        return False


def run_training(r, s, nps, budget):
    """{load: {run: images/s, "rounds": {run: [...]}}}: one plain process (the baseline of
    scaling efficiency), then krug and DDP (and Horovod) at each rank count, rounds
    interleaved; rank counts past the budget are left out."""
    iters = TRAIN_ITERS + ["--num-iters", str(s.train_iters)]
    example = os.path.join(ROOT, "examples", "torch_synthetic_benchmark.py")
    ddp = os.path.join(HERE, "peers", "ddp_synthetic.py")
    model = suite.TRAIN_MODEL
    runs = {"plain": [suite.PYTHON, ddp, "--plain"] + model + iters}
    if r.have_horovod and suite.horovod_torch_differs(r):
        runs["hvd_plain"] = [r.hvd_python, ddp, "--plain"] + model + iters
    for np_ in nps:
        if r.have_krug_torch:
            runs["krug_np%d" % np_] = r.krug(np_, suite.PYTHON, example, *model, *iters)
        runs["ddp_np%d" % np_] = [suite.PYTHON, ddp, "--np", str(np_)] + model + iters
        if r.have_horovod:
            for key, ctl in suite.HOROVOD:
                runs["%s_np%d" % (key, np_)] = r.horovod(ctl, np_, example, *model, *iters)

    def total(text):
        found = [float(m.group(2)) for m in suite._TOTAL.finditer(text)]
        return sum(found) if found else None

    results = {load: {key: [] for key in runs} for load in s.loads}
    for i in range(max(1, s.train_rounds)):
        for load in s.loads:
            for key, cmd in runs.items():
                if not budget.allows("train.%s round %d (%s)" % (key, i + 1, load)):
                    continue
                got = r.parsed("train.%s.r%d" % (key, i + 1), cmd, total, load)
                if got:
                    results[load][key].append(got)
    return {load: suite.with_rounds(v) for load, v in results.items()}


# ---- tables -----------------------------------------------------------------------------------

SWEEP_TOOLS = ("krug", "mpi", "gloo")


def sweep_tables(views, nps, where):
    """Per load: bus bandwidth at each size and rank count, each tool's efficiency against its
    own at the fewest ranks, and krug over each peer."""
    parts = []
    for load, v in views.items():
        by_np = {np_: v["sweeps"].get(np_, {}).get("allreduce", {}) for np_ in nps}
        sizes = sorted({row["bytes"] for res in by_np.values() for rows in res.values()
                        for row in rows or []})
        tools = [t for t in SWEEP_TOOLS if any(res.get(t) for res in by_np.values())]
        rows = []
        for size in sizes:
            first = {}
            for np_ in nps:
                res = by_np[np_]
                row = {t: next((x for x in res.get(t) or [] if x["bytes"] == size), None)
                       for t in tools}
                cells = [suite.size_label(size), str(np_)]
                for t in tools:
                    bw = row[t]["busbw"] if row[t] else None
                    first.setdefault(t, bw)
                    cells += [suite.fmt_us(row[t]["time_us"]) if row[t] else "—",
                              suite.fmt(bw, "%.3f"),
                              suite.fmt(bw / first[t] if bw and first.get(t) else None)]
                cells += [suite.fmt_ratio(suite.ratio_peer_over_krug(row["krug"], row[p]))
                          for p in tools if p != "krug"]
                rows.append(cells)
        headers = ["size", "ranks"]
        for t in tools:
            name = suite.TOOL_TITLE[t]
            headers += ["%s µs" % name, "%s busbw" % name, "%s eff." % name]
        headers += ["krug/%s" % suite.TOOL_TITLE[p] for p in tools if p != "krug"]
        parts.append("### allreduce against ranks, %s (busbw in GB/s; eff. = busbw / busbw at %d "
                     "ranks, the same tool; krug/peer = peer's time / krug's, above 1 krug is "
                     "faster; median of interleaved rounds)\n\n%s"
                     % (where[load], nps[0], suite.table(headers, rows)))
    return parts


def small_tables(views, nps, where):
    parts = []
    for load, v in views.items():
        rows = []
        for np_ in nps:
            res = v["small"].get(np_)
            if not res:
                continue
            for key, what, _ in SMALL:
                got = res.get(key, {})
                k = got.get("krug_cpp")
                cells = [str(np_), what, suite.fmt_us(k and k["time_us"])]
                for p in ("mpi", "gloo"):
                    row = got.get(p)
                    cells += [suite.fmt_us(row and row["time_us"]),
                              suite.fmt_ratio(suite.ratio_peer_over_krug(k, row))]
                rows.append(cells)
        parts.append("### Small messages against ranks, %s (time per op or step in µs: krug-step "
                     "(C++ API), mpi_bench step, torch_gloo_bench step; krug/peer = peer's time / "
                     "krug's)\n\n%s" % (where[load], suite.table(
                         ["ranks", "measure", "krug µs", "Open MPI µs", "krug/Open MPI",
                          "torch Gloo µs", "krug/torch Gloo"], rows)))
    return parts


TRAIN_RUNS = (("krug", "krug"), ("ddp", "PyTorch DDP (Gloo)"),
              ("hvd_gloo", "Horovod, Gloo controller"), ("hvd_mpi", "Horovod, MPI controller"))


def efficiency(res, key, np_):
    """images/s at np_ ranks over np_ plain processes of the same torch."""
    plain = res.get("hvd_plain") if key.startswith("hvd") and res.get("hvd_plain") \
        else res.get("plain")
    v = res.get("%s_np%d" % (key, np_))
    return v / (np_ * plain) if v and plain else None


def training_tables(views, nps, where):
    parts = []
    for load, v in views.items():
        res = v.get("training")
        if not res:
            continue
        keys = [(k, w) for k, w in TRAIN_RUNS if any("%s_np%d" % (k, n) in res.get("rounds", {})
                                                     for n in nps)]
        rows = []
        for np_ in nps:
            cells = [str(np_)]
            for k, _ in keys:
                cells += [suite.fmt(res.get("%s_np%d" % (k, np_)), "%.1f"),
                          suite.fmt(efficiency(res, k, np_))]
            k, d = res.get("krug_np%d" % np_), res.get("ddp_np%d" % np_)
            cells.append(suite.fmt(k / d if k and d else None))
            rows.append(cells)
        headers = ["ranks"]
        for _, w in keys:
            headers += ["%s images/s" % w, "%s eff." % w]
        headers.append("krug/DDP")
        parts.append("### Training throughput against ranks, %s: ResNet-18, synthetic 64x64, "
                     "batch 16 per rank, 1 torch thread per rank (eff. = images/s / (ranks x one "
                     "plain process: %s images/s); median of interleaved rounds)\n\n%s"
                     % (where[load], suite.fmt(res.get("plain"), "%.1f"),
                        suite.table(headers, rows)))
    return parts


def plot(results, path):
    """Efficiency against ranks: training (krug, DDP) and allreduce bus bandwidth at 16 MiB
    (krug, Open MPI, torch Gloo); solid idle, dotted loaded."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plot: python3-matplotlib is not installed", file=sys.stderr)
        return False
    nps, views = results["nps"], results["by_load"]
    fig, (train_ax, bw_ax) = plt.subplots(1, 2, figsize=(10, 3.8))
    styles, markers = {"idle": "-", "loaded": ":"}, {"idle": "o", "loaded": "x"}
    for load, v in views.items():
        res = v.get("training") or {}
        for i, (k, w) in enumerate(TRAIN_RUNS):
            ys = [efficiency(res, k, n) for n in nps]
            if any(y is not None for y in ys):
                train_ax.plot(nps, ys, marker=markers[load], linestyle=styles[load],
                              color="C%d" % i, label="%s, %s" % (w, load))
        for i, t in enumerate(SWEEP_TOOLS):
            ys = []
            for n in nps:
                rows = v["sweeps"].get(n, {}).get("allreduce", {}).get(t) or []
                ys.append(next((x["busbw"] for x in rows if x["bytes"] == 16 << 20), None))
            if any(y is not None for y in ys):
                bw_ax.plot(nps, ys, marker=markers[load], linestyle=styles[load],
                           color="C%d" % i, label="%s, %s" % (suite.TOOL_TITLE[t], load))
    train_ax.set_title("ResNet-18 training: scaling efficiency")
    train_ax.set_ylabel("images/s / (ranks x plain)")
    bw_ax.set_title("allreduce of 16 MiB: bus bandwidth")
    bw_ax.set_ylabel("GB/s")
    for ax in (train_ax, bw_ax):
        ax.set_xscale("log", base=2)
        ax.set_xticks(nps, [str(n) for n in nps])
        ax.set_xlabel("ranks (one per core)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="x-small")
    fig.suptitle("Scaling, %s (%s cores; dotted, x: loaded machine)"
                 % (results["machine"]["date"], results["machine"]["cores"]), fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def report(results, command, cut, errors):
    m = results["machine"]
    nps, views = results["nps"], results["by_load"]
    where = {load: suite.load_label(load, results["load_procs"]) for load in views}
    parts = suite.run_header(m, command)
    parts += sweep_tables(views, nps, where)
    parts += small_tables(views, nps, where)
    parts += training_tables(views, nps, where)
    if cut:
        parts.append("### Not run (the budget was spent)\n\n" + "\n".join("- " + c for c in cut))
    if errors:
        parts.append("### Errors\n\n" + "\n".join("- " + e for e in errors))
    return "\n\n".join(parts) + "\n"


def update_docs(text, plot_path):
    suite.rewrite_docs_block(DOCS_BEGIN, DOCS_END, "Scaling results", text, plot_path,
                             "bench-scaling.png", "Scaling efficiency against ranks")


def missing_parts(view, np_, train):
    """What of krug's own figures a run lacks: the smoke test's check."""
    missing = []
    if not view["sweeps"].get(np_, {}).get("allreduce", {}).get("krug"):
        missing.append("no allreduce sweep of krug at %d ranks" % np_)
    small = view["small"].get(np_) or {}
    missing += ["no %s of krug at %d ranks" % (what, np_) for key, what, _ in SMALL
                if not (small.get(key) or {}).get("krug_cpp")]
    if train and not (view.get("training") or {}).get("krug_np%d" % np_):
        missing.append("no training throughput of krug at %d ranks" % np_)
    return missing


def main(argv=None):
    args, s = parse_args(argv)
    command = " ".join(["scripts/bench-scaling"] + (argv if argv is not None else sys.argv[1:]))
    r = suite.Runner(s)
    for path in (r.krugrun, r.bin["krug-bench"], r.bin["krug-step"]):
        if not os.access(path, os.X_OK):
            sys.exit("bench-scaling: %s is missing: build it (ninja -C %s krugrun krug-bench "
                     "krug-step)" % (path, s.build_dir))
    for have, what in ((r.have_mpi, "Open MPI (mpirun and build/bench/mpi_bench)"),
                       (r.have_torch, "torch (%s cannot import torch.distributed)" % suite.PYTHON),
                       (r.have_krug_torch, "krug.torch (not built in %s)" % s.build_dir)):
        if not have:
            print("bench-scaling: left out, not found here: %s" % what, file=sys.stderr)
    if args.horovod and not r.have_horovod:
        r.errors.append("--horovod: %s cannot import horovod.torch (scripts/install-horovod)"
                        % r.hvd_python)
    budget = Budget(args.budget)
    t0 = time.monotonic()
    nps = s.nps
    views = {load: {"sweeps": {}, "small": {}, "training": None} for load in s.loads}
    results = {"machine": suite.machine_info(r), "command": command, "nps": nps,
               "load_procs": s.load_procs, "by_load": views}
    for np_ in nps:
        if budget.allows("the allreduce sweep at %d ranks" % np_):
            for load, got in suite.run_sweeps(r, s, np_).items():
                views[load]["sweeps"][np_] = got
    for np_ in nps:
        if budget.allows("the small messages at %d ranks" % np_):
            for load, got in suite.run_small_ops(r, s, np_, keys=SMALL_KEYS).items():
                views[load]["small"][np_] = got
    if not args.no_train and r.have_torch:
        for load, got in run_training(r, s, nps, budget).items():
            views[load]["training"] = got
    if args.smoke:
        r.errors += missing_parts(views[s.loads[0]], nps[0], not args.no_train and
                                  r.have_krug_torch)
    results["errors"], results["not_run"] = r.errors, budget.cut
    results["seconds"] = round(time.monotonic() - t0, 1)
    text = report(results, command, budget.cut, r.errors)
    text += "\nThe runs took %s.\n" % suite.duration(results["seconds"])
    plot_path = suite.write_results(s.out, results, text, plot, "scaling.png")
    if args.update_docs:
        update_docs(text, plot_path)
    if r.errors:
        print("bench-scaling: %d run(s) failed:\n  %s" % (len(r.errors), "\n  ".join(r.errors)),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
