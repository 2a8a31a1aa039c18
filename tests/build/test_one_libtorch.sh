#!/usr/bin/env bash
# The executable loads LibTorch from one folder only: the one CMake found.
# A 2.x build that also loads Debian's 1.13 libtorch/libc10 crashes before
# main; this catches a link line that mixes them.
#   test_one_libtorch.sh EXE EXPECTED_LIB_DIR
set -euo pipefail
exe="$1"
want="$(realpath "$2")"
libs="$(ldd "$exe" | awk '$1 ~ /^lib(torch|c10)/ {print $1 " " $3}')"
[[ -n "$libs" ]] || { echo "ldd shows no libtorch or libc10 in $exe"; exit 1; }
bad=0
while read -r name path; do
  [[ "$path" == "not" || -z "$path" ]] && { echo "$name: not found"; bad=1; continue; }
  dir="$(dirname "$(realpath "$path")")"
  if [[ "$dir" != "$want" ]]; then
    echo "$name comes from $dir, expected $want"
    bad=1
  else
    echo "$name: $path"
  fi
done <<< "$libs"
if ((bad)); then echo "1 passed, 1 failed"; exit 1; fi
echo "1 passed, 0 failed"
