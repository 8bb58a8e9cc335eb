"""Each peer in its own environment under the cache directory, installed on first use.

A Python peer gets a venv (made with this interpreter) and ``pip install`` of its pinned
requirement; a Node peer gets a ``package.json`` naming its pinned package (and the ``overrides``
of versions deeper down, where the peer needs them) and ``npm install`` in that directory. The
directory is ``<cache>/<name>-<version>/``. An environment counts as installed only once its
``installed.json`` is written (last, after the install succeeded) and names the same
requirement and overrides as asked now; anything else there (an interrupted install, an older
pin) is removed and made anew. The file records what the report shows: the version, how long
the install took and its size.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

MARKER = "installed.json"
#: pip and npm are given this long (a cold LiteLLM install is a few hundred MB)
INSTALL_TIMEOUT_S = 1800.0


class InstallError(RuntimeError):
    """The environment could not be made; the message is the exact reason, for the report."""


@dataclass(frozen=True)
class Installed:
    path: Path
    version: str
    seconds: float
    size_bytes: int
    #: True when this run made it (the first run), False when it was already there
    fresh: bool

    def describe(self) -> str:
        when = "installed now" if self.fresh else "installed earlier"
        return f"{when} in {self.seconds:.0f} s, {self.size_bytes / 1e6:,.0f} MB on disk"


def env_dir(cache: Path, name: str, version: str) -> Path:
    return cache / f"{name}-{version}"


def ensure(
    cache: Path,
    name: str,
    kind: str,
    spec: str,
    version: str,
    overrides: dict[str, str] | None = None,
) -> Installed:
    """The environment of peer ``name``: read from its marker, or installed now.

    ``kind`` is "pip" (``spec`` a requirement, e.g. ``litellm[proxy]==1.0``) or "npm" (``spec``
    a package, e.g. ``@scope/pkg@1.0``, and ``overrides`` npm's overrides, package -> version);
    ``version`` is the pinned version, checked against what was installed."""
    path = env_dir(cache, name, version)
    marker = path / MARKER
    overrides = dict(overrides or {})
    if marker.exists():
        data = json.loads(marker.read_text())
        if data.get("spec") == spec and data.get("overrides", {}) == overrides:
            return Installed(path, data["version"], data["seconds"], data["size_bytes"], False)
    if path.exists():  # an install that did not finish, or of something else
        shutil.rmtree(path)
    path.mkdir(parents=True)
    print(f"{name}: installing {spec} into {path} (first run only) ...", file=sys.stderr)
    t0 = time.monotonic()
    try:
        if kind == "pip":
            _pip(path, spec)
        elif kind == "npm":
            _npm(path, spec, overrides)
        else:
            raise ValueError(f"unknown environment kind {kind!r}")
        got = installed_version(path, kind, package_name(kind, spec))
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    seconds = time.monotonic() - t0
    if got != version:
        shutil.rmtree(path, ignore_errors=True)
        raise InstallError(f"asked for {spec}, the installer put {got} there")
    size = tree_bytes(path)
    record: dict[str, object] = {"spec": spec, "overrides": overrides, "version": got}
    record |= {"seconds": round(seconds, 1), "size_bytes": size}
    marker.write_text(json.dumps(record, indent=1) + "\n")
    return Installed(path, got, seconds, size, True)


def _run(argv: list[str], what: str, cwd: Path | None = None) -> None:
    try:
        res = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
            check=False,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError as exc:
        raise InstallError(f"{what}: {argv[0]} not found ({exc.strerror})") from exc
    except subprocess.TimeoutExpired as exc:
        raise InstallError(f"{what}: no end after {INSTALL_TIMEOUT_S:.0f} s") from exc
    if res.returncode != 0:
        lines = [ln for ln in (res.stderr + res.stdout).splitlines() if ln.strip()]
        # pip's "WARNING: Location ... is ignored" lines are no reason; the error follows them
        lines = [ln for ln in lines if not ln.startswith("WARNING:")] or lines
        raise InstallError(f"{what} exited with status {res.returncode}: " + " | ".join(lines[-6:]))


def _pip(path: Path, spec: str) -> None:
    _run([sys.executable, "-m", "venv", str(path)], "python -m venv")
    pip = [str(path / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    _run([*pip, "install", "-q", spec], f"pip install {spec}")


def _npm(path: Path, spec: str, overrides: dict[str, str]) -> None:
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise InstallError("Node.js and npm are needed (Debian packages nodejs, npm)")
    package = package_name("npm", spec)
    manifest = {
        "private": True,
        "dependencies": {package: spec[len(package) + 1 :]},
        "overrides": overrides,
    }
    (path / "package.json").write_text(json.dumps(manifest, indent=1) + "\n")
    argv = [npm, "install", "--prefix", str(path), "--no-audit", "--no-fund", "--loglevel=error"]
    _run(argv, f"npm install {spec}", cwd=path)


def package_name(kind: str, spec: str) -> str:
    """``litellm[proxy]==1.2`` -> ``litellm``; ``@scope/pkg@1.2`` -> ``@scope/pkg``."""
    if kind == "npm":
        return spec[0] + spec[1:].split("@", 1)[0]
    for sep in ("[", "==", ">", "<", "~", "!", ";", " "):
        spec = spec.split(sep, 1)[0]
    return spec


def installed_version(path: Path, kind: str, package: str) -> str:
    if kind == "npm":
        meta = path / "node_modules" / package / "package.json"
        return str(json.loads(meta.read_text())["version"])
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    res = subprocess.run(
        [str(path / "bin" / "python"), "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if res.returncode != 0:
        raise InstallError(f"{package} is not in {path} after pip install: {res.stderr.strip()}")
    return res.stdout.strip()


def tree_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (symlinks counted as links, not followed)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # removed meanwhile
                total += os.lstat(os.path.join(root, name)).st_size
    return total
