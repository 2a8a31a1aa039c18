#!/usr/bin/env bash
# Runs one Lua test file with --device=cuda; exit 77 (skip) when this build or
# machine has no GPU, saying which.
#   on_gpu.sh ANATOMY TEST.lua
set -uo pipefail
exe="$1"
test="$2"
why="$("$exe" -e 'if torch.cuda.is_available() then print("yes") elseif torch.version.cuda then print("no GPU is visible (CUDA " .. torch.version.cuda .. " build)") else print("this build has no CUDA (LibTorch " .. torch.__version__ .. ")") end')"
if [[ "$why" != yes ]]; then
  echo "skip: $(basename "$test") on cuda: $why"
  exit 77
fi
exec "$exe" --device=cuda --threads=1 "$test"
