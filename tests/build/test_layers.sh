#!/usr/bin/env bash
# The layer rule as a build fact (docs/DESIGN.md, "Layers"): a file of host/
# that includes a Lua header does not compile, one of bindings/ does. Builds
# the two probe targets (tests/build/layer_probe.cpp against anatomy_host's
# and anatomy_bindings' usage requirements) and checks each outcome.
#   test_layers.sh BUILD_DIR
set -uo pipefail
build="$1"
out="$(cmake --build "$build" --target anatomy_layer_probe_host 2>&1)"
if [[ $? -eq 0 ]]; then
  echo "FAIL: a Lua include compiled with anatomy_host's include path (host/ can reach LuaJIT's headers)"
  exit 1
fi
if ! grep -q "lua.hpp" <<<"$out"; then
  echo "FAIL: the host probe failed, but not on the Lua include:"
  echo "$out" | tail -20
  exit 1
fi
echo "ok    host/: #include <lua.hpp> is a compile error ($(grep -m1 -o 'lua.hpp[^"]*' <<<"$out"))"
out="$(cmake --build "$build" --target anatomy_layer_probe_bindings 2>&1)" || {
  echo "FAIL: the same include does not compile with anatomy_bindings' include path:"
  echo "$out" | tail -20
  exit 1
}
echo "ok    bindings/: #include <lua.hpp> compiles"
echo "2 passed, 0 failed"
