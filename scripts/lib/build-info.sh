# shellcheck shell=bash
# Sourced by the benchmark drivers (scripts/bench-suite, scripts/bench-scaling): what a build
# folder says about itself.

# build_python BUILD: the interpreter the build's torch binding was made for (its build
# information); nothing where the build has none.
build_python() {
  local info="$1/python/krug/_build_info.py"
  [ -f "$info" ] && sed -n 's/^python = r"\(.*\)"$/\1/p' "$info"
  return 0
}

# build_has BUILD TARGET...: prints those of the targets the build defines, one a line (those
# its configuration found the dependencies of), in the order given.
build_has() {
  local build=$1 available t
  shift
  available=$(ninja -C "$build" -t targets all 2>/dev/null | sed 's/:.*//')
  for t in "$@"; do
    if grep -qx "$t" <<< "$available"; then echo "$t"; fi
  done
}
