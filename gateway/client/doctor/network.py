"""The ``dns``, ``connect`` and ``tls`` rows: one :func:`gateway.client.probe.probe` of
``GET {base}/models`` on a new connection; each value is that step alone (the probe's marks are
cumulative, like curl's)."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from gateway.client.doctor.report import Check, judge
from gateway.client.probe import ProbeResult, ProbeTarget

__all__ = ["network_checks"]


def network_checks(
    target: ProbeTarget,
    result: ProbeResult | None,
    marks: Mapping[str, float],
    th: Mapping[str, float],
) -> list[Check]:
    def step(name: str, after: str) -> float | None:
        if name not in marks or after not in marks:
            return None
        return (marks[name] - marks[after]) * 1000

    dns_ms = marks.get("dns", 0.0) * 1000
    literal = _is_ip(target.host)
    where = result.ip if result else "?"
    dns = judge(
        "dns",
        dns_ms,
        th["dns"],
        f"{target.host} is an IP literal: no lookup" if literal else f"{target.host} -> {where}",
        "slow name lookup: a local DNS cache (systemd-resolved, dnsmasq, nscd) or another "
        "resolver; clients that keep their connections pay it once",
    )
    connect = judge(
        "connect",
        step("connect", "dns"),
        th["connect"],
        f"TCP handshake with {where}:{target.port}",
        "slow TCP connect (a long or lossy network path): a backend closer to the clients, "
        "and pooled keep-alive connections so it is paid once",
    )
    if target.scheme != "https":
        tls = Check("tls", None, "ms", th["tls"], "skip", detail="plain http: no TLS")
    else:
        detail = (
            f"{result.tls_version}, ALPN {result.alpn or 'none'}" if result else "handshake done"
        )
        tls = judge(
            "tls",
            step("tls", "connect"),
            th["tls"],
            detail,
            "slow TLS handshake: TLS 1.3 (one round trip), session resumption, keep-alive so it "
            "is paid once, a TLS terminator closer to the clients",
        )
    return [dns, connect, tls]


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
