#!/usr/bin/env bash
# The installed package as a downstream project sees it: cmake --install BUILD into a fresh
# prefix, build tests/downstream against it with find_package(lightseg), run it on the bundled
# example with the installed model, check its output. Usage: run.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
for f in include/lightseg/lightseg.h include/lightseg/features.h lib/liblightseg_core.a \
         lib/cmake/lightseg/lightsegConfig.cmake share/lightseg/models/camvid.lsw bin/lightseg; do
  [ -e "$tmp/prefix/$f" ] || { echo "downstream: $f is not installed" >&2; exit 1; }
done
# The public face: no installed header reaches for nlohmann-json, an internal header (src/) or
# the process-wide hooks (the MAC counter, SyncBN, gradient sync); the package needs no nlohmann.
if grep -rnE '#include *[<"](nlohmann/|core/|data/|infer/|train/|dist/|model/hooks|serve/http)|MacCounter|set_batchnorm_allreduce|GradientSync' \
     "$tmp/prefix/include"; then
  echo "downstream: an installed header exposes an internal (above)" >&2; exit 1
fi
if grep -q nlohmann "$tmp/prefix/lib/cmake/lightseg/"*.cmake; then
  echo "downstream: the installed package depends on nlohmann-json" >&2; exit 1
fi
torch_dir=$(sed -n 's/^Torch_DIR:PATH=//p' "$build/CMakeCache.txt")
cmake -S "$src/tests/downstream" -B "$tmp/b" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$tmp/prefix" ${torch_dir:+-DTorch_DIR="$torch_dir"} >/dev/null
cmake --build "$tmp/b" >/dev/null
out=$("$tmp/b/segment_one" "$tmp/prefix/share/lightseg/models/camvid.lsw" "$src/examples/0016E5_07959.png" "$tmp/color.png")
echo "downstream: $out"
case "$out" in 480x360,*) ;; *) echo "downstream: unexpected output" >&2; exit 1 ;; esac
[ "$(head -c 8 "$tmp/color.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || { echo "downstream: no PNG written" >&2; exit 1; }
# the default Predictor of a downstream program finds the installed model (before the source tree's)
out=$("$tmp/b/segment_one" default "$src/examples/0016E5_07959.png" "$tmp/color2.png" 2>"$tmp/default.err")
echo "downstream: default: $out; $(cat "$tmp/default.err")"
grep -q "^default weights: $tmp/prefix/share/lightseg/models/camvid.lsw\$" "$tmp/default.err" ||
  { echo "downstream: the default Predictor did not use the installed model" >&2; exit 1; }
# ... also when the prefix has been moved after installation (the package is relocatable)
mv "$tmp/prefix" "$tmp/moved"
rm -rf "$tmp/b"
cmake -S "$src/tests/downstream" -B "$tmp/b" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$tmp/moved" ${torch_dir:+-DTorch_DIR="$torch_dir"} >/dev/null
cmake --build "$tmp/b" >/dev/null
"$tmp/b/segment_one" default "$src/examples/0016E5_07959.png" "$tmp/color3.png" 2>"$tmp/default.err" >/dev/null
grep -q "^default weights: $tmp/moved/share/lightseg/models/camvid.lsw\$" "$tmp/default.err" ||
  { echo "downstream: after moving the prefix: $(cat "$tmp/default.err")" >&2; exit 1; }
mv "$tmp/moved" "$tmp/prefix"
# the installed CLI finds the installed model by itself
"$tmp/prefix/bin/lightseg" segment "$src/examples/0016E5_07959.png" --out "$tmp/cli" --format ids >/dev/null
[ -f "$tmp/cli/0016E5_07959.png" ] || { echo "downstream: the installed CLI wrote nothing" >&2; exit 1; }
echo "downstream: ok"
