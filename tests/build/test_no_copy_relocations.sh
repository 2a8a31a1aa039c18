#!/usr/bin/env bash
# The executable holds no copy relocation: no object of a shared library
# (std::cerr, a vtable, a typeinfo) copied into it. The SentencePiece plugin
# is loaded with RTLD_DEEPBIND and binds to the library's own copy of such an
# object, which nothing initialises: with std::cerr copied, SentencePiece's
# first log line was a SIGSEGV (CMakeLists.txt builds everything with -fPIC).
#   test_no_copy_relocations.sh EXE
set -euo pipefail
exe="$1"
command -v readelf >/dev/null || { echo "skip: no readelf (binutils)"; exit 77; }
copies="$(readelf -rW "$exe" | awk '$3 == "R_X86_64_COPY" || $3 == "R_AARCH64_COPY" {print $5}')"
if [[ -n "$copies" ]]; then
  echo "FAIL: $exe has $(wc -l <<<"$copies") copy relocation(s), which an RTLD_DEEPBIND plugin does not see:"
  (c++filt 2>/dev/null || cat) <<<"$copies" | head -20
  exit 1
fi
echo "ok: no copy relocation in $exe"
