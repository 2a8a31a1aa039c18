#!/usr/bin/env bash
# The HTML report in a real browser: headless Chromium (Debian's chromium)
# loads it with no console errors, every chart has data, and each chart has
# what a reader needs (check_charts.py: ticks and titles on both axes, a
# legend or a colour bar, a label on every heatmap row, a removal chart that
# shows 0.1% differences). A screenshot is left in OUT_DIR to look at.
# Installs chromium when it is missing; exits 77 (skipped) only if it cannot.
#   test_report.sh ANATOMY_EXECUTABLE SOURCE_DIR [OUT_DIR]
source "$(dirname "${BASH_SOURCE[0]}")/../shell_test.sh"

browser="$(command -v chromium || true)"
if [[ -z "$browser" ]]; then
  echo "chromium is missing: installing it"
  if [[ $(id -u) -eq 0 ]] && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1; then
    browser="$(command -v chromium)"
  else
    echo "SKIPPED: chromium is not installed and could not be installed (apt-get install chromium)"
    exit 77
  fi
fi

expected="$("$exe" --threads=1 "$src/tests/report/make_report.lua" "$dir/report.html" "$dir/compare.html")" || { echo "FAIL: the report was not written"; exit 1; }
"$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --user-data-dir="$dir/profile" --enable-logging=stderr --v=0 \
  --dump-dom "file://$dir/report.html" >"$dir/dom.html" 2>"$dir/console.log"

grep -q '</html>' "$dir/dom.html"; check "chromium loaded the report" $? "no DOM came back"
errors="$(grep -E 'CONSOLE|Uncaught|ERROR:.*(file|resource)' "$dir/console.log" | grep -v -E 'dbus|gpu|GPU|sandbox|Fontconfig|crashpad|ALSA|udev|viz' || true)"
[[ -z "$errors" ]]; check "no console errors" $? "$errors"
charts="$(grep -o '<svg class="chart"[^>]*data-points="[0-9]*"' "$dir/dom.html" | wc -l)"
[[ "$charts" -eq "$expected" ]]; check "all $expected charts are there" $? "found $charts"
empty="$(grep -o '<svg class="chart"[^>]*data-points="0"' "$dir/dom.html" | wc -l)"
[[ "$empty" -eq 0 ]]; check "every chart has data" $? "$empty charts have no data points"
grep -q '<td>blocks.3</td>' "$dir/dom.html"; check "the table lists every layer" $? "no row for blocks.3"
python3 "$src/tests/report/check_charts.py" "$dir/dom.html" removal_loss >"$dir/charts.log"
check "every chart has its axes, legend or colour bar, and row labels ($(tail -1 "$dir/charts.log"))" $? "$(grep FAIL "$dir/charts.log" | head -5)"
png="${out:-$dir}/autopsy.png"
[[ -z "$out" ]] || { mkdir -p "$out"; cp "$dir/report.html" "$out/autopsy.html"; cp "$dir/compare.html" "$out/compare.html"; }
ANATOMY_SCREENSHOT_HEIGHT=5200 "$src/scripts/report-screenshot" "$dir/report.html" "$png" >/dev/null 2>&1 && [[ -s "$png" ]]
check "report-screenshot makes a PNG ($png)" $? "no screenshot"

# the comparison report: the same checks on its charts, and its screenshot
"$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --user-data-dir="$dir/profile" --dump-dom "file://$dir/compare.html" \
  >"$dir/compare-dom.html" 2>/dev/null
grep -q 'class="differs"' "$dir/compare-dom.html"; check "the comparison highlights the cells that differ" $? "no highlighted cell"
python3 "$src/tests/report/check_charts.py" "$dir/compare-dom.html" "" >"$dir/compare-charts.log"
curves="$(grep -o '<svg class="chart" data-kind="lines"' "$dir/compare-dom.html" | wc -l)"
[[ "$curves" -eq 6 ]] && grep -q '^[0-9]* passed, 0 failed' "$dir/compare-charts.log"
check "the comparison's 6 overlaid curves have axes and legends ($(tail -1 "$dir/compare-charts.log"))" $? "$curves curves; $(grep FAIL "$dir/compare-charts.log" | head -3)"
png="${out:-$dir}/compare.png"
ANATOMY_SCREENSHOT_HEIGHT=3000 "$src/scripts/report-screenshot" "$dir/compare.html" "$png" >/dev/null 2>&1 && [[ -s "$png" ]]
check "report-screenshot makes a PNG of the comparison ($png)" $? "no screenshot"

# the main job's own report (scripts/autopsy.lua on its default text; fewer steps than its 1000)
"$exe" --threads=2 "$src/scripts/autopsy.lua" --steps=100 --batch=16 --probe_every=25 --batches=2 --out="$dir/main" >"$dir/main.log" 2>&1
check "the main job (100 steps) writes its report" $? "$(tail -3 "$dir/main.log")"
"$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --user-data-dir="$dir/profile" --dump-dom "file://$dir/main/autopsy.html" \
  >"$dir/main-dom.html" 2>/dev/null
python3 "$src/tests/report/check_charts.py" "$dir/main-dom.html" removal_loss >"$dir/main-charts.log"
check "the main job's charts have their axes, legends or colour bars, and row labels ($(tail -1 "$dir/main-charts.log"))" $? \
  "$(grep FAIL "$dir/main-charts.log" | head -3)"
png="${out:-$dir}/main_job.png"
[[ -z "$out" ]] || cp "$dir/main/autopsy.html" "$out/main_job.html"
ANATOMY_SCREENSHOT_HEIGHT=6000 "$src/scripts/report-screenshot" "$dir/main/autopsy.html" "$png" >/dev/null 2>&1 && [[ -s "$png" ]]
check "report-screenshot makes a PNG of the main job's report ($png)" $? "no screenshot"
summary
