#!/usr/bin/env python3
"""plot_pipeline.py: an SVG of a pipeline run (bench/pipeline_gpu.sh's $OUT files), no plotting
library needed: trained tokens/s and samples/s of the drafter group (rank 0's metrics JSONL,
5-second windows) over the ring occupancy and the number of live targets (one `dflashctl --json
status` per second). Time 0 is the group's first step.

  tools/plot_pipeline.py metrics-rank0.jsonl status.jsonl -o run.svg [--title TEXT]
"""
import argparse
import json
import sys


def load_jsonl(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass    # a line cut by the end of the run
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("metrics")
    ap.add_argument("status")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--title", default="dflash pipeline")
    ap.add_argument("--window", type=float, default=5.0, help="seconds per throughput point")
    a = ap.parse_args()

    m = [r for r in load_jsonl(a.metrics) if "time" in r and "tokens" in r]
    st = [s for s in load_jsonl(a.status) if "ring" in s and "uptime_s" in s]
    if len(m) < 2 or not st:
        sys.exit("%s / %s: not enough rows to plot" % (a.metrics, a.status))
    t0 = m[0]["time"]
    # The status samples' clock: the coordinator's uptime when the group had made its first step.
    started = [s for s in st if any(d.get("role") == "drafter" and d.get("step", 0) > 0 for d in s.get("daemons", []))]
    u0 = started[0]["uptime_s"] if started else st[0]["uptime_s"]

    # throughput in windows (the samples field is cumulative: differences)
    tp = []
    end = m[-1]["time"]
    w0 = t0
    prev = m[0]
    while w0 < end:
        w1 = w0 + a.window
        rows = [r for r in m if w0 < r["time"] <= w1]
        dt = min(w1, end) - w0
        if rows and dt > 0.5 * a.window:
            tok = sum(r["tokens"] for r in rows)
            smp = rows[-1]["samples"] - prev["samples"]
            tp.append(((w0 + min(w1, end)) / 2 - t0, tok / dt, smp / dt))
        if rows:
            prev = rows[-1]
        w0 = w1
    ring = [(s["uptime_s"] - u0, s["ring"]) for s in st]
    live = [(s["uptime_s"] - u0, sum(1 for d in s.get("daemons", []) if d.get("role") == "target" and d.get("alive", True)))
            for s in st]
    slots = st[0]["ring"]["slots"]
    tmin = min(0.0, ring[0][0])
    tmax = max(tp[-1][0] if tp else 0, ring[-1][0])

    W, H, L, R = 900, 560, 70, 70
    top = (40, 260)       # y range of the throughput panel
    bot = (310, 500)      # y range of the ring panel
    def x(t):
        return L + (t - tmin) / max(tmax - tmin, 1e-9) * (W - L - R)
    def y(v, vmax, panel):
        return panel[1] - v / max(vmax, 1e-9) * (panel[1] - panel[0])
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">' % (W, H),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="22" font-size="15">%s</text>' % (L, a.title.replace("&", "&amp;").replace("<", "&lt;"))]
    def axes(panel, vmax, label, unit_fmt):
        out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (L, panel[1], W - R, panel[1]))
        out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (L, panel[0], L, panel[1]))
        for k in range(5):
            v = vmax * k / 4
            yy = y(v, vmax, panel)
            out.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>' % (L, yy, W - R, yy))
            out.append('<text x="%d" y="%.1f" text-anchor="end">%s</text>' % (L - 4, yy + 4, unit_fmt(v)))
        out.append('<text x="%d" y="%d">%s</text>' % (L, panel[0] - 6, label))
    def poly(points, color, width=1.5, dash=None):
        if not points:
            return
        d = " ".join("%.1f,%.1f" % p for p in points)
        out.append('<polyline fill="none" stroke="%s" stroke-width="%s"%s points="%s"/>' %
                   (color, width, ' stroke-dasharray="%s"' % dash if dash else "", d))

    tok_max = max((p[1] for p in tp), default=1) * 1.15
    smp_max = max((p[2] for p in tp), default=1) * 1.15
    axes(top, tok_max, "drafter group: trained tokens/s (blue, left), samples/s (orange, right)",
         lambda v: "%.0fk" % (v / 1e3))
    for k in range(5):
        v = smp_max * k / 4
        out.append('<text x="%d" y="%.1f">%.1f</text>' % (W - R + 4, y(v, smp_max, top) + 4, v))
    poly([(x(t), y(v, tok_max, top)) for t, v, _ in tp], "#1f77b4", 2)
    poly([(x(t), y(v, smp_max, top)) for t, _, v in tp], "#ff7f0e", 1.5)

    axes(bot, slots, "ring (%d slots): READY (green), FREE (grey), WRITING (red); live targets (black, dashed)" % slots,
         lambda v: "%.0f" % v)
    poly([(x(t), y(r["ready"], slots, bot)) for t, r in ring], "#2ca02c", 2)
    poly([(x(t), y(r["free"], slots, bot)) for t, r in ring], "#888888", 1.5)
    poly([(x(t), y(r["writing"], slots, bot)) for t, r in ring], "#d62728", 1.2)
    nt = max((n for _, n in live), default=1)
    poly([(x(t), y(n * slots / max(nt, 1) * 0.9, slots, bot)) for t, n in live], "black", 1.2, "5,4")
    # outage shading: samples with fewer live targets than the most seen
    for (ta, n), (tb, _) in zip(live, live[1:]):
        if n < nt:
            out.append('<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="#d62728" fill-opacity="0.12"/>' %
                       (x(ta), top[0], max(x(tb) - x(ta), 1), bot[1] - top[0]))
    step = 30 if tmax - tmin > 120 else 10
    t = (int(tmin) // step) * step
    while t <= tmax:
        if t >= tmin:
            out.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>' % (x(t), bot[1] + 16, t))
        t += step
    out.append('<text x="%d" y="%d" text-anchor="middle">seconds since the first step (shaded: a target down)</text>' %
               ((L + W - R) // 2, bot[1] + 36))
    out.append("</svg>")
    with open(a.out, "w") as f:
        f.write("\n".join(out) + "\n")
    print("%s: %d throughput points, %d status samples" % (a.out, len(tp), len(st)))


if __name__ == "__main__":
    main()
