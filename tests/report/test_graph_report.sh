#!/usr/bin/env bash
# g:report in a real browser: headless Chromium (Debian's chromium) loads an
# attribution graph's report (make_graph_report.lua: 30 positions) with no
# console errors and every kept node and edge in its DOM; clicking the most
# influential feature node (a click dispatched by a script added to a copy
# of the page) lights exactly its edges and its table row. A screenshot is
# left in OUT_DIR to look at. Exits 77 (skipped) when chromium is missing.
#   test_graph_report.sh ANATOMY_EXECUTABLE SOURCE_DIR [OUT_DIR]
source "$(dirname "${BASH_SOURCE[0]}")/../shell_test.sh"

browser="$(command -v chromium || true)"
[[ -n "$browser" ]] || { echo "SKIPPED: chromium is not installed (apt-get install chromium)"; exit 77; }
run_browser() {  # run_browser PAGE: its DOM on stdout, the console in $dir/console.log
  "$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --user-data-dir="$dir/profile" --enable-logging=stderr --v=0 \
    --dump-dom "file://$1" 2>"$dir/console.log"
}

read -r nodes edges < <("$exe" --threads=1 "$src/tests/report/make_graph_report.lua" "$dir/graph.html")
[[ -s "$dir/graph.html" && -n "$edges" ]]; check "the report was written ($nodes nodes, $edges edges kept)" $? "no report"
run_browser "$dir/graph.html" >"$dir/dom.html"
grep -q '</html>' "$dir/dom.html"; check "chromium loaded the report" $? "no DOM came back"
errors="$(grep -E 'CONSOLE|Uncaught|ERROR:.*(file|resource)' "$dir/console.log" | grep -v -E 'dbus|gpu|GPU|sandbox|Fontconfig|crashpad|ALSA|udev|viz' || true)"
[[ -z "$errors" ]]; check "no console errors" $? "$errors"
got_nodes="$(grep -o '<g class="node [a-z]*" data-node="[0-9]*"' "$dir/dom.html" | wc -l)"
got_edges="$(grep -o '<path class="edge"' "$dir/dom.html" | wc -l)"
[[ "$got_nodes" -eq "$nodes" && "$got_edges" -eq "$edges" ]]
check "every kept node and edge is in the DOM" $? "$got_nodes nodes of $nodes, $got_edges edges of $edges"

# a click on the first feature node drawn (the most influential: the table's order), as a person's would arrive
python3 - "$dir/graph.html" "$dir/probe.html" <<'PY'
import sys
page = open(sys.argv[1], encoding="utf-8").read()
probe = """<script>
var rows = Array.prototype.filter.call(document.querySelectorAll('table.nodes tr[data-node]'), function (r) { return r.children[1].textContent === 'feature'; });
var id = rows[0].getAttribute('data-node');
var node = document.querySelector('svg.attribution .node[data-node="' + id + '"]');
node.firstElementChild.nextElementSibling.dispatchEvent(new MouseEvent('click', {bubbles: true, cancelable: true}));
var want = Array.prototype.filter.call(document.querySelectorAll('svg.attribution .edge'), function (e) {
  return e.getAttribute('data-source') === id || e.getAttribute('data-target') === id; }).length;
document.body.setAttribute('data-probe', [want, document.querySelectorAll('svg.attribution .edge.hi').length,
  document.querySelectorAll('table.nodes tr.hi').length, location.href.indexOf('#') < 0].join(' '));
</script></body>"""
open(sys.argv[2], "w", encoding="utf-8").write(page.replace("</body>", probe))
PY
read -r want lit rows stayed < <(run_browser "$dir/probe.html" | grep -o 'data-probe="[^"]*"' | sed 's/data-probe="\(.*\)"/\1/')
[[ -n "$want" && "$want" -gt 0 && "$lit" == "$want" && "$rows" == 1 && "$stayed" == true ]]
check "a click on the top feature lights its $want edges and its row, and stays on the page" $? "want=$want lit=$lit rows=$rows stayed=$stayed"

png="${out:-$dir}/graph_report.png"
[[ -z "$out" ]] || { mkdir -p "$out"; cp "$dir/graph.html" "$out/graph_report.html"; }
ANATOMY_SCREENSHOT_WIDTH=1400 ANATOMY_SCREENSHOT_HEIGHT=1000 "$src/scripts/report-screenshot" "$dir/graph.html" "$png" >/dev/null 2>&1 \
  && [[ -s "$png" ]]
check "report-screenshot makes a PNG ($png)" $? "no screenshot"
summary
