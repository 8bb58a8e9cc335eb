"""The doctor's rows and its report: one :class:`Check` per check (name, measured value,
threshold, verdict, what was seen, a one-line hint), rendered as a table or as JSON."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson

__all__ = ["Check", "Report", "Verdict", "judge"]

Verdict = Literal["ok", "warn", "fail", "skip"]


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    #: a number in ``unit``, a word (the coding, the cache result), or None when not measured
    value: float | str | None
    unit: str | None
    threshold: float | str | None
    verdict: Verdict
    #: what to do about it (empty when there is nothing to do)
    hint: str = ""
    #: what was seen, for people (TLS version and ALPN, event counts and gaps, ...)
    detail: str = ""

    def as_json(self) -> dict[str, Any]:
        value = round(self.value, 3) if isinstance(self.value, float) else self.value
        return {
            "name": self.name,
            "value": value,
            "unit": self.unit,
            "threshold": self.threshold,
            "verdict": self.verdict,
            "hint": self.hint,
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class Report:
    target: str
    model: str | None
    checks: list[Check]

    def exit_code(self) -> int:
        return 1 if any(c.verdict == "fail" for c in self.checks) else 0

    def to_json(self) -> str:
        obj = {
            "target": self.target,
            "model": self.model,
            "checks": [c.as_json() for c in self.checks],
        }
        return orjson.dumps(obj).decode()

    def render(self) -> str:
        rows = [("check", "value", "threshold", "verdict", "detail")]
        rows += [
            (
                c.name,
                _show(c.value, c.unit),
                _show(c.threshold, c.unit if isinstance(c.threshold, float) else None, exact=True),
                c.verdict,
                c.detail,
            )
            for c in self.checks
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = [f"gateway doctor {self.target}  model={self.model or '-'}", ""]
        for i, row in enumerate(rows):
            cells = [row[0].ljust(widths[0]), row[1].rjust(widths[1])]
            cells += [row[2].rjust(widths[2]), row[3].ljust(widths[3]), row[4]]
            lines.append("  ".join(cells).rstrip())
            hint = self.checks[i - 1].hint if i else ""
            if hint:
                lines.append(" " * (sum(widths) + 8) + "hint: " + hint)
        failed = [c.name for c in self.checks if c.verdict == "fail"]
        warned = [c.name for c in self.checks if c.verdict == "warn"]
        lines.append("")
        lines.append(
            f"{len(failed)} fail{'' if not failed else ' (' + ', '.join(failed) + ')'}, "
            f"{len(warned)} warn{'' if not warned else ' (' + ', '.join(warned) + ')'}"
        )
        return "\n".join(lines)


def _show(value: float | str | None, unit: str | None, *, exact: bool = False) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if unit == "ms" and not exact:
        digits = 2 if value < 10 else 1 if value < 1000 else 0
        return f"{value:.{digits}f} ms"
    text = f"{value:g}"
    return f"{text} {unit}" if unit else text


def judge(name: str, value: float | None, limit: float, detail: str, hint: str) -> Check:
    """A row measured in ms: ``warn`` above ``limit``, ``fail`` when it was not measured."""
    if value is None:
        return Check(name, None, "ms", limit, "fail", "not measured: the probe stopped", detail)
    if value > limit:
        return Check(name, value, "ms", limit, "warn", hint, detail)
    return Check(name, value, "ms", limit, "ok", "", detail)
