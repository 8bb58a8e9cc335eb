"""What a config problem is: ``path.to.key: message``, every one of them collected
(docs/spec.md §3).

A key path names the key as the file spells it: ``server.port``, ``backends[0].url``,
``routes[1].models[0]``.

>>> key_path("backends", 0), key_path("backends[0]", "url"), key_path("", "server")
('backends[0]', 'backends[0].url', 'server')
"""

from __future__ import annotations


class ConfigError(Exception):
    """Raised with every problem found; ``errors`` holds ``path: message`` strings."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


def key_path(prefix: str, name: str | int) -> str:
    """The path of key (or array index) ``name`` under ``prefix``."""
    if isinstance(name, int):
        return f"{prefix}[{name}]"
    return f"{prefix}.{name}" if prefix else name


class KeyPathErrors:
    """Collects ``path: message``; a path already reported (say, of the wrong type) is not
    reported again for a follow-on problem of its stand-in value."""

    def __init__(self, errors: list[str]) -> None:
        self._errors = errors
        self._seen = {e.split(": ", 1)[0] for e in errors}

    def __call__(self, path: str, message: str) -> None:
        if not any(_related(path, seen) for seen in self._seen):
            self._errors.append(f"{path}: {message}")
            self._seen.add(path)

    def positive(self, section: object, prefix: str, *names: str, allow_zero: bool = False) -> None:
        for name in names:
            value = getattr(section, name)
            if value < 0 or (value == 0 and not allow_zero):
                self(f"{prefix}.{name}", "must be >= 0" if allow_zero else "must be > 0")


def _related(a: str, b: str) -> bool:
    """Whether one key path is the other or inside it (``routes[0]`` and ``routes[0].models``)."""
    if len(a) > len(b):
        a, b = b, a
    return b == a or (b.startswith(a) and b[len(a)] in ".[")


__all__ = ["ConfigError", "KeyPathErrors", "key_path"]
