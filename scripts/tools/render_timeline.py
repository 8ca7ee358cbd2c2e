"""Render a `--timeline-dump-dir` trace (timeline.json) as an SVG picture, no plotting library needed.

One row per (process, thread) that recorded spans, time left to right; each span a bar coloured
by its name, labelled when wide enough; nested spans (a role's method inside another) are drawn
thinner on top. For a quick look without Perfetto, and for the pictures in docs/observability.md.

    python3 scripts/tools/render_timeline.py RUN/timeline/timeline.json OUT.svg [--from-step 2] [--to-step 5]
"""

from __future__ import annotations

import argparse
import html
import json
import sys

PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#bab0ac"]
ROW_H, LABEL_W, WIDTH, TOP = 26, 210, 1400, 30


def load(path: str, from_step: int | None, to_step: int | None) -> tuple[dict, list[dict]]:
    trace = json.load(open(path))["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in trace if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace if e["name"] == "thread_name"}
    spans = [e for e in trace if e.get("ph") == "X"]
    steps = [e for e in spans if procs[e["pid"]] == "controller" and "step" in e.get("args", {})]
    if steps and (from_step is not None or to_step is not None):
        lo = from_step if from_step is not None else min(e["args"]["step"] for e in steps)
        hi = to_step if to_step is not None else max(e["args"]["step"] for e in steps)
        window = [e for e in steps if lo <= e["args"]["step"] <= hi]
        start, end = min(e["ts"] for e in window), max(e["ts"] + e["dur"] for e in window)
        spans = [e for e in spans if e["ts"] < end and e["ts"] + e["dur"] > start]
    return {"procs": procs, "threads": threads}, spans


def render(meta: dict, spans: list[dict], title: str) -> str:
    if not spans:
        raise SystemExit("no spans in the chosen window")
    t0, t1 = min(e["ts"] for e in spans), max(e["ts"] + e["dur"] for e in spans)
    order = sorted({(e["pid"], e["tid"]) for e in spans}, key=lambda k: (k[0], k[1]))
    rows = {key: i for i, key in enumerate(order)}
    names = sorted({e["name"] for e in spans})
    colour = {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}
    scale = (WIDTH - LABEL_W - 20) / max(t1 - t0, 1)
    height = TOP + ROW_H * len(order) + 40 + 18 * ((len(names) + 3) // 4)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" '
           f'font-size="11"><rect width="100%" height="100%" fill="white"/>',
           f'<text x="10" y="18" font-size="13">{html.escape(title)} ({(t1 - t0) / 1e6:.1f} s)</text>']
    per_process = {pid: sum(1 for p, _ in rows if p == pid) for pid, _ in rows}
    for (pid, tid), i in rows.items():
        y = TOP + i * ROW_H
        label = meta["procs"].get(pid, str(pid))
        if per_process[pid] > 1:  # Serve runs async methods on its user-code loop, sync ones on workers
            thread = meta["threads"].get((pid, tid), "")
            label += " (sync calls)" if thread.startswith("AnyIO") else "" if "_run_user_code" in thread \
                else f" ({thread})"
        out.append(f'<text x="8" y="{y + 17}">{html.escape(label[:32])}</text>')
        out.append(f'<line x1="{LABEL_W}" y1="{y + ROW_H}" x2="{WIDTH}" y2="{y + ROW_H}" stroke="#eee"/>')
    # Longer spans first: a role method nested in another is drawn on top of it, thinner.
    for e in sorted(spans, key=lambda e: -e["dur"]):
        i = rows[(e["pid"], e["tid"])]
        x = LABEL_W + (max(e["ts"], t0) - t0) * scale
        w = max(1.0, min(e["dur"], t1 - e["ts"]) * scale)
        nested = any(o is not e and (o["pid"], o["tid"]) == (e["pid"], e["tid"]) and o["ts"] <= e["ts"]
                     and o["ts"] + o["dur"] >= e["ts"] + e["dur"] and o["dur"] > e["dur"] for o in spans)
        y, h = TOP + i * ROW_H + (7 if nested else 3), ROW_H - (14 if nested else 6)
        tip = html.escape(f"{e['name']} step {e.get('args', {}).get('step', '-')}: {e['dur'] / 1e3:.0f} ms")
        out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{h}" fill="{colour[e["name"]]}" '
                   f'stroke="white" stroke-width="0.5"><title>{tip}</title></rect>')
        if w > 7 * len(e["name"]) and not nested:
            out.append(f'<text x="{x + 3:.1f}" y="{y + h - 5}" fill="white">{html.escape(e["name"])}</text>')
    legend_y = TOP + ROW_H * len(order) + 24
    for k, name in enumerate(names):
        x, y = LABEL_W + (k % 4) * 290, legend_y + (k // 4) * 18
        out.append(f'<rect x="{x}" y="{y - 10}" width="12" height="12" fill="{colour[name]}"/>'
                   f'<text x="{x + 16}" y="{y}">{html.escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="timeline.json written by --timeline-dump-dir")
    parser.add_argument("out", help="the SVG to write")
    parser.add_argument("--from-step", type=int, help="first Controller step to show")
    parser.add_argument("--to-step", type=int, help="last Controller step to show")
    parser.add_argument("--title", default="relax timeline")
    args = parser.parse_args()
    meta, spans = load(args.trace, args.from_step, args.to_step)
    with open(args.out, "w") as f:
        f.write(render(meta, spans, args.title))
    print(f"wrote {args.out}: {len(spans)} spans")
    return 0


if __name__ == "__main__":
    sys.exit(main())
