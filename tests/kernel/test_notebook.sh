#!/usr/bin/env bash
# examples/autopsy.ipynb executed by Jupyter (Debian's nbconvert) on the
# installed kernel: every cell runs without error, and the HTML holds the
# charts inline (the report's, a:chart's and the comparison's). A screenshot
# of the page by headless Chromium is left in OUT_DIR to look at.
#   test_notebook.sh ANATOMY_EXECUTABLE SOURCE_DIR [OUT_DIR]
source "$(dirname "${BASH_SOURCE[0]}")/../shell_test.sh"
trap 'rm -rf "$dir"; pkill -f -- "[-]-kernel $dir" 2>/dev/null' EXIT

nbconvert="$(command -v jupyter-nbconvert || true)"
if [[ -z "$nbconvert" ]]; then
  echo "SKIPPED: jupyter-nbconvert is not installed (apt-get install jupyter-nbconvert)"
  exit 77
fi
"$exe" --install-kernel --prefix "$dir/prefix" >/dev/null || { echo "FAIL: --install-kernel"; exit 1; }
export JUPYTER_PATH="$dir/prefix/share/jupyter" JUPYTER_RUNTIME_DIR="$dir" ANATOMY_THREADS=2

started=$SECONDS
timeout 600 "$nbconvert" --to html --execute --ExecutePreprocessor.timeout=500 --output-dir "$dir" \
  "$src/examples/autopsy.ipynb" >"$dir/nbconvert.log" 2>&1
check "nbconvert --execute runs every cell of examples/autopsy.ipynb ($((SECONDS - started)) s)" $? "$(tail -20 "$dir/nbconvert.log")"
html="$dir/autopsy.html"
if [[ -f "$html" ]]; then
  charts="$(grep -o '<svg class="chart"' "$html" | wc -l)"
  [[ "$charts" -ge 20 ]]; check "the charts are inline ($charts)" $? "$charts charts"
  grep -q 'Autopsy of models.VibeNet' "$html"; check "the autopsy's report is the cell's output" $? "no report"
  grep -q '<figcaption>grad_norm per layer</figcaption>' "$html" && grep -q '<figcaption>removal_loss per layer</figcaption>' "$html"
  check "display(a:chart(...)) shows both charts" $? "no chart figures"
  grep -q '<figcaption>blocks.1 head 1</figcaption>' "$html"; check "an attention map is shown as a heatmap" $? "no attention map"
  grep -q 'Comparison: plain vs gate' "$html"; check "the comparison is shown" $? "no comparison"
  ! grep -q 'jp-OutputArea-output[^"]*" data-mime-type="application/vnd.jupyter.stderr"' "$html"
  check "no error output" $? "an error was shown"
  if [[ -n "$out" ]] && command -v chromium >/dev/null; then
    mkdir -p "$out"
    chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run --user-data-dir="$dir/profile" \
      --screenshot="$out/notebook.png" --window-size=1100,9000 "file://$html" >/dev/null 2>&1
    [[ -s "$out/notebook.png" ]]; check "screenshot: $out/notebook.png" $? "no screenshot"
  fi
fi
summary
