#!/usr/bin/env bash
# An experiment never silently runs on another text: from a copy of the
# project with no shared data beside it, residual_ablation.lua stops with an
# error that says where it looked; given another text with --data it runs,
# and every verdict reads 'not comparable'.
#   test_data_rule.sh ANATOMY_EXE SOURCE_DIR
set -euo pipefail
exe="$1"; src="$2"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/clone"
cp -r "$src/lua" "$src/examples" "$tmp/clone/"
export ANATOMY_LUA_PATH="$tmp/clone/lua"
unset ANATOMY_DATA

set +e
out="$(cd "$tmp" && "$exe" --threads=1 "$tmp/clone/examples/residual_ablation.lua" --out="$tmp/out" 2>&1)"
rc=$?
set -e
fail() { echo "FAIL: $1"; echo "$out"; exit 1; }
[[ $rc -ne 0 ]] || fail "expected a non-zero exit without the data, got 0"
for want in "the claims of this experiment were made on Tiny Shakespeare (tinyshakespeare.txt), which was not found; looked in:" \
            "$tmp/clone/shared/data/tinyshakespeare.txt" "$tmp/shared/data/tinyshakespeare.txt" \
            '($ANATOMY_DATA is not set)' "HINT: --data=PATH/tinyshakespeare.txt, or ANATOMY_DATA=FOLDER"; do
  grep -qF -- "$want" <<<"$out" || fail "the error does not say: $want"
done
[[ ! -e "$tmp/out/results.json" ]] || fail "results were written although the run stopped"
echo "ok    without the data: exit $rc, the error names every folder it looked in"

kjv="$("$exe" -e 'print(data.default_text())')"
out="$(cd "$tmp" && "$exe" --threads=1 "$tmp/clone/examples/residual_ablation.lua" --smoke=true --data="$kjv" --out="$tmp/out" 2>&1)" \
  || fail "the run with --data=$kjv failed"
table="$(awk '/^\| claim /{on=1; getline; next} on && /^\| /{print; next} on{exit}' <<<"$out")"
rows="$(grep -c '^| ' <<<"$table" || true)"
[[ "$rows" -ge 5 ]] || fail "expected the claims table, got $rows rows"
bad="$(grep -vF '| smoke run: not meaningful; not comparable (data: kjv.txt) |' <<<"$table" || true)"
[[ -z "$bad" ]] || fail "rows whose verdict is not 'not comparable': $bad"
grep -qF '"comparable":false' "$tmp/out/results.json" || fail "results.json does not record comparable = false"
echo "ok    with --data=kjv.txt (a smoke run): $rows verdicts, all 'smoke run: not meaningful; not comparable (data: kjv.txt)'"
echo "2 passed, 0 failed"
