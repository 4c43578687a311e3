#!/usr/bin/env python3
"""Plots fleet staging's wall time against the number of nodes, one line per
dataset shape, from the fleet.json files `bench/run --fleet` writes.

    bench/plot_fleet.py --out docs/fleet-scaling.svg \\
        "64 × 4 MiB=bench/results/fleet-many/fleet.json" \\
        "4 × 64 MiB=bench/results/fleet-model/fleet.json"

Each point is the median PeerToPeer wall time at N divided by the median
Direct wall time at the smallest N (one node reading the dataset alone);
the whiskers span the runs. The SVG is written by hand, so the plot needs
nothing beyond Python.
"""

import argparse
import json
import math
import statistics
from pathlib import Path
from xml.sax.saxutils import escape

WIDTH, HEIGHT = 640, 400
LEFT, RIGHT, TOP, BOTTOM = 64, 180, 40, 56
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]


def series_of(path):
    """N → (median, lowest, highest) wall ÷ the one-node Direct median."""
    runs = json.loads(Path(path).read_text())
    sizes = sorted({int(key.split()[0]) for key in runs})
    one_node = statistics.median(r["wall"] for r in runs[f"{sizes[0]} Direct"])
    points = {}
    for n in sizes:
        walls = [r["wall"] / one_node for r in runs.get(f"{n} PeerToPeer", [])]
        if walls:
            points[n] = (statistics.median(walls), min(walls), max(walls))
    return points


def plot(named_series, goals, title):
    all_n = sorted({n for _, points in named_series for n in points})
    top = max([hi for _, points in named_series for _, _, hi in points.values()] + [g for g, _ in goals] + [1.0])
    y_max = math.ceil(top * 4) / 4 + 0.25
    x_lo, x_hi = math.log2(all_n[0]), math.log2(all_n[-1])
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(n):
        return LEFT + (math.log2(n) - x_lo) / ((x_hi - x_lo) or 1) * plot_w

    def y(v):
        return TOP + plot_h - v / y_max * plot_h

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{LEFT}" y="22" font-size="14">{escape(title)}</text>',
    ]
    step = 0.25 if y_max <= 2.5 else 0.5
    v = 0.0
    while v <= y_max + 1e-9:
        out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{LEFT - 8}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}×</text>')
        v += step
    for n in all_n:
        out.append(f'<line x1="{x(n):.1f}" x2="{x(n):.1f}" y1="{TOP}" y2="{TOP + plot_h}" stroke="#f0f0f0"/>')
        out.append(f'<text x="{x(n):.1f}" y="{TOP + plot_h + 18}" text-anchor="middle">{n}</text>')
    out.append(f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 14}" text-anchor="middle">nodes</text>')
    out.append(f'<text transform="translate(16 {TOP + plot_h / 2}) rotate(-90)" text-anchor="middle">'
               'wall time ÷ one node reading alone</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#888"/>')
    for index, (goal, label) in enumerate(sorted(goals)):
        out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(goal):.1f}" y2="{y(goal):.1f}" '
                   'stroke="#555" stroke-dasharray="5 4"/>')
        # The lowest label below its line, the others above theirs, so
        # goals close together stay readable.
        label_y = y(goal) + 13 if index == 0 else y(goal) - 4
        out.append(f'<text x="{LEFT + plot_w + 6}" y="{label_y:.1f}" fill="#555">{escape(label)}</text>')
    for index, (name, points) in enumerate(named_series):
        colour = COLOURS[index % len(COLOURS)]
        ns = sorted(points)
        path = " ".join(f"{'M' if i == 0 else 'L'}{x(n):.1f},{y(points[n][0]):.1f}" for i, n in enumerate(ns))
        out.append(f'<path d="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for n in ns:
            median, low, high = points[n]
            out.append(f'<line x1="{x(n):.1f}" x2="{x(n):.1f}" y1="{y(low):.1f}" y2="{y(high):.1f}" '
                       f'stroke="{colour}"/>')
            out.append(f'<circle cx="{x(n):.1f}" cy="{y(median):.1f}" r="3.5" fill="{colour}"/>')
        legend_y = TOP + 16 + index * 20
        out.append(f'<line x1="{LEFT + plot_w + 8}" x2="{LEFT + plot_w + 28}" y1="{legend_y - 4}" '
                   f'y2="{legend_y - 4}" stroke="{colour}" stroke-width="2"/>')
        out.append(f'<text x="{LEFT + plot_w + 34}" y="{legend_y}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("series", nargs="+", help="NAME=PATH of a fleet.json")
    parser.add_argument("--out", required=True, help="the SVG to write")
    parser.add_argument("--goal", action="append", default=[],
                        help="VALUE=LABEL: a dashed line at that ratio (may repeat)")
    parser.add_argument("--title", default="Fleet staging: wall time against nodes (PeerToPeer)")
    args = parser.parse_args()
    named = []
    for item in args.series:
        name, _, path = item.partition("=")
        named.append((name, series_of(path)))
    goals = [(float(value), label) for value, _, label in (g.partition("=") for g in args.goal)]
    Path(args.out).write_text(plot(named, goals, args.title))


if __name__ == "__main__":
    main()
