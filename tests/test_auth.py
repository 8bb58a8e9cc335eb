"""Auth, tenants and rate limits end to end (SPEC §12): the official SDKs as clients, the gateway
as a real server, real ``redis-server`` processes for the shared limits.

Every outcome of the auth hop: no key, wrong key, Bearer / ``api-key`` / ``x-api-key``, a model the
key may not call, rpm and tpm over budget (Retry-After and OpenAI's ``x-ratelimit-*`` headers),
rpm shared by two gateway processes through one Redis, and a Redis killed mid-way (limits keep
being enforced per process, and the metric and the log say so). A refused request never reaches
the upstream.
"""

from __future__ import annotations

import hashlib
import logging
import time

import anthropic
import httpx2
import openai
import orjson
import pytest

from gateway.telemetry.logs import ACCESS_LOGGER
from tests.gateway_process import gateway_process
from tests.support import GatewayServer, answering, anthropic_client, gateway_config, openai_client

MSG = [{"role": "user", "content": "hello there"}]
KEY_A = "sk-tenant-a-7c1f0e5d2b"
KEY_B = "sk-tenant-b-93aa04c611"
KEY_LIMITED = "sk-limited-5e2d7a9b10"
KEY_TOKENS = "sk-tokens-0b8c4f6e21"

CHAT_ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 40, "completion_tokens": 20, "total_tokens": 60},
    }
)


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def keys_toml(upstream_url: str, extra: str = "", limits: str = "") -> str:
    return f"""
[[backends]]
name = "up"
url = "{upstream_url}"
api_key_env = "TEST_BACKEND_KEY"

[[routes]]
models = ["*"]
backends = ["up"]

[auth]
mode = "keys"
{extra}

[[auth.keys]]
tenant = "team-a"
sha256 = "{digest(KEY_A)}"
models = ["gpt-*"]

[[auth.keys]]
tenant = "team-b"
sha256 = "{digest(KEY_B)}"
models = ["*"]

[[auth.keys]]
tenant = "limited"
sha256 = "{digest(KEY_LIMITED)}"
rpm = 3
{limits}

[[auth.keys]]
tenant = "tokens"
sha256 = "{digest(KEY_TOKENS)}"
tpm = 100
"""


@pytest.fixture
def seen(upstream):
    """A real upstream answering every chat with 60 tokens of usage; it records what it saw."""
    return upstream(answering(CHAT_ANSWER))


@pytest.fixture
def gw(gateway, seen) -> GatewayServer:
    return gateway(gateway_config(keys_toml(seen.url)))


def chat(gw: GatewayServer, key: str | None, model: str = "gpt-4o", **headers: str):
    h = dict(headers)
    if key is not None:
        h.setdefault("authorization", f"Bearer {key}")
    return httpx2.post(
        gw.base_url + "/chat/completions", json={"model": model, "messages": MSG}, headers=h
    )


# ---------------------------------------------------------------- who is calling


def test_no_key_and_a_wrong_key_are_401_and_never_reach_the_upstream(gw, seen):
    for key, code in ((None, "missing_api_key"), ("sk-not-a-key", "invalid_api_key")):
        r = chat(gw, key)
        assert r.status_code == 401
        err = r.json()["error"]
        assert (err["type"], err["code"], err["param"]) == ("authentication_error", code, None)
        assert r.headers["x-should-retry"] == "false"
    client = openai_client(gw.base_url, "sk-wrong")
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="gpt-4o", messages=MSG)
    assert seen.requests == []


@pytest.mark.parametrize(
    "header",
    [("authorization", f"Bearer {KEY_A}"), ("api-key", KEY_A), ("x-api-key", KEY_A)],
    ids=["bearer", "api-key", "x-api-key"],
)
def test_each_credential_header_identifies_the_key_and_none_is_forwarded(gw, seen, header):
    r = chat(gw, None, **{header[0]: header[1]})
    assert r.status_code == 200, r.text
    (req,) = seen.requests
    # the backend's own key goes upstream; the client's credential in no header at all
    assert req.header("authorization") == "Bearer sk-backend-secret-for-tests"
    assert KEY_A not in repr(req.headers)
    assert {"api-key", "x-api-key"}.isdisjoint(req.header_names())


def test_the_openai_sdk_and_the_anthropic_sdk_authenticate(gw, seen):
    client = openai_client(gw.base_url, KEY_B)
    assert client.chat.completions.create(model="gpt-4o", messages=MSG).usage.total_tokens == 60
    ant = anthropic_client(gw.url, "sk-wrong")
    with pytest.raises(anthropic.AuthenticationError):
        ant.messages.create(model="claude-x", max_tokens=5, messages=MSG)
    assert len(seen.requests) == 1


def test_a_model_outside_the_keys_globs_is_403(gw, seen):
    client = openai_client(gw.base_url, KEY_A)
    with pytest.raises(openai.PermissionDeniedError) as info:
        client.chat.completions.create(model="claude-3-opus", messages=MSG)
    assert info.value.body["code"] == "model_not_allowed"
    assert seen.requests == []
    # the catalogue lists only what the key may call
    r = httpx2.get(gw.base_url + "/models", headers={"authorization": f"Bearer {KEY_A}"})
    assert r.status_code == 200
    assert httpx2.get(gw.base_url + "/models").status_code == 401


def test_passthrough_paths_need_a_key_too(gw, seen):
    assert httpx2.get(gw.base_url + "/files").status_code == 401
    r = httpx2.get(gw.base_url + "/files", headers={"authorization": f"Bearer {KEY_B}"})
    assert r.status_code == 200
    (req,) = seen.requests
    assert req.target == "/v1/files" and KEY_B not in repr(req.headers)


def test_health_and_metrics_stay_open_for_probes_and_scrapers(gw):
    for path in ("/healthz", "/readyz", "/metrics"):
        assert httpx2.get(gw.url + path).status_code == 200, path


# ---------------------------------------------------------------- limits


def test_rpm_refuses_with_retry_after_and_openai_ratelimit_headers(gw, seen):
    ok = [chat(gw, KEY_LIMITED) for _ in range(3)]
    assert [r.status_code for r in ok] == [200, 200, 200]
    assert [r.headers["x-ratelimit-remaining-requests"] for r in ok] == ["2", "1", "0"]
    assert ok[0].headers["x-ratelimit-limit-requests"] == "3"
    r = chat(gw, KEY_LIMITED)
    assert r.status_code == 429
    err = r.json()["error"]
    assert (err["type"], err["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    # one request frees up every 20 s (3 per minute): the client is told when
    assert 1 <= int(r.headers["retry-after"]) <= 20
    assert r.headers["x-ratelimit-limit-requests"] == "3"
    assert r.headers["x-ratelimit-remaining-requests"] == "0"
    assert r.headers["x-ratelimit-reset-requests"].endswith("s")
    assert r.headers["x-should-retry"] == "true"
    assert len(seen.requests) == 3  # the refused one never went upstream
    # other keys have their own budgets
    assert chat(gw, KEY_B).status_code == 200


def test_tpm_reserves_the_estimate_and_debits_the_usage_the_upstream_reported(gw, seen):
    body = orjson.dumps({"model": "gpt-4o", "messages": MSG, "max_tokens": 10})
    reserved = -(-len(body) // 4) + 10  # the body's bytes / 4, plus max_tokens

    def ask():
        return httpx2.post(
            gw.base_url + "/chat/completions",
            content=body,
            headers={"authorization": f"Bearer {KEY_TOKENS}", "content-type": "application/json"},
        )

    first = ask()
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit-tokens"] == "100"
    assert first.headers["x-ratelimit-remaining-tokens"] == "100"  # nothing spent before it
    deadline = time.monotonic() + 5  # its end replaces what it reserved by the 60 reported
    while (second := ask()).status_code == 200 and int(
        second.headers["x-ratelimit-remaining-tokens"]
    ) > 41:
        assert time.monotonic() < deadline, "the usage was never debited"
    assert second.status_code == 200  # 60 of 100 spent: the reservation fits
    # the second answer's 60 tokens overdraw the budget (its estimate was short): refused
    deadline = time.monotonic() + 5
    while (r := ask()).status_code == 200:
        assert time.monotonic() < deadline, "the overdrawn key was never refused"
    assert r.status_code == 429
    message = r.json()["error"]["message"]
    assert "tokens per minute" in message
    assert f"this request may use up to {reserved} tokens" in message
    # 120 of 100 spent: 20 tokens' worth plus what it reserves (0.6 s a token) before it fits
    wait = (20 + reserved) * 0.6
    assert wait - 2 <= int(r.headers["retry-after"]) <= wait + 1
    assert r.headers["x-ratelimit-remaining-tokens"] == "0"
    assert len(seen.requests) == 2


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(orjson.loads(record.getMessage()))


def test_tenant_flows_to_the_cache_scope_and_the_access_log(gateway, seen):
    cfg = keys_toml(seen.url) + '\n[cache]\nbackend = "memory"\n[logging]\naccess_log = "all"\n'
    gw = gateway(gateway_config(cfg))
    log = Lines()
    logging.getLogger(ACCESS_LOGGER).addHandler(log)
    try:
        body = {"model": "gpt-4o", "messages": MSG, "temperature": 0}
        results = []
        for key in (KEY_A, KEY_A, KEY_B):
            r = httpx2.post(
                gw.base_url + "/chat/completions",
                json=body,
                headers={"authorization": f"Bearer {key}"},
            )
            results.append(r.headers["x-gateway-cache"])
        deadline = time.monotonic() + 5
        while len(log.lines) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        logging.getLogger(ACCESS_LOGGER).removeHandler(log)
    # the same body from another tenant is never served from team-a's entry
    assert results == ["MISS", "HIT", "MISS"]
    assert len(seen.requests) == 2
    assert [(line["tenant"], line["cache"]) for line in log.lines] == [
        ("team-a", "miss"),
        ("team-a", "hit"),
        ("team-b", "miss"),
    ]
    assert not any(k in repr(log.lines) for k in (KEY_A, KEY_B))


# ---------------------------------------------------------------- limits shared by replicas


def test_rpm_is_shared_by_two_gateway_processes_through_one_redis(tmp_path, seen, redis):
    cfg = keys_toml(seen.url, extra=f'redis_url = "{redis.url}"')
    with gateway_process(tmp_path, cfg) as one, gateway_process(tmp_path, cfg) as two:
        codes = []
        for i in range(6):  # alternate: each process alone would allow 3 + 3
            port = (one, two)[i % 2].port
            r = httpx2.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                json={"model": "gpt-4o", "messages": MSG},
                headers={"authorization": f"Bearer {KEY_LIMITED}"},
            )
            codes.append(r.status_code)
    assert codes == [200, 200, 200, 429, 429, 429]
    assert len(seen.requests) == 3
    # one bucket in Redis, named by the tenant (its hash tag) and a digest prefix (never the key)
    bucket = "gateway:ratelimit:v2:{limited}:" + digest(KEY_LIMITED)[:32] + ":r"
    assert redis.command(b"EXISTS " + bucket.encode()).startswith(b":1")
    assert redis.command(b"DBSIZE").startswith(b":1")


def metric(gw: GatewayServer, name: str) -> float:
    for line in httpx2.get(gw.url + "/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


def test_redis_killed_limits_fall_back_per_process_and_say_so(gateway, seen, redis, caplog):
    caplog.set_level(logging.WARNING, logger="gateway.auth")
    cfg = keys_toml(seen.url, extra=f'redis_url = "{redis.url}"\ntimeout_ms = 100')
    gw = gateway(gateway_config(cfg))
    assert chat(gw, KEY_LIMITED).status_code == 200  # through Redis
    assert metric(gw, "gateway_ratelimit_fallback") == 0
    redis.kill()
    started = time.monotonic()
    codes = [chat(gw, KEY_LIMITED).status_code for _ in range(5)]
    # never unlimited, never a hang: counted here, each Redis wait bounded by timeout_ms
    assert codes == [200, 200, 200, 429, 429]
    assert time.monotonic() - started < 5
    assert metric(gw, "gateway_ratelimit_fallback") == 1
    assert any("counting limits per process" in r.getMessage() for r in caplog.records)
    assert len(seen.requests) == 4


def test_redis_back_ends_the_fallback(gateway, seen, redis, caplog):
    caplog.set_level(logging.WARNING, logger="gateway.auth")
    cfg = keys_toml(seen.url, extra=f'redis_url = "{redis.url}"\ntimeout_ms = 100')
    gw = gateway(gateway_config(cfg))
    redis.kill()
    assert chat(gw, KEY_B).status_code == 200  # unlimited key: the limiter is not asked
    assert chat(gw, KEY_LIMITED).status_code == 200
    assert metric(gw, "gateway_ratelimit_fallback") == 1
    redis.restart()
    deadline = time.monotonic() + 15  # the breaker probes again after its reset time
    while metric(gw, "gateway_ratelimit_fallback") == 1:
        assert time.monotonic() < deadline, "the limiter never went back to Redis"
        chat(gw, KEY_LIMITED)
        time.sleep(0.5)
    assert any("Redis is back" in r.getMessage() for r in caplog.records)
