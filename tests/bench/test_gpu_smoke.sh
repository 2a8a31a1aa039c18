#!/usr/bin/env bash
# scripts/bench-gpu --smoke: the GPU benchmark's three scripts run end to end
# at toy sizes on this machine (the CPU, or a GPU where there is one), the
# report prints every case and says its numbers mean nothing, and
# bench/RESULTS.md is left as it was.
#   test_gpu_smoke.sh ANATOMY PYTHON
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
anatomy="$1" python="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
before="$(sha256sum "$root/bench/RESULTS.md")"
ANATOMY_BENCH_OUT="$tmp/rounds" "$root/scripts/bench-gpu" --smoke --rounds=1 --anatomy="$anatomy" --python="$python" >"$tmp/report.txt"
cat "$tmp/report.txt"
grep -q 'Smoke run (.*): these numbers mean nothing and are not written to bench/RESULTS.md' "$tmp/report.txt" ||
  { echo "FAIL: the report does not say it is a smoke run" >&2; exit 1; }
for c in gpt vibenet_plain vibenet_gate seed_L2 seed_L12; do
  grep -q "^| $c | " "$tmp/report.txt" || { echo "FAIL: no row for $c" >&2; exit 1; }
done
grep -q '^autopsy (' "$tmp/report.txt" && grep -q '^idle_probes (' "$tmp/report.txt" ||
  { echo "FAIL: the autopsy's or the idle probes' cost is missing" >&2; exit 1; }
[[ "$(sha256sum "$root/bench/RESULTS.md")" == "$before" ]] || { echo "FAIL: a smoke run changed bench/RESULTS.md" >&2; exit 1; }
# options are checked before anything runs
if "$root/scripts/bench-gpu" --rounds=0 2>"$tmp/err"; then echo "FAIL: --rounds=0 was accepted" >&2; exit 1; fi
grep -q "rounds must be a positive whole number, got '0'" "$tmp/err" || { cat "$tmp/err"; exit 1; }
echo "ok: scripts/bench-gpu --smoke"
