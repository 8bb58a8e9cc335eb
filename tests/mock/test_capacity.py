"""The mock as a small model server (docs/spec.md §21): a capacity, a real queue, vLLM's
``/metrics`` — over real sockets (``gateway mock-upstream --capacity N``), in process
(``mock://?capacity=N``) and as the queue itself."""

from __future__ import annotations

import asyncio
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.fleet.load import read_metrics
from gateway.mock.capacity import BLOCKS_PER_REQUEST, Capacity, in_process
from gateway.mock.engine import MockSettings, reply
from tests.support import Process, free_port, gateway_cli, openai_client

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def vllm_gauges(text: str) -> dict[str, float]:
    """The model server's gauges as a Prometheus client reads them."""
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("vllm:") and s.name != "vllm:cache_config_info"
    }


def scrape(base: str) -> dict[str, float]:
    with urllib.request.urlopen(base + "/metrics", timeout=5) as resp:
        assert resp.headers["content-type"].startswith("text/plain; version=0.0.4")
        return vllm_gauges(resp.read().decode())


def wait_for(base: str, want: dict[str, float], timeout: float = 10.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        got = scrape(base)
        if all(got.get(k) == v for k, v in want.items()) or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


async def hold(port: int, body: dict[str, object], latency_ms: int) -> asyncio.StreamWriter:
    """A chat request that takes ``latency_ms`` in its slot; the connection is left open."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    data = orjson.dumps(body)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + f"x-mock-latency-ms: {latency_ms}\r\ncontent-length: {len(data)}\r\n\r\n".encode()
        + data
    )
    await writer.drain()
    return writer


@pytest.fixture(scope="module")
def model_server() -> Iterator[Process]:
    """``gateway mock-upstream --capacity 2`` as its own process."""
    port = free_port()
    proc = Process(gateway_cli("mock-upstream", "--port", str(port), "--capacity", "2"), port)
    yield proc
    proc.stop()


def test_requests_beyond_capacity_wait_in_a_queue_metrics_report_it(model_server):
    base = model_server.url
    assert scrape(base) == {
        "vllm:num_requests_running": 0.0,
        "vllm:num_requests_waiting": 0.0,
        "vllm:kv_cache_usage_perc": 0.0,
    }

    async def five_held_then_gone() -> tuple[dict[str, float], dict[str, float]]:
        writers = [await hold(model_server.port, CHAT, 60_000) for _ in range(5)]
        want = {"vllm:num_requests_running": 2.0, "vllm:num_requests_waiting": 3.0}
        busy = await asyncio.to_thread(wait_for, base, want)
        for w in writers:  # the clients go away: their slots and places in the queue free
            w.close()
            await w.wait_closed()
        idle = {"vllm:num_requests_running": 0.0, "vllm:num_requests_waiting": 0.0}
        return busy, await asyncio.to_thread(wait_for, base, idle)

    busy, idle = asyncio.run(asyncio.wait_for(five_held_then_gone(), 30))
    assert busy == {
        "vllm:num_requests_running": 2.0,
        "vllm:num_requests_waiting": 3.0,
        "vllm:kv_cache_usage_perc": 1.0,
    }
    assert idle["vllm:kv_cache_usage_perc"] == 0.0


def test_it_states_its_kv_cache_size_as_vllm_does(model_server):
    with urllib.request.urlopen(model_server.url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    (info,) = [
        s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "vllm:cache_config_info"
    ]
    assert info.value == 1.0 and info.labels["num_gpu_blocks"] == str(2 * BLOCKS_PER_REQUEST)
    assert read_metrics(text)[4] == 2 * BLOCKS_PER_REQUEST  # what a gateway reads of it


def test_a_queued_request_is_answered_once_a_slot_frees(model_server):
    client = openai_client(model_server.url + "/v1", "x")

    async def run() -> str:
        writers = [await hold(model_server.port, CHAT, 60_000) for _ in range(2)]
        want = {"vllm:num_requests_running": 2.0}
        assert (await asyncio.to_thread(wait_for, model_server.url, want))[
            "vllm:num_requests_running"
        ] == 2.0

        def streamed() -> str:
            stream = client.chat.completions.create(
                model="m", messages=CHAT["messages"], stream=True
            )
            return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

        answer = asyncio.create_task(asyncio.to_thread(streamed))
        queued = await asyncio.to_thread(
            wait_for, model_server.url, {"vllm:num_requests_waiting": 1.0}
        )
        assert queued["vllm:num_requests_waiting"] == 1.0 and not answer.done()
        writers[0].close()  # a slot frees: the queued stream runs in it
        text = await answer
        for w in writers:
            w.close()
            await w.wait_closed()
        return text

    assert asyncio.run(asyncio.wait_for(run(), 30))


def test_the_sdk_through_a_queue_gets_whole_answers(model_server):
    client = openai_client(model_server.url + "/v1", "x")
    with_pace = client.with_options(default_headers={"x-mock-latency-ms": "20"})

    async def many() -> list[str]:
        calls = [
            asyncio.to_thread(
                with_pace.chat.completions.create, model="m", messages=CHAT["messages"]
            )
            for _ in range(6)
        ]
        return [c.choices[0].message.content or "" for c in await asyncio.gather(*calls)]

    answers = asyncio.run(asyncio.wait_for(many(), 30))
    assert len(answers) == 6 and all(a.split() for a in answers)
    assert scrape(model_server.url)["vllm:num_requests_running"] == 0.0


def test_without_a_capacity_there_is_no_metrics_endpoint():
    port = free_port()
    proc = Process(gateway_cli("mock-upstream", "--port", str(port)), port)
    try:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(proc.url + "/metrics", timeout=5)
        err.value.close()
        assert err.value.code == 404
    finally:
        proc.stop()


@pytest.mark.parametrize("value", ["0", "-1", "x"])
def test_a_bad_capacity_is_refused(value):
    args = gateway_cli("mock-upstream", "--port", str(free_port()), "--capacity", value)
    done = subprocess.run(args, capture_output=True, timeout=30, text=True)
    assert done.returncode == 2
    assert "capacity" in done.stderr


# ---------------------------------------------------------------- in process: mock://?capacity=N


def test_a_mock_url_with_a_capacity_names_one_server():
    a = in_process("mock://fleet-a?capacity=3&ttft_ms=5")
    assert a is not None and a.limit == 3
    assert MockSettings.from_url("mock://fleet-a?capacity=3&ttft_ms=5").capacity is a
    assert MockSettings.from_url("mock://fleet-a?capacity=3&ttft_ms=5").ttft_ms == 5
    assert in_process("mock://fleet-b?capacity=3") is not a
    assert MockSettings.from_url("mock://?ttft_ms=5").capacity is None
    with pytest.raises(ValueError, match="capacity"):
        MockSettings.from_url("mock://bad?capacity=zero")


def test_in_process_answers_hold_a_slot_until_their_last_byte():
    settings = MockSettings.from_url("mock://slot-test?capacity=1")
    cap = settings.capacity
    assert cap is not None

    async def run() -> None:
        first = reply("POST", "/chat/completions", orjson.dumps(CHAT), settings)
        second = reply(
            "POST", "/chat/completions", orjson.dumps({**CHAT, "stream": True}), settings
        )
        assert first.events is not None and second.events is not None
        assert first.content_type == "application/json"
        body = await anext(first.events)  # runs in the one slot
        assert orjson.loads(body)["object"] == "chat.completion"
        assert (cap.running, cap.waiting) == (1, 0)
        waiting = asyncio.create_task(anext(second.events))
        await asyncio.sleep(0)
        assert (cap.running, cap.waiting) == (1, 1)
        with pytest.raises(StopAsyncIteration):
            await anext(first.events)  # its last byte: the slot passes on
        assert (await waiting).startswith(b"data: ")
        assert (cap.running, cap.waiting) == (1, 0)
        await second.events.aclose()  # type: ignore[attr-defined]
        assert (cap.running, cap.waiting) == (0, 0)

    asyncio.run(asyncio.wait_for(run(), 10))


def test_errors_and_token_counts_take_no_slot():
    settings = MockSettings.from_url("mock://no-slot?capacity=1")
    r = reply("POST", "/chat/completions", orjson.dumps({"model": "mock-status-503"}), settings)
    assert r.status == 503 and r.body is not None
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert reply("POST", "/messages/count_tokens", orjson.dumps(body), settings).body is not None


# ---------------------------------------------------------------- the queue itself


def test_the_queue_is_first_come_first_served_and_cancelled_waits_leave_it():
    async def run() -> list[int]:
        cap = Capacity(1)
        await cap.acquire()
        order: list[int] = []

        async def worker(i: int) -> None:
            await cap.acquire()
            order.append(i)
            cap.release()

        tasks = [asyncio.create_task(worker(i)) for i in range(4)]
        await asyncio.sleep(0)
        assert cap.waiting == 4
        tasks[1].cancel()  # leaves the queue
        await asyncio.sleep(0)
        assert cap.waiting == 3
        cap.release()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert (cap.running, cap.waiting) == (0, 0)
        return order

    assert asyncio.run(asyncio.wait_for(run(), 5)) == [0, 2, 3]


def test_a_slot_handed_to_a_cancelled_waiter_passes_on():
    async def run() -> None:
        cap = Capacity(1)
        await cap.acquire()
        first = asyncio.create_task(cap.acquire())
        second = asyncio.create_task(cap.acquire())
        await asyncio.sleep(0)
        cap.release()  # handed to ``first`` ...
        first.cancel()  # ... which is cancelled before it runs: ``second`` gets it
        await asyncio.sleep(0)
        await asyncio.wait_for(second, 1)
        assert first.cancelled() and (cap.running, cap.waiting) == (1, 0)

    asyncio.run(asyncio.wait_for(run(), 5))
