#!/usr/bin/env python3
"""Checks every chart of a report as the browser built it (the DOM Chromium
dumps): each has data; bars, curves and heatmaps have tick labels on both
axes and both axis titles; curves have a legend, heatmaps and attention maps
a colour bar; every heatmap row has its label (as many labels as rows); and
the removal chart tells values 0.1% apart (at least 1 pixel for a 0.1%
difference of the loss). Prints one line a check and "N passed, N failed".

    check_charts.py DOM.html [REMOVAL]   (the removal chart's title fragment; "" when there is none)
"""
import html.parser
import sys


class Charts(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.charts = []
        self.caption = None
        self.in_caption = False
        self.current = None
        self.depth = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "figcaption":
            self.in_caption, self.caption = True, ""
        if tag == "svg" and "chart" in (a.get("class") or "").split():
            self.current = {"title": self.caption or "", "attrs": a, "classes": {}, "rects": []}
            self.depth = 1
            return
        if self.current is not None:
            if tag == "svg":
                self.depth += 1
            for c in (a.get("class") or "").split():
                self.current["classes"][c] = self.current["classes"].get(c, 0) + 1
            if tag == "rect" and "data-value" in a:
                self.current["rects"].append((float(a["data-value"]), float(a["y"]), float(a["height"])))

    def handle_endtag(self, tag):
        if tag == "figcaption":
            self.in_caption = False
        if tag == "svg" and self.current is not None:
            self.depth -= 1
            if self.depth == 0:
                self.charts.append(self.current)
                self.current = None

    def handle_data(self, data):
        if self.in_caption:
            self.caption += data


def main():
    dom = open(sys.argv[1], encoding="utf-8").read()
    removal = sys.argv[2] if len(sys.argv) > 2 else "removal_loss"
    p = Charts()
    p.feed(dom)
    passed = failed = 0

    def check(name, ok, detail=""):
        nonlocal passed, failed
        if ok:
            passed += 1
            print("ok    " + name)
        else:
            failed += 1
            print("FAIL  %s: %s" % (name, detail))

    for c in p.charts:
        kind, cls, title = c["attrs"].get("data-kind"), c["classes"], c["title"]
        check("%s: has data" % title, int(c["attrs"].get("data-points", "0")) > 0, "no data points")
        if kind in ("bars", "signed-bars", "lines", "heatmap"):
            check("%s: tick labels on both axes" % title, cls.get("xtick", 0) > 0 and (cls.get("ytick", 0) > 1 or kind == "heatmap"),
                  "xtick %d, ytick %d" % (cls.get("xtick", 0), cls.get("ytick", 0)))
            check("%s: axis titles" % title, cls.get("xlabel", 0) > 0 and cls.get("ylabel", 0) > 0,
                  "xlabel %d, ylabel %d" % (cls.get("xlabel", 0), cls.get("ylabel", 0)))
        if kind in ("lines", "signed-bars"):
            check("%s: a legend" % title, cls.get("legend", 0) > 0, "no legend")
        if kind in ("heatmap", "attention"):
            check("%s: a colour bar with ticks" % title, cls.get("colorbar", 0) > 0 and cls.get("ytick", 0) >= 2, "no colour bar")
            rows = int(c["attrs"].get("data-rows", "0"))
            check("%s: a label on every row (%d)" % (title, rows), rows > 0 and cls.get("rowlabel", 0) == rows,
                  "%d row labels for %d rows" % (cls.get("rowlabel", 0), rows))
        if kind == "attention":
            check("%s: tokens on both axes" % title, cls.get("xtick", 0) == int(c["attrs"].get("data-rows", "-1")), "token labels missing")
    found = [c for c in p.charts if removal and removal in c["title"]]
    if removal:
        check("the removal chart is there", len(found) == 1, "%d charts named %r" % (len(found), removal))
    if found:
        c = found[0]
        rects = c["rects"]
        offset = float(c["attrs"].get("data-offset", "0"))
        pairs = [(a, b) for a in rects for b in rects if a[0] != b[0]]
        if pairs:
            # pixels per unit from the two bars furthest apart; their tops are y (or y + height when negative)
            a, b = max(pairs, key=lambda ab: abs(ab[0][0] - ab[1][0]))
            top = lambda r: r[1] if r[0] >= 0 else r[1] + r[2]
            per_unit = abs(top(a) - top(b)) / abs(a[0] - b[0])
            typical = offset + sum(r[0] for r in rects) / len(rects)
            px = per_unit * 0.001 * typical
            check("the removal chart shows a 0.1%% difference in the loss as %.1f pixels (at least 1)" % px, px >= 1.0, "%.2f px" % px)
        else:
            check("the removal chart has two different values to compare", False, "%d bars" % len(rects))
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
