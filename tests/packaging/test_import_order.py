"""krug's Python packages import in any order: no import circle between them.

A circle bites only when the first module of it to be imported is entered first, so:
- statically, the imports Python runs while loading krug's modules form no circle between
  krug's packages (then no order of imports can meet a half-initialized module);
- no frontend imports, even from inside a function, a frontend built on it (krug.tensorflow
  never imports krug.keras or krug.tensorflow.keras: they import krug.tensorflow);
- in a fresh interpreter, each frontend built here imported first loads no other frontend, and
  krug.tensorflow wraps a Keras optimizer without loading a Keras frontend.
"""

import ast
import os
import pathlib
import subprocess
import sys

import pytest

import krug
from krug import _build_info

PACKAGE = pathlib.Path(krug.__file__).resolve().parent

# krug's packages, most specific first: a module belongs to the first that contains it.
PACKAGES = ("krug.tensorflow.keras", "krug.tensorflow", "krug.keras", "krug._keras",
            "krug.torch", "krug.jax", "krug.common", "krug.spark", "krug.ray")

# The frontends and the packages each imports when it is loaded (besides krug.common and
# krug's own top-level modules): krug.keras and krug.tensorflow.keras are built on
# krug.tensorflow and krug._keras.
FRONTENDS = {
    "krug.torch": set(),
    "krug.tensorflow": set(),
    "krug.keras": {"krug.tensorflow", "krug._keras"},
    "krug.tensorflow.keras": {"krug.tensorflow", "krug._keras"},
    "krug.jax": set(),
}
# ... and from inside a function: krug.tensorflow wraps a Keras optimizer with krug._keras.
LATER = {"krug.tensorflow": {"krug._keras"}}
BUILT = {"krug.torch": _build_info.torch_built,
         "krug.tensorflow": _build_info.tensorflow_built,
         "krug.keras": _build_info.tensorflow_built,
         "krug.tensorflow.keras": _build_info.tensorflow_built,
         "krug.jax": _build_info.jax_built}


def package_of(module):
    """The package of PACKAGES that holds ``module``, else the top-level module of krug
    (``krug``, ``krug.info``, ...), else None (not krug's)."""
    for package in PACKAGES:
        if module == package or module.startswith(package + "."):
            return package
    if module == "krug" or module.startswith("krug."):
        return ".".join(module.split(".")[:2])
    return None


def module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(node):
    """The modules an import statement names (``from a import b`` may import ``a.b``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module] + [node.module + "." + alias.name for alias in node.names]
    return []


def statements(tree, load_time):
    """Every node of ``tree``; with ``load_time``, only those Python runs when it loads the
    module (not the bodies of functions)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if load_time and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def package_imports(load_time):
    """{package: {imported package: [the module that imports it, ...]}} between krug's
    packages (and top-level modules)."""
    edges = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        source = package_of(module)
        for node in statements(ast.parse(path.read_text(), str(path)), load_time):
            for name in imported(node):
                target = package_of(name)
                if target is not None and target != source:
                    edges.setdefault(source, {}).setdefault(target, []).append(module)
    return edges


def find_circle(edges):
    """A list of packages that import each other in a circle, or None."""
    state = {}

    def visit(package, path):
        state[package] = "open"
        for target in sorted(edges.get(package, {})):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state:
                circle = visit(target, path + [target])
                if circle:
                    return circle
        state[package] = "done"
        return None

    for package in sorted(edges):
        if package not in state:
            circle = visit(package, [package])
            if circle:
                return circle
    return None


def test_the_checks_see_a_circle():
    assert find_circle({"a": {"b": []}, "b": {"c": []}, "c": {"a": []}}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b": []}, "b": {"c": []}}) is None
    assert package_of("krug.tensorflow.keras.callbacks") == "krug.tensorflow.keras"
    assert package_of("krug.tensorflow.mpi_ops") == "krug.tensorflow"
    assert package_of("krug._build_info") == "krug._build_info"
    assert package_of("keras") is None


def test_loading_krug_imports_no_circle():
    edges = package_imports(load_time=True)
    circle = find_circle(edges)
    assert circle is None, "import circle at load time: " + " -> ".join(
        "%s (%s)" % (a, ", ".join(sorted(set(edges[a][b])))) for a, b in zip(circle, circle[1:]))


@pytest.mark.parametrize("frontend", sorted(FRONTENDS))
def test_frontend_imports_no_frontend_built_on_it(frontend):
    edges = package_imports(load_time=False).get(frontend, {})
    others = {f for f in FRONTENDS if f != frontend} | {"krug._keras"}
    wrong = {target: sorted(set(modules)) for target, modules in edges.items()
             if target in others - FRONTENDS[frontend] - LATER.get(frontend, set())}
    assert not wrong, "%s imports %s" % (frontend, wrong)


# Imports a frontend first in a fresh interpreter and prints the krug packages that loaded;
# for krug.tensorflow, also after wrapping a Keras optimizer.
PROBE = r"""
import importlib, sys
sys.path[:0] = [sys.argv[2]]
from test_import_order import package_of
def loaded():
    return sorted({package_of(m) for m in list(sys.modules) if package_of(m)})
importlib.import_module(sys.argv[1])
print("import", *loaded())
if sys.argv[1] == "krug.tensorflow":
    import keras, krug.tensorflow as hvd
    hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    print("wrap", *loaded())
"""


@pytest.mark.parametrize("frontend", sorted(f for f in FRONTENDS if BUILT[f]))
def test_frontend_imported_first_loads_no_other_frontend(frontend):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, "-c", PROBE, frontend, os.path.dirname(__file__)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    loaded = {line.split()[0]: set(line.split()[1:]) for line in out.stdout.splitlines()
              if line.split()[:1] in (["import"], ["wrap"])}
    assert frontend in loaded.get("import", ()), out.stdout
    allowed = {frontend, "krug.common"} | FRONTENDS[frontend]
    for what, packages in loaded.items():
        if what == "wrap":
            allowed |= LATER[frontend]
        frontends = {p for p in packages if p in FRONTENDS or p == "krug._keras"}
        assert frontends <= allowed, "%s: after %s, loaded %s" % (frontend, what, packages)
