"""The run: every check against one base URL, in the order the report lists them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.client.doctor.cache_hit import check_cache
from gateway.client.doctor.compression import check_encoding
from gateway.client.doctor.idle_close import check_idle
from gateway.client.doctor.network import network_checks
from gateway.client.doctor.proxy_time import check_proxy
from gateway.client.doctor.report import Report
from gateway.client.doctor.reuse import check_reuse, no_model_error
from gateway.client.doctor.stream_pacing import check_streaming
from gateway.client.doctor.thresholds import DEFAULT_THRESHOLDS
from gateway.client.doctor.timed_client import TimedClient, pick_model
from gateway.client.doctor.ttfb import check_ttfb
from gateway.client.probe import ProbeError, ProbeResult, ProbeTarget, probe

__all__ = ["DoctorError", "Options", "run"]


class DoctorError(Exception):
    """The target cannot be checked at all (unreachable, not a URL, no model): one line."""


@dataclass(frozen=True, slots=True)
class Options:
    base_url: str
    model: str | None = None
    api_key: str | None = None
    requests: int = 5
    #: overrides of :data:`DEFAULT_THRESHOLDS` (missing names keep their default)
    thresholds: Mapping[str, float] = field(default_factory=dict)
    timeout: float = 30.0
    cacert: str | None = None
    #: seconds a connection is left idle for the idle row (0: the row is skipped)
    idle_wait: float = 0.0


def run(options: Options) -> Report:
    """Run every check against ``options.base_url``; :class:`DoctorError` when none can run."""
    base = options.base_url.rstrip("/")
    try:
        target = ProbeTarget.parse(base)
    except ValueError as exc:
        raise DoctorError(str(exc)) from None
    th = {**DEFAULT_THRESHOLDS, **options.thresholds}
    auth = [("Authorization", f"Bearer {options.api_key}")] if options.api_key else []

    try:
        result: ProbeResult | None = probe(
            base + "/models", headers=auth, timeout=options.timeout, cacert=options.cacert
        )
        marks = result.marks if result else {}
    except ProbeError as exc:
        if exc.stage in ("dns", "connect", "tls"):
            raise DoctorError(f"{base}: {exc.message}") from None
        result, marks = None, exc.marks  # connected: the rows below say what went wrong
    checks = network_checks(target, result, marks, th)

    with TimedClient(
        base, api_key=options.api_key, cacert=options.cacert, timeout=options.timeout
    ) as client:
        reuse, listing = check_reuse(client, options.requests)
        models = listing.models
        model = options.model or pick_model(models, embedding=False)
        if model is None:
            raise DoctorError(no_model_error(client, listing))
        ttfb, answer = check_ttfb(client, model, th)
        encoding = check_encoding(client, model, answer, pick_model(models, embedding=True))
        streaming, stream = check_streaming(client, model, th)
        proxy = check_proxy([a for a in (answer, stream) if a is not None], th)
        cache = check_cache(client, model)
    idle = check_idle(
        base,
        options.idle_wait,
        api_key=options.api_key,
        cacert=options.cacert,
        timeout=options.timeout,
    )
    checks += [ttfb, reuse, idle, encoding, streaming, proxy, cache]
    return Report(base, model, checks)
