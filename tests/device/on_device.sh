#!/usr/bin/env bash
# Runs one Lua test file with --device=DEVICE (cuda or accel). Exit 77 (skip)
# only when this build or machine has no such device, saying which; an
# executable that cannot start (a missing library, a crash) is a failure.
#   on_device.sh DEVICE ANATOMY TEST.lua
set -uo pipefail
device="$1"
exe="$2"
test="$3"
case "$device" in
  cuda) ask='if torch.cuda.is_available() then print("yes") elseif torch.version.cuda then print("no GPU is visible (CUDA " .. torch.version.cuda .. " build)") else print("this build has no CUDA (LibTorch " .. torch.__version__ .. ")") end' ;;
  accel) ask='local ok, err = pcall(torch.device, "accel"); print(ok and "yes" or tostring(err):gsub("^.-%(", "("))' ;;
  *) echo "on_device.sh: unknown device '$device' (cuda or accel)" >&2; exit 2 ;;
esac
why="$("$exe" -e "$ask" 2>&1)"
status=$?
if ((status != 0)) || [[ -z "$why" ]]; then
  echo "FAIL: $exe cannot start (exit $status), so $(basename "$test") cannot run on $device:"
  echo "$why"
  exit 1
fi
if [[ "$why" != yes ]]; then
  echo "skip: $(basename "$test") on $device: $why"
  exit 77
fi
exec "$exe" --device="$device" --threads=1 "$test"
