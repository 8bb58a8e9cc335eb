"""``GATEWAY__SECTION__KEY`` environment overrides (docs/spec.md §3), written into the parsed
file before it is built: ``GATEWAY__SERVER__PORT=9000``, ``GATEWAY__BACKENDS__0__URL=...``
(one past the last index appends a table), ``GATEWAY__ROUTES__0__MODELS='["a*"]'``. A value
stays a string (:class:`EnvValue`) until the field's type converts it.

>>> data = {"backends": [{"name": "a"}]}
>>> problems: list[str] = []
>>> apply_env(data, {"GATEWAY__BACKENDS__1__NAME": "b", "GATEWAY__SERVER__PORT": "9"}, problems)
>>> data, problems
({'backends': [{'name': 'a'}, {'name': 'b'}], 'server': {'port': '9'}}, [])
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from typing import Any

ENV_PREFIX = "GATEWAY__"


class EnvValue(str):
    """A raw string from the environment; converted by the target field's type."""


def apply_env(data: dict[str, Any], env: Mapping[str, str], errors: list[str]) -> None:
    # GATEWAY__SERVER__PORT=9000, GATEWAY__BACKENDS__0__URL=..., GATEWAY__ROUTES__0__MODELS='["a*"]'
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX):
            continue
        parts = [p.lower() for p in name[len(ENV_PREFIX) :].split("__")]
        if not all(parts):
            errors.append(f"{name}: empty path segment in environment override")
            continue
        node: Any = data
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if isinstance(node, list):
                if not part.isdigit() or int(part) > len(node):
                    errors.append(f"{_join(parts[: i + 1])}: no such list index (from {name})")
                    break
                idx = int(part)
                if idx == len(node):  # one past the end appends a new table
                    node.append({})
                if last:
                    node[idx] = EnvValue(env[name])
                else:
                    node = node[idx]
            elif isinstance(node, dict):
                if last:
                    node[part] = EnvValue(env[name])
                else:
                    node = node.setdefault(part, {} if not parts[i + 1].isdigit() else [])
            else:
                errors.append(f"{_join(parts[:i])}: is not a table (from {name})")
                break


def _join(parts: list[str]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out


def parse_env_list(raw: str) -> Any:
    try:
        parsed = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return [EnvValue(p.strip()) for p in raw.split(",") if p.strip()]
    return parsed


__all__ = ["ENV_PREFIX", "EnvValue", "apply_env", "parse_env_list"]
