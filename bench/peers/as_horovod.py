#!/usr/bin/env python3
"""Runs a krug.torch benchmark script with Horovod in krug's place, so that krug and Horovod run
the very same code (krug.torch is Horovod's API).

    horovodrun -np 2 --gloo /opt/krug/horovod-venv/bin/python bench/peers/as_horovod.py \
        bench/krug_small_ops.py --tensors 100 --tensor-bytes 1K

`import krug.torch as hvd` in SCRIPT gets horovod.torch; SCRIPT then runs as __main__ with its
own folder first on sys.path, as `python SCRIPT ARGS` would. scripts/bench-suite --horovod runs
bench/krug_torch_sweep.py, bench/krug_small_ops.py and examples/torch_synthetic_benchmark.py
this way (scripts/install-horovod builds Horovod).
"""
import os
import runpy
import sys
import types


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: as_horovod.py SCRIPT [ARGS...]")
    import horovod.torch
    # A stand-in package, so that `import krug.torch` finds horovod.torch and never looks for
    # krug itself (Horovod's interpreter has no krug).
    krug = types.ModuleType("krug")
    krug.torch = horovod.torch
    sys.modules["krug"] = krug
    sys.modules["krug.torch"] = horovod.torch
    script = os.path.abspath(sys.argv[1])
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
