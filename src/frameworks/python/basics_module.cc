// krug.common._basics: krug's lifecycle, topology, process-set and elastic calls for the
// frontends that have no pybind11 module of their own (krug.tensorflow, krug.keras; their
// operations are TensorFlow ops in _tensorflow_ops). Nothing here depends on a framework.
#include <pybind11/pybind11.h>

#include "frameworks/python/basics.h"

PYBIND11_MODULE(_basics, m) {
  m.doc() = "krug's framework-free calls (internal; use krug.tensorflow or krug.keras)";
  krug::python::define_basics(m);
}
