"""The peers benchmark's report: one markdown table, then what stands behind it."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import overhead
from overhead import fmt

if TYPE_CHECKING:
    from peers.bench import Result

#: the row every CPU figure is compared with
BASELINE = "core"

HEAD = (
    "proxy",
    "version",
    "req/s @c{c}",
    "p50 @c1 (ms)",
    "added p50 @c1 (ms)",
    "CPU/req (µs)",
    "CPU/req vs gateway core",
    "CPU @c{c} (%)",
    "errors",
)


def render(results: Sequence[Result], connections: int) -> str:
    """The table: a row per target, in the order measured; a target without figures says why
    in its last cell (the whole reason is under the table)."""
    direct = next((r.m for r in results if r.target == "direct" and r.m), None)
    core = next((r.m for r in results if r.target == BASELINE and r.m), None)
    head = [h.format(c=connections) for h in HEAD]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in results:
        lines.append("| " + " | ".join(_cells(r, direct, core, len(head))) + " |")
    return "\n".join(lines)


def _cells(
    r: Result, direct: overhead.Measurement | None, core: overhead.Measurement | None, width: int
) -> list[str]:
    if r.m is None:
        first = (r.reason or "not measured").strip().splitlines()[0]
        cell = first if len(first) <= 90 else first[:89] + "…"
        return [r.label, r.version or "—", *["—"] * (width - 3), cell.replace("|", "\\|")]
    m = r.m
    added = ratio = None
    if direct is not None and r.target != "direct" and m.lat.p50_ms is not None:
        added = m.lat.p50_ms - (direct.lat.p50_ms or 0.0)
    if core is not None and core.gw_cpu_us and m.gw_cpu_us is not None:
        ratio = m.gw_cpu_us / core.gw_cpu_us
    return [
        r.label,
        r.version or "—",
        f"{m.thr.rps:,.0f}",
        fmt(m.lat.p50_ms),
        fmt(added),
        fmt(m.gw_cpu_us, 0),
        "—" if ratio is None else f"{ratio:.2f}x",
        fmt(m.gw_cpu_pct, 0),
        overhead.describe_errors(*m.all_thr, *m.all_lat),
    ]


def report(
    results: Sequence[Result],
    pin: overhead.Pinning,
    args: argparse.Namespace,
    node: str | None = None,
) -> tuple[str, bool]:
    """The whole report, and whether anything failed (a target without figures, or errors)."""
    out = [f"## Gateway and peers ({time.strftime('%Y-%m-%d %H:%M:%S')})", ""]
    out.append(overhead.machine_facts(pin, args, args.warmup))
    out.append("- each proxy runs alone on the core the gateway gets; CPU/req is all its processes")
    if node:
        out.append(f"- Node.js: {node}")
    out += ["", render(results, args.connections), ""]
    failed = False
    for r in results:
        if r.about:
            out.append(f"{r.label} {r.version}: {r.about}")
    rows = [overhead.Row(r.target, r.m) for r in results]  # "direct", "core", "litellm", …
    out.append(overhead.ratio_line(rows))
    if not any(r.target == BASELINE and r.m for r in results):
        out.append("note: gateway core was not measured: no CPU ratio to it")
    for r in results:
        if r.m is None:
            failed = True
            out.append(f"not measured: {r.label}: {r.reason or 'skipped'}")
            continue
        out += [f"note: {r.label}: {n}" for n in r.m.notes]
        if any(x.errors for x in (*r.m.all_thr, *r.m.all_lat)):
            failed = True
            out.append(f"warning: {r.label}: errors during the run; its figures are not comparable")
    out += [
        f"warning: {w}"
        for w in overhead.noise_warnings(rows, pin, args.connections, who="the proxy")
    ]
    return "\n".join(out), failed
