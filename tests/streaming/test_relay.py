"""The SSE relay over real sockets: each event reaches the client as soon as the upstream sent
it, with the stream headers of docs/spec.md §8."""

from __future__ import annotations

import time

from tests.support import WORDS, config_for, openai_client, paced_upstream


def test_each_event_arrives_before_the_upstream_sends_the_next(gateway, upstream):
    sent_at: list[float] = []
    up = upstream(paced_upstream(sent_at))
    gw = gateway(config_for(up.url))
    client = openai_client(gw.base_url)
    received_at: list[float] = []
    text = []
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "go"}], stream=True
    )
    for c in stream:
        received_at.append(time.monotonic())
        if c.choices and c.choices[0].delta.content:
            text.append(c.choices[0].delta.content)
    assert "".join(text) == "".join(WORDS)
    assert len(received_at) == len(WORDS) + 1  # the words, then the finish chunk
    # event i reached the client before the upstream had even sent event i+1
    for i in range(len(WORDS)):
        assert received_at[i] < sent_at[i + 1], (i, received_at[i] - sent_at[i + 1])


def test_stream_headers(gateway, upstream):
    import httpx2

    sent_at: list[float] = []
    gw = gateway(config_for(upstream(paced_upstream(sent_at, gap=0.01)).url))
    with httpx2.stream(
        "POST",
        gw.base_url + "/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True},
    ) as resp:
        body = b"".join(resp.iter_bytes())
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "text/event-stream"
    assert resp.headers["cache-control"] == "no-cache"
    assert resp.headers["x-accel-buffering"] == "no"
    assert "content-length" not in resp.headers
    assert resp.headers["vary"] == "Accept-Encoding"
    assert resp.headers["content-encoding"] == "br"  # httpx2 offers br, the preferred coding
    assert body.endswith(b"data: [DONE]\n\n")
