"""The live view's sessions (gateway/live/sign_in.py): signed, expiring tokens in a cookie that
never holds the key; sign-in and sign-out over real sockets."""

from __future__ import annotations

import hashlib

import httpx2
import pytest

from gateway.config import AuthKeyConfig, EdgeConfig
from gateway.hops.edge import RequestEdge
from gateway.live.sign_in import (
    SECRET_ENV,
    SESSION_TTL_S,
    SignInTokens,
    ensure_secret,
    secret_from,
)
from gateway.live.view import COOKIE, LEGACY_COOKIE, over_tls
from tests.support import GatewayServer, gateway_config

ADMIN_KEY = "sk-session-admin-0c41d5e2"
APP_KEY = "sk-session-app-7be2990a"
SECRET = "a-test-secret-that-the-workers-share"
NOW = 1_700_000_000.0


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


KEYS = (
    AuthKeyConfig(tenant="ops", sha256=digest(ADMIN_KEY), admin=True),
    AuthKeyConfig(tenant="app", sha256=digest(APP_KEY)),
)


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def sessions(secret: str = SECRET, keys: tuple[AuthKeyConfig, ...] = KEYS, **kw) -> SignInTokens:
    return SignInTokens(keys, secret.encode(), **kw)


def token_for(key: str, s: SignInTokens) -> str:
    return s.issue(bytes.fromhex(digest(key)))


# ---------------------------------------------------------------- tokens


def test_a_token_names_no_key_and_expires():
    clock = Clock()
    s = sessions(clock=clock)
    token = token_for(ADMIN_KEY, s)
    assert s.check(token) == 0
    for secret in (ADMIN_KEY, digest(ADMIN_KEY), digest(ADMIN_KEY)[:16]):
        assert secret not in token
    entry, expires, _nonce, _mac = token.split(".")
    assert (entry, int(expires)) == ("0", int(NOW) + SESSION_TTL_S)
    clock.now = NOW + SESSION_TTL_S - 1
    assert s.check(token) == 0
    clock.now = NOW + SESSION_TTL_S
    assert s.check(token) is None


def test_a_reload_keeps_a_session_only_while_its_key_is_the_same_admin():
    """``use_keys`` (a config reload, docs/spec.md §29): a token names its entry by index and
    MACs the entry's digest, so it holds while that entry is the same admin key, and no
    longer once the key is gone, moved, or no longer admin."""
    s = sessions()
    token = token_for(ADMIN_KEY, s)
    s.use_keys((*KEYS, AuthKeyConfig(tenant="new", sha256=digest("sk-new"))))
    assert s.check(token) == 0
    s.use_keys(tuple(reversed(KEYS)))  # another key at its index
    assert s.check(token) is None
    s.use_keys((AuthKeyConfig(tenant="ops", sha256=digest(ADMIN_KEY)),))  # admin no more
    assert s.check(token) is None
    s.use_keys(KEYS[1:])
    assert s.check(token) is None and not s.knows(bytes.fromhex(digest(ADMIN_KEY)))


def test_forged_tampered_and_foreign_tokens_are_refused():
    s = sessions(clock=Clock())
    token = token_for(ADMIN_KEY, s)
    entry, expires, nonce, mac = token.split(".")
    forged = [
        token_for(ADMIN_KEY, sessions("another secret", clock=Clock())),
        f"1.{expires}.{nonce}.{mac}",  # another entry
        f"{entry}.{int(expires) + 3600}.{nonce}.{mac}",  # a longer life
        f"{entry}.{expires}.{nonce}x.{mac}",
        f"{entry}.{expires}.{nonce}.{mac[:-1]}",
        f"{entry}.{expires}.{nonce}",
        f"9.{expires}.{nonce}.{mac}",
        "²." + token[2:],  # a digit to str.isdigit, not to int()
        token + "é",
        "." * 3,
        ADMIN_KEY,
        "",
    ]
    assert [s.check(t) for t in forged] == [None] * len(forged)
    # signed with the right secret, but for an entry that may not open the view
    assert s.check(token_for(APP_KEY, s)) is None
    # the entry changed (a rotated key at the same place): its sessions end
    rotated = (AuthKeyConfig(tenant="ops", sha256=digest("sk-rotated"), admin=True), KEYS[1])
    assert sessions(keys=rotated, clock=Clock()).check(token) is None


def test_workers_that_share_the_secret_accept_each_others_sessions():
    env: dict[str, str] = {}
    shared = ensure_secret(env)  # what `gateway serve` does before it spawns the workers
    assert len(shared) >= 32 and ensure_secret(env) == shared
    first, second = (SignInTokens(KEYS, secret_from(env)) for _ in range(2))
    assert second.check(token_for(ADMIN_KEY, first)) == 0
    # no secret in the environment: one made for this process, the same every time asked
    assert secret_from({}) == secret_from({}) != shared.encode()
    assert SignInTokens(KEYS, secret_from({})).check(token_for(ADMIN_KEY, first)) is None


def test_a_sign_out_revokes_the_token_in_the_process_that_answered_it():
    clock = Clock()
    here, other_worker = sessions(clock=clock), sessions(clock=clock)
    token, kept = token_for(ADMIN_KEY, here), token_for(ADMIN_KEY, here)
    assert here.revoke(token) and not here.revoke("not-a-token")
    assert here.check(token) is None and here.check(kept) == 0
    # the documented limit: another worker did not hear of it (until the token expires)
    assert other_worker.check(token) == 0
    # revocations are forgotten once the token would have expired anyway
    clock.now = NOW + SESSION_TTL_S + 1
    here.revoke(token_for(ADMIN_KEY, here))
    assert here.revocations == 1


@pytest.mark.parametrize(
    ("trusted", "scheme", "headers", "secure"),
    [
        ((), "http", [], False),
        ((), "https", [], True),  # our own TLS listener
        (("127.0.0.1/32",), "http", [(b"x-forwarded-proto", b"https")], True),
        (("127.0.0.1/32",), "http", [(b"x-forwarded-proto", b"https, http")], True),
        (("127.0.0.1/32",), "http", [(b"x-forwarded-proto", b"http")], False),
        ((), "http", [(b"x-forwarded-proto", b"https")], False),  # an untrusted peer's word
    ],
)
def test_the_cookie_is_secure_when_the_client_came_over_tls(trusted, scheme, headers, secure):
    scope = {
        "type": "http",
        "method": "POST",
        "scheme": scheme,
        "path": "/_gateway/api/session",
        "headers": headers,
        "client": ("127.0.0.1", 4000),
    }
    ctx = RequestEdge(EdgeConfig(trusted_proxies=trusted)).accept(scope)
    assert over_tls(ctx) is secure


# ---------------------------------------------------------------- over the wire


@pytest.fixture
def keyed(gateway, mock_upstream, monkeypatch) -> GatewayServer:
    monkeypatch.setenv(SECRET_ENV, SECRET)  # as the serving parent hands it to its workers
    return gateway(
        gateway_config(
            f"""
[[backends]]
name = "up"
url = "{mock_upstream.url}/v1"
[[routes]]
models = ["*"]
backends = ["up"]
[edge]
trusted_proxies = ["127.0.0.1/32"]
[auth]
mode = "keys"
[[auth.keys]]
tenant = "ops"
sha256 = "{digest(ADMIN_KEY)}"
admin = true
[[auth.keys]]
tenant = "app"
sha256 = "{digest(APP_KEY)}"
[ui]
enabled = true
"""
        )
    )


def sign_in(view: str, **headers: str) -> httpx2.Response:
    r = httpx2.post(
        view + "api/session", headers={"authorization": f"Bearer {ADMIN_KEY}", **headers}
    )
    assert r.status_code == 204, r.text
    return r


def attributes(set_cookie: str) -> tuple[str, str, dict[str, str]]:
    first, *rest = (p.strip() for p in set_cookie.split(";"))
    name, _, value = first.partition("=")
    attrs = {}
    for part in rest:
        key, _, val = part.partition("=")
        attrs[key.lower()] = val
    return name, value, attrs


def test_signing_in_sets_a_session_cookie_never_the_key(keyed):
    view = keyed.url + "/_gateway/"
    r = sign_in(view)
    name, token, attrs = attributes(r.headers["set-cookie"])
    assert ADMIN_KEY not in token and digest(ADMIN_KEY) not in token
    assert name == COOKIE
    assert "content-length" not in r.headers and r.content == b""  # 204
    assert attrs == {
        "max-age": str(SESSION_TTL_S),
        "path": "/_gateway/",
        "httponly": "",
        "samesite": "Strict",
    }
    assert sessions().check(token) == 0  # what the workers' shared secret signs
    with httpx2.Client(cookies={COOKIE: token}, timeout=10) as c:
        assert c.get(view + "api/requests").status_code == 200
        assert c.get(view + "api/backends").status_code == 200
        with c.stream("GET", view + "api/stream") as resp:
            assert resp.status_code == 200
    # behind a TLS-terminating proxy the gateway trusts: Secure
    _, _, attrs = attributes(sign_in(view, **{"x-forwarded-proto": "https"}).headers["set-cookie"])
    assert "secure" in attrs


def test_expired_forged_and_old_style_cookies_are_refused(keyed):
    view = keyed.url + "/_gateway/"
    expired = token_for(ADMIN_KEY, sessions(clock=Clock(NOW)))
    cookies = {
        "expired": {COOKIE: expired},
        "forged": {COOKIE: token_for(ADMIN_KEY, sessions("guessed"))},
        "not admin": {COOKIE: token_for(APP_KEY, sessions())},
        # the cookie of earlier versions held the key itself: it opens nothing now
        "key in a cookie": {LEGACY_COOKIE: ADMIN_KEY},
        "key in the session cookie": {COOKIE: ADMIN_KEY},
    }
    for label, jar in cookies.items():
        with httpx2.Client(cookies=jar, timeout=10) as c:
            r = c.get(view + "api/requests")
        assert r.status_code == 401, label
        assert r.json()["error"]["type"] == "authentication_error", label
    # signing in deletes the old cookie, key and all
    r = httpx2.post(
        view + "api/session",
        headers={"authorization": f"Bearer {ADMIN_KEY}", "cookie": f"{LEGACY_COOKIE}=x"},
    )
    deleted = [attributes(v) for v in r.headers.get_list("set-cookie")]
    assert (LEGACY_COOKIE, "", "0") in {(n, v, a.get("max-age")) for n, v, a in deleted}


def test_signing_out_ends_the_session(keyed):
    view = keyed.url + "/_gateway/"
    token = attributes(sign_in(view).headers["set-cookie"])[1]
    with httpx2.Client(cookies={COOKIE: token}, timeout=10) as c:
        assert c.get(view + "api/requests").status_code == 200
        r = c.delete(view + "api/session")
        assert r.status_code == 204
        name, value, attrs = attributes(r.headers["set-cookie"])
        assert (name, value, attrs["max-age"], attrs["path"]) == (COOKIE, "", "0", "/_gateway/")
    # the token itself is refused now, not only forgotten by the browser
    with httpx2.Client(cookies={COOKIE: token}, timeout=10) as c:
        r = c.get(view + "api/requests")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_session"


def test_a_session_holds_in_every_worker_of_one_gateway_serve(tmp_path, monkeypatch):
    """``gateway serve --workers 2`` hands its workers one secret: a cookie signed by one
    worker opens the view in the other (fresh connections land on either)."""
    from tests.gateway_process import gateway_process

    monkeypatch.delenv(SECRET_ENV, raising=False)  # made by gateway serve itself
    body = f"""
[[backends]]
name = "mock"
url = "mock://"
[[routes]]
models = ["*"]
backends = ["mock"]
[auth]
mode = "keys"
[[auth.keys]]
tenant = "ops"
sha256 = "{digest(ADMIN_KEY)}"
admin = true
[ui]
enabled = true
"""
    with gateway_process(tmp_path, body, workers=2) as proc:
        view = proc.url + "/_gateway/"
        signed = sign_in(view)
        name, value, _ = attributes(signed.headers["set-cookie"])
        statuses = []
        for _ in range(40):  # each a new connection: the kernel spreads them over the workers
            with httpx2.Client(timeout=10, cookies={name: value}) as fresh:
                statuses.append(fresh.get(view + "api/requests").status_code)
    assert statuses == [200] * 40, statuses
