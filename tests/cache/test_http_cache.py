"""The response cache through the gateway (SPEC §10), against real redis-server processes."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx2
import openai
import orjson
import pytest

from gateway.mock.engine import MockSettings, reply
from tests.redis_support import RedisCluster, RedisServer
from tests.support import (
    LAST_CHUNK,
    GatewayServer,
    Process,
    async_openai_client,
    chat_chunk,
    chunk,
    config_for,
    free_port,
    gateway_cli,
    http_response,
    openai_client,
    sse_head,
)

MSG = [{"role": "user", "content": "cache me"}]
DET = {"model": "m", "messages": MSG, "temperature": 0}


def mock_handler(delay_s: float = 0.0, pace_s: float = 0.0):
    """A scripted upstream answering like the mock engine (JSON or chunked SSE), counting calls."""

    async def handler(req, writer):
        if delay_s:
            await asyncio.sleep(delay_s)
        r = reply(req.method, req.target[3:], req.body, MockSettings())
        if r.events is None:
            writer.write(http_response(r.status, r.body or b"", r.content_type))
            return True
        writer.write(sse_head())
        async for event in r.events:
            if pace_s:
                await asyncio.sleep(pace_s)
            writer.write(chunk(event))
            await writer.drain()
        writer.write(LAST_CHUNK)
        return True

    return handler


def cached(upstream_url: str, cache: str, route_extra: str = "") -> object:
    return config_for(upstream_url, extra=cache, route_extra=route_extra)


def redis_cache(url: str, extra: str = "") -> str:
    return f"""
[cache]
backend = "redis"
url = "{url}"
timeout_ms = 300
breaker_failures = 2
breaker_reset_s = 0.5
{extra}
"""


def redis_keys(server: RedisServer) -> list[bytes]:
    import redis as redis_py

    client = redis_py.Redis.from_url(server.url)
    try:
        return sorted(client.keys("*"))
    finally:
        client.close()


def post(gw, body, **kw):
    return httpx2.post(gw.base_url + "/chat/completions", json=body, timeout=10, **kw)


def test_miss_then_hit_with_age_in_redis(gateway, upstream, redis):
    up = upstream(mock_handler())
    gw = gateway(cached(up.url, redis_cache(redis.url)))
    first = post(gw, DET)
    assert first.status_code == 200 and first.headers["x-gateway-cache"] == "MISS"
    assert "age" not in first.headers
    time.sleep(1.1)
    second = post(gw, DET)
    assert second.headers["x-gateway-cache"] == "HIT"
    assert int(second.headers["age"]) >= 1
    assert second.json() == first.json()
    assert len(up.requests) == 1
    assert "cache;desc=hit" in second.headers["server-timing"]
    assert "upstream;dur" not in second.headers["server-timing"]
    keys = redis_keys(redis)
    assert len(keys) == 1 and keys[0].startswith(b"gateway:cache:v1:default:")


@pytest.mark.parametrize(
    ("mode", "body", "cacheable"),
    [
        ("deterministic", {"model": "m", "messages": MSG, "temperature": 0}, True),
        ("deterministic", {"model": "m", "messages": MSG}, False),
        ("deterministic", {"model": "m", "messages": MSG, "temperature": 0, "n": 2}, False),
        ("deterministic", {"model": "m", "messages": MSG, "temperature": 0.7}, False),
        ("all", {"model": "m", "messages": MSG, "temperature": 0.7}, True),
        ("all", {"model": "m", "messages": MSG}, True),
    ],
)
def test_deterministic_versus_all(gateway, upstream, mode, body, cacheable):
    up = upstream(mock_handler())
    gw = gateway(cached(up.url, f'[cache]\nbackend = "memory"\nmode = "{mode}"'))
    a, b = post(gw, body), post(gw, body)
    assert a.status_code == b.status_code == 200
    if cacheable:
        assert (a.headers["x-gateway-cache"], b.headers["x-gateway-cache"]) == ("MISS", "HIT")
        assert len(up.requests) == 1
    else:
        assert a.headers["x-gateway-cache"] == b.headers["x-gateway-cache"] == "BYPASS"
        assert len(up.requests) == 2


def test_embeddings_are_cached_in_deterministic_mode(gateway, upstream):
    up = upstream(mock_handler())
    gw = gateway(cached(up.url, '[cache]\nbackend = "memory"'))
    client = openai_client(gw.base_url)
    a = client.embeddings.create(model="e", input="hello")
    b = client.embeddings.with_raw_response.create(model="e", input="hello")
    assert b.headers["x-gateway-cache"] == "HIT"
    assert b.parse().data[0].embedding == a.data[0].embedding
    assert len(up.requests) == 1


def test_key_ignores_json_key_order_and_stream_options(gateway, upstream):
    up = upstream(mock_handler())
    gw = gateway(cached(up.url, '[cache]\nbackend = "memory"'))
    a = httpx2.post(
        gw.base_url + "/chat/completions",
        content=b'{"model":"m","temperature":0,"messages":[{"role":"user","content":"k"}]}',
    )
    b = httpx2.post(
        gw.base_url + "/chat/completions",
        content=b'{"messages":[{"content":"k","role":"user"}],"temperature":0.0,  "model":"m"}',
    )
    assert a.headers["x-gateway-cache"] == "MISS" and b.headers["x-gateway-cache"] == "HIT"


@pytest.mark.parametrize("scope", ["tenant", "global"])
def test_scope_isolation_between_credentials(gateway, upstream, redis, scope):
    up = upstream(mock_handler())
    gw = gateway(cached(up.url, redis_cache(redis.url, f'scope = "{scope}"')))
    team_a = post(gw, DET, headers={"authorization": "Bearer sk-team-a"})
    team_b = post(gw, DET, headers={"authorization": "Bearer sk-team-b"})
    again_a = post(gw, DET, headers={"authorization": "Bearer sk-team-a"})
    anonymous = post(gw, DET)
    assert team_a.headers["x-gateway-cache"] == "MISS"
    assert again_a.headers["x-gateway-cache"] == "HIT"
    if scope == "tenant":
        assert team_b.headers["x-gateway-cache"] == "MISS"  # never another caller's entry
        assert anonymous.headers["x-gateway-cache"] == "MISS"
        assert len(up.requests) == 3
    else:
        assert team_b.headers["x-gateway-cache"] == "HIT"
        assert anonymous.headers["x-gateway-cache"] == "HIT"
        assert len(up.requests) == 1
    # the credential itself is never in Redis, not even in a key
    keys = redis_keys(redis)
    assert keys and not any(b"sk-team" in k for k in keys)


def test_org_and_project_headers_and_query_are_part_of_the_key(gateway, upstream):
    up = upstream(mock_handler())
    gw = gateway(cached(up.url, '[cache]\nbackend = "memory"'))
    assert post(gw, DET).headers["x-gateway-cache"] == "MISS"
    assert (
        post(gw, DET, headers={"OpenAI-Organization": "org-1"}).headers["x-gateway-cache"] == "MISS"
    )
    assert post(gw, DET, headers={"OpenAI-Project": "p"}).headers["x-gateway-cache"] == "MISS"
    r = httpx2.post(gw.base_url + "/chat/completions?api-version=1", json=DET)
    assert r.headers["x-gateway-cache"] == "MISS"
    assert (
        post(gw, DET, headers={"OpenAI-Organization": "org-1"}).headers["x-gateway-cache"] == "HIT"
    )


def collect_stream(client, **kw):
    chunks = list(client.chat.completions.create(stream=True, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


@pytest.mark.parametrize("fill", ["json", "stream"])
def test_one_entry_serves_json_and_stream(gateway, upstream, fill):
    up = upstream(mock_handler())
    gw = gateway(cached(up.url, '[cache]\nbackend = "memory"'))
    client = openai_client(gw.base_url)
    args = {"model": "mock-gpt-4o", "messages": MSG, "temperature": 0, "max_tokens": 9}
    if fill == "json":
        full = client.chat.completions.create(**args)
        text, chunks = collect_stream(client, stream_options={"include_usage": True}, **args)
        assert text == full.choices[0].message.content
        assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens == 9
        finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finish[-1].choices[0].finish_reason == "length"
    else:
        text, chunks = collect_stream(client, stream_options={"include_usage": True}, **args)
        raw = client.chat.completions.with_raw_response.create(**args)
        assert raw.headers["x-gateway-cache"] == "HIT"
        full = raw.parse()
        assert full.object == "chat.completion"
        assert full.choices[0].message.content == text
        assert full.choices[0].finish_reason == "length"
        assert full.usage.completion_tokens == 9
        # and a stream from a stream-filled entry replays the original granularity
        replay_text, replay_chunks = collect_stream(client, **args)
        assert replay_text == text
        assert [c.choices[0].delta.content for c in replay_chunks if c.choices] == [
            c.choices[0].delta.content for c in chunks if c.choices
        ]
        assert all(c.usage is None for c in replay_chunks)  # not asked for this time
    assert len(up.requests) == 1


def test_completions_cached_both_ways(gateway, upstream):
    up = upstream(mock_handler())
    gw = gateway(cached(up.url, '[cache]\nbackend = "memory"'))
    client = openai_client(gw.base_url)
    chunks = list(
        client.completions.create(model="m", prompt="p", temperature=0, max_tokens=4, stream=True)
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    full = client.completions.create(model="m", prompt="p", temperature=0, max_tokens=4)
    assert full.choices[0].text == text and full.object == "text_completion"
    assert len(up.requests) == 1


def test_cached_stream_replays_without_delays(gateway, upstream):
    up = upstream(mock_handler(pace_s=0.05))
    gw = gateway(cached(up.url, '[cache]\nbackend = "memory"'))
    client = openai_client(gw.base_url)
    args = {"model": "m", "messages": MSG, "temperature": 0, "max_tokens": 10}
    t0 = time.monotonic()
    collect_stream(client, **args)
    upstream_s = time.monotonic() - t0
    t1 = time.monotonic()
    text, _ = collect_stream(client, **args)
    replay_s = time.monotonic() - t1
    assert text
    # the upstream paced 13 events 50 ms apart; the replay does not reproduce the pacing
    assert upstream_s > 0.5 and replay_s < upstream_s / 2


def test_cache_control_directives(gateway, upstream):
    up = upstream(mock_handler())
    gw = gateway(cached(up.url, '[cache]\nbackend = "memory"'))
    assert (
        post(gw, DET, headers={"cache-control": "no-store"}).headers["x-gateway-cache"] == "BYPASS"
    )
    assert post(gw, DET).headers["x-gateway-cache"] == "MISS"  # no-store stored nothing
    assert post(gw, DET).headers["x-gateway-cache"] == "HIT"
    # no-cache: skip the lookup (go upstream) but store the fresh answer
    r = post(gw, DET, headers={"cache-control": "no-cache"})
    assert r.headers["x-gateway-cache"] == "MISS"
    assert len(up.requests) == 3
    time.sleep(1.1)
    # max-age: only entries younger than N seconds
    assert (
        post(gw, DET, headers={"cache-control": "max-age=0"}).headers["x-gateway-cache"] == "MISS"
    )
    hit = post(gw, DET, headers={"cache-control": "max-age=60"})
    assert hit.headers["x-gateway-cache"] == "HIT" and int(hit.headers["age"]) < 60
    assert len(up.requests) == 4


def test_cut_stream_and_errors_are_not_cached(gateway, upstream):
    calls = []

    async def cut_then_ok(req, writer):
        calls.append(req)
        if len(calls) == 1:  # a stream that never says [DONE]
            writer.write(sse_head() + chunk(chat_chunk("part")) + LAST_CHUNK)
        elif len(calls) == 2:
            writer.write(http_response(500, b'{"error": {"message": "x"}}'))
        else:
            writer.write(
                sse_head()
                + chunk(chat_chunk("whole"))
                + chunk(chat_chunk(None, finish="stop"))
                + chunk(b"data: [DONE]\n\n")
                + LAST_CHUNK
            )
        return True

    up = upstream(cut_then_ok)
    gw = gateway(cached(up.url, '[cache]\nbackend = "memory"'))
    client = openai_client(gw.base_url)
    args = {"model": "m", "messages": MSG, "temperature": 0}
    with pytest.raises(openai.APIError):
        collect_stream(client, **args)
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(**args)
    text, _ = collect_stream(client, **args)
    assert text == "whole"
    again, _ = collect_stream(client, **args)
    assert again == "whole" and len(calls) == 3


def test_entries_over_max_entry_bytes_are_not_stored(gateway, upstream):
    up = upstream(mock_handler())
    gw = gateway(cached(up.url, '[cache]\nbackend = "memory"\nmax_entry_bytes = 2000'))
    client = openai_client(gw.base_url)
    client.embeddings.create(model="e", input="x")  # ~30 KB
    client.embeddings.create(model="e", input="x")
    small = {"model": "m", "messages": MSG, "temperature": 0, "max_tokens": 3}
    post(gw, small)
    assert post(gw, small).headers["x-gateway-cache"] == "HIT"
    assert len(up.requests) == 3


# ---------------------------------------------------------------- single flight


def test_single_flight_concurrent_identical_requests_make_one_upstream_call(gateway, upstream):
    up = upstream(mock_handler(delay_s=0.3))
    gw = gateway(cached(up.url, '[cache]\nbackend = "memory"'))
    results: list[httpx2.Response] = []
    lock = threading.Lock()

    def one() -> None:
        r = post(gw, DET)
        with lock:
            results.append(r)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(results) == 8 and all(r.status_code == 200 for r in results)
    assert len(up.requests) == 1
    assert sorted(r.headers["x-gateway-cache"] for r in results) == ["HIT"] * 7 + ["MISS"]
    assert len({r.content for r in results}) == 1


def test_single_flight_streams_tail_the_leader_live(gateway, upstream):
    up = upstream(mock_handler(pace_s=0.05))
    gw = gateway(cached(up.url, '[cache]\nbackend = "memory"'))

    async def main() -> list[tuple[str, list[float]]]:
        client = async_openai_client(gw.base_url)
        async with client:

            async def one(delay: float) -> tuple[str, list[float]]:
                await asyncio.sleep(delay)
                stamps: list[float] = []
                parts: list[str] = []
                stream = await client.chat.completions.create(stream=True, **DET)
                async for c in stream:
                    if c.choices and c.choices[0].delta.content:
                        parts.append(c.choices[0].delta.content)
                        stamps.append(time.monotonic())
                return "".join(parts), stamps

            return list(await asyncio.gather(one(0), one(0.15), one(0.15)))

    results = asyncio.run(main())
    texts = {t for t, _ in results}
    assert len(texts) == 1 and texts.pop()
    assert len(up.requests) == 1
    leader, follower = results[0][1], results[1][1]
    # the follower got its later tokens as the leader did: live, not at the end in one lump
    assert follower[-1] - follower[len(follower) // 2] > 0.1
    assert abs(follower[-1] - leader[-1]) < 0.1


def test_followers_go_upstream_themselves_when_the_leader_fails(gateway, upstream):
    calls = []

    async def first_fails(req, writer):
        calls.append(req)
        await asyncio.sleep(0.2)
        if len(calls) == 1:
            writer.write(http_response(400, b'{"error": {"message": "no"}}'))
        else:
            writer.write(
                http_response(
                    200, orjson.dumps({"id": "c", "object": "chat.completion", "choices": []})
                )
            )
        return True

    up = upstream(first_fails)
    gw = gateway(cached(up.url, '[cache]\nbackend = "memory"'))
    results = []

    def one():
        results.append(post(gw, DET).status_code)

    threads = [threading.Thread(target=one) for _ in range(3)]
    threads[0].start()
    time.sleep(0.05)
    threads[1].start()
    threads[2].start()
    for t in threads:
        t.join(10)
    assert sorted(results) == [200, 200, 400]


# ---------------------------------------------------------------- Redis faults


def timed_post(gw, body=DET):
    t = time.monotonic()
    r = post(gw, body)
    return r, time.monotonic() - t


def test_redis_killed_then_restarted(gateway, upstream, redis):
    up = upstream(mock_handler())
    gw = gateway(cached(up.url, redis_cache(redis.url)))
    assert post(gw, DET).headers["x-gateway-cache"] == "MISS"
    baseline = max(timed_post(gw)[1] for _ in range(3))
    redis.kill()
    for i in range(6):
        r, took = timed_post(gw, {**DET, "seed": i})
        assert r.status_code == 200, r.text
        assert r.headers["x-gateway-cache"] == "BYPASS"
        assert took < baseline + 0.3 + 0.5  # normal latency + the Redis timeout, at most
    stats = gw.app.cache.stats
    assert stats.error >= 2
    assert gw.app.cache.store.state() == "open"
    redis.restart()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        r = post(gw, {**DET, "seed": 99})
        if r.headers["x-gateway-cache"] != "BYPASS":
            break
        time.sleep(0.1)
    assert r.headers["x-gateway-cache"] == "MISS"
    assert post(gw, {**DET, "seed": 99}).headers["x-gateway-cache"] == "HIT"


def test_redis_black_holed_then_resumed(gateway, upstream, redis):
    up = upstream(mock_handler())
    gw = gateway(cached(up.url, redis_cache(redis.url)))
    assert post(gw, DET).headers["x-gateway-cache"] == "MISS"
    assert post(gw, DET).headers["x-gateway-cache"] == "HIT"
    baseline = max(timed_post(gw)[1] for _ in range(3))
    redis.pause()  # SIGSTOP: accepts connections, never answers
    try:
        timings = []
        for i in range(6):
            r, took = timed_post(gw, {**DET, "seed": i})
            assert r.status_code == 200 and r.headers["x-gateway-cache"] == "BYPASS"
            timings.append(took)
        assert max(timings) < baseline + 0.3 * 2 + 0.5  # lookup + store timeouts, at most
        # once the breaker is open, a dead Redis costs no wait at all
        assert min(timings[3:]) < baseline + 0.2
    finally:
        redis.resume()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        r = post(gw, DET)
        if r.headers["x-gateway-cache"] == "HIT":
            break
        time.sleep(0.1)
    assert r.headers["x-gateway-cache"] == "HIT"


def test_two_gateway_processes_share_one_redis(upstream, redis, tmp_path):
    up = upstream(mock_handler())
    ports = [free_port(), free_port()]
    procs = []
    try:
        for port in ports:
            cfg = tmp_path / f"gw{port}.toml"
            cfg.write_text(f"""
[server]
port = {port}
[[backends]]
name = "up"
url = "{up.url}"
[[routes]]
models = ["*"]
backends = ["up"]
{redis_cache(redis.url)}
""")
            procs.append(Process(gateway_cli("serve", "--config", str(cfg)), port))
        a = httpx2.post(f"http://127.0.0.1:{ports[0]}/v1/chat/completions", json=DET)
        b = httpx2.post(f"http://127.0.0.1:{ports[1]}/v1/chat/completions", json=DET)
        assert a.headers["x-gateway-cache"] == "MISS" and b.headers["x-gateway-cache"] == "HIT"
        assert a.json() == b.json() and len(up.requests) == 1
    finally:
        for p in procs:
            p.stop()


def test_single_flight_across_replicas(upstream, redis, tmp_path):
    up = upstream(mock_handler(delay_s=0.4))
    gws = []
    try:
        for _ in range(2):
            gws.append(GatewayServer(cached(up.url, redis_cache(redis.url))).start())
        results = []

        def one(gw):
            results.append(post(gw, DET).headers["x-gateway-cache"])

        threads = [threading.Thread(target=one, args=(g,)) for g in gws]
        threads[0].start()
        time.sleep(0.1)
        threads[1].start()
        for t in threads:
            t.join(10)
        assert sorted(results) == ["HIT", "MISS"]
        assert len(up.requests) == 1
    finally:
        for g in gws:
            g.stop()


def test_redis_cluster(gateway, upstream):
    up = upstream(mock_handler())
    with RedisCluster(3) as cluster:
        gw = gateway(cached(up.url, redis_cache(cluster.url, "cluster = true")))
        bodies = [{**DET, "seed": i} for i in range(12)]  # keys spread over the slots
        assert all(post(gw, b).headers["x-gateway-cache"] == "MISS" for b in bodies)
        assert all(post(gw, b).headers["x-gateway-cache"] == "HIT" for b in bodies)
        assert len(up.requests) == 12
