"""TLS at the gateway's edge (docs/spec.md §27): the server's ``SSLContext`` from ``[server.tls]``,
ALPN, and the certificate re-read on SIGHUP without dropping a connection.

- **ALPN** offers ``h2`` (unless ``[server.http2] enabled = false``) then ``http/1.1``; a client
  that offers neither, or no ALPN at all, is served HTTP/1.1 (:mod:`gateway.server.connections`
  reads the choice once per connection).
- **Versions and ciphers**: TLS 1.2 or 1.3 (``min_version``); TLS 1.2 with forward-secret AEAD
  suites only (ECDHE/DHE with AES-GCM or ChaCha20-Poly1305), which are also the only TLS 1.2
  suites HTTP/2 admits (RFC 9113 §9.2.2: the others are on its block list and a client may end
  the connection with INADEQUATE_SECURITY). No compression (CRIME), no renegotiation (a client
  could make the server redo handshakes at will).
- **mTLS**: with ``client_ca_file`` a client must present a certificate that CA signed; without
  one the handshake fails (the client sees a TLS alert, nothing is served).
- **Reload**: :meth:`ServerTls.reload` builds a whole new context from the files (a missing
  file, a key that does not match, an unreadable CA: the old context stays and the error is
  returned); the listening context's ``sni_callback``, which OpenSSL calls for every ClientHello
  (with or without SNI), hands each new handshake the newest context. Connections already
  established keep theirs: nothing is dropped.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence

from gateway.config import TlsConfig

__all__ = ["ALPN_H2", "ALPN_HTTP1", "ServerTls", "TlsError", "build_context"]

ALPN_H2 = "h2"
ALPN_HTTP1 = "http/1.1"
#: TLS 1.2: forward secrecy and AEAD only (Mozilla's "intermediate" list; RFC 9113 §9.2.2)
_TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20:DHE+AESGCM:DHE+CHACHA20:!aNULL:!eNULL"
_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


class TlsError(Exception):
    """The files of ``[server.tls]`` cannot make a context: one line naming the file."""


def build_context(cfg: TlsConfig, alpn: Sequence[str]) -> ssl.SSLContext:
    """A server context from ``cfg``, offering ``alpn`` in that order (:class:`TlsError` when a
    file cannot be read or the key does not match the certificate)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _VERSIONS[cfg.min_version]
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    ctx.set_ciphers(_TLS12_CIPHERS)
    _readable("cert_file", cfg.cert_file)
    _readable("key_file", cfg.key_file)
    try:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    except OSError as exc:  # ssl.SSLError is an OSError too: the more precise line first
        raise TlsError(_describe(exc, "cert_file/key_file", cfg.cert_file)) from None
    if cfg.client_ca_file is not None:
        _readable("client_ca_file", cfg.client_ca_file)
        try:
            ctx.load_verify_locations(cafile=cfg.client_ca_file)
        except OSError as exc:
            raise TlsError(_describe(exc, "client_ca_file", cfg.client_ca_file)) from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.set_alpn_protocols(list(alpn))
    return ctx


def _readable(key: str, path: str) -> None:
    """A file ``ssl`` would fail to open, named (its own error does not say which one)."""
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise TlsError(_describe(exc, key, path)) from None


def _describe(exc: OSError, key: str, path: str) -> str:
    if isinstance(exc, ssl.SSLError):
        reason = exc.reason or str(exc)
        return f"[server.tls] {key}: {reason.lower().replace('_', ' ')} ({path})"
    return f"[server.tls] {key}: cannot read {path}: {(exc.strerror or str(exc)).lower()}"


class ServerTls:
    """The context the server listens with, and the newest one each handshake is given."""

    def __init__(self, cfg: TlsConfig, alpn: Sequence[str]) -> None:
        self.cfg = cfg
        self.alpn = tuple(alpn)
        #: what new handshakes get (replaced by :meth:`reload`)
        self.current = build_context(cfg, self.alpn)
        #: the listening socket's context: its callback swaps in :attr:`current`
        self.context = self.current
        self.context.sni_callback = self._pick
        #: how many times the files were re-read
        self.reloads = 0

    def _pick(self, conn: ssl.SSLObject | ssl.SSLSocket, name: str | None, ctx: object) -> None:
        current = self.current
        if conn.context is not current:
            conn.context = current

    def reload(self) -> str | None:
        """Re-read the files: None when done, else why not (the old context stays)."""
        try:
            fresh = build_context(self.cfg, self.alpn)
        except TlsError as exc:
            return str(exc)
        self.current = fresh
        self.reloads += 1
        return None
