#!/usr/bin/env bash
# krug as an installed package: `cmake --install` of the build under test into a fresh prefix,
# then an outside project built from that prefix alone, with find_package(krug CONFIG) and with
# pkg-config, each program run with 2 ranks by the installed krugrun.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR WORK_DIR
set -euo pipefail
build=$1 src=$2 work=$3
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" >"$work/install.log"
for f in include/krug/krug.h include/krug/version.h lib/libkrug.so bin/krugrun \
         lib/cmake/krug/krugConfig.cmake lib/cmake/krug/krugTargets.cmake lib/pkgconfig/krug.pc; do
  [ -e "$prefix/$f" ] || { echo "FAIL: $f not installed"; exit 1; }
done
"$prefix/bin/krugrun" --version

echo "== find_package(krug CONFIG REQUIRED)"
cmake -S "$src/tests/packaging/consumer" -B "$work/consumer" -G Ninja \
  -DCMAKE_PREFIX_PATH="$prefix" -DKRUG_EXAMPLE_SOURCE="$src/examples/cpp/average.cpp" \
  >"$work/consumer-configure.log"
cmake --build "$work/consumer" >"$work/consumer-build.log"
# The program links the installed libkrug, not the build tree's (the prefix may itself lie in the
# build tree, so the resolved path is compared, not searched for the build folder's name).
libkrug=$(ldd "$work/consumer/average" | awk '$1 == "libkrug.so" {print $3}')
if [ "$(realpath "$libkrug")" != "$(realpath "$prefix/lib/libkrug.so")" ]; then
  echo "FAIL: the consumer links $libkrug, not the installed $prefix/lib/libkrug.so:"
  ldd "$work/consumer/average"; exit 1
fi
"$prefix/bin/krugrun" -np 2 "$work/consumer/average"

echo "== pkg-config krug"
flags=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs krug)
g++ -std=c++20 "$src/examples/cpp/average.cpp" $flags -o "$work/average-pc"
"$prefix/bin/krugrun" -np 2 "$work/average-pc"
echo "install test passed"
