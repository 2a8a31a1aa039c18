# What the shell tests that run the built anatomy share; sourced, with the
# test's own arguments: SCRIPT ANATOMY_EXECUTABLE SOURCE_DIR [OUT_DIR] ->
# exe, src, out; dir, a temporary folder removed on exit; check NAME STATUS
# DETAIL counts and prints one result, summary the counts (failing if any did).
set -uo pipefail
exe="$1"
src="$2"
out="${3:-}"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT

passed=0
failed=0
check() {  # check NAME CONDITION-RESULT DETAIL
  if [[ "$2" == 0 ]]; then echo "ok    $1"; passed=$((passed + 1)); else echo "FAIL  $1: $3"; failed=$((failed + 1)); fi
}
summary() {
  echo "$passed passed, $failed failed"
  [[ "$failed" -eq 0 ]]
}
