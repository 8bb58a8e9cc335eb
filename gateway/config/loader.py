"""Loading: a file, text or ``$GATEWAY_CONFIG`` (else the embedded default), TOML parsed, the
``GATEWAY__*`` overrides applied, converted, checked; the defaults that depend on other keys
resolved; what was written recorded (docs/spec.md §3)."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import tomllib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from gateway.config.checks import validate
from gateway.config.convert import build
from gateway.config.key_paths import ConfigError, key_path
from gateway.config.overrides import apply_env
from gateway.config.root import Config

CONFIG_ENV = "GATEWAY_CONFIG"


def default_config_text() -> str:
    """The embedded default (shipped inside the package; ``config/gateway.toml`` is its copy)."""
    return resources.files("gateway").joinpath("default.toml").read_text("utf-8")


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    text: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Config:
    """Load ``path``, else ``text``, else ``$GATEWAY_CONFIG``, else the embedded default.

    ``GATEWAY__SECTION__KEY`` environment variables override file values.
    """
    env = os.environ if env is None else env
    if text is None:
        if path is None and env.get(CONFIG_ENV):
            path = env[CONFIG_ENV]
        if path is None:
            text, source = default_config_text(), "<embedded default>"
        else:
            source = str(path)
            try:
                text = Path(path).read_text("utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) else None
                raise ConfigError([f"{source}: cannot read: {reason or exc}"]) from exc
    else:
        source = "<text>"
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{source}: invalid TOML: {exc}"]) from exc
    return build_config(data, env, source)


def build_config(
    data: dict[str, Any], env: Mapping[str, str] | None = None, source: str = "<data>"
) -> Config:
    """A :class:`Config` from parsed TOML data (plus ``GATEWAY__*`` overrides from ``env``).

    Raises :class:`ConfigError` listing every problem; never anything else, whatever ``data``
    holds (a hypothesis test feeds it random shapes).
    """
    errors: list[str] = []
    apply_env(data, os.environ if env is None else env, errors)
    _boolean_capture(data)
    cfg = build(Config, data, "", errors)
    if isinstance(cfg, Config):  # keys that failed to build took stand-ins: check the rest
        validate(cfg, errors)
    if errors:
        raise ConfigError(errors)
    assert isinstance(cfg, Config)
    routes = tuple(dataclasses.replace(r, name=r.name or r.models[0]) for r in cfg.routes)
    ui = cfg.ui
    if ui.enabled is None:  # docs/spec.md §18: on where only this host or a key holder reaches it
        ui = dataclasses.replace(
            ui, enabled=is_loopback(cfg.server.host) or cfg.auth.mode == "keys"
        )
    explicit = frozenset(_paths(data, ""))
    written = frozenset(p.split(".", 1)[1] for p in explicit if p.startswith("tracing."))
    tracing = dataclasses.replace(cfg.tracing, explicit=written)
    return dataclasses.replace(
        cfg, routes=routes, ui=ui, tracing=tracing, source=source, explicit=explicit
    )


def _boolean_capture(data: dict[str, Any]) -> None:
    """``tracing.capture_content = true | false`` (the key's first form) read as "full" and
    "none" (docs/spec.md §4), in the file or a ``GATEWAY__TRACING__CAPTURE_CONTENT`` variable."""
    tracing = data.get("tracing")
    if not isinstance(tracing, dict) or "capture_content" not in tracing:
        return
    value = tracing["capture_content"]
    if isinstance(value, str):  # a GATEWAY__TRACING__CAPTURE_CONTENT variable
        value = {"true": True, "false": False}.get(value.strip().lower(), value)
    if value is True or value is False:
        tracing["capture_content"] = "full" if value else "none"


def is_loopback(host: str) -> bool:
    """Whether a listen address reaches only this machine (``127.0.0.1``, ``::1``,
    ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _paths(node: Any, prefix: str) -> list[str]:
    """Every key path present in parsed data: tables and their keys, array items by index."""
    out: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            path = key_path(prefix, key)
            out.append(path)
            out.extend(_paths(value, path))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            if isinstance(value, dict):
                out.extend(_paths(value, key_path(prefix, i)))
    return out


__all__ = ["CONFIG_ENV", "build_config", "default_config_text", "is_loopback", "load_config"]
