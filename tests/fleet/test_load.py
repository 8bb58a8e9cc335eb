"""The model-server scrapers (docs/spec.md §21): what is read from vLLM's and SGLang's metrics,
and each scraper against simulated model servers over real sockets — live state, forced
values, a failing, hanging or unreadable endpoint, a refused connection."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest

from gateway.config import BackendConfig, RouteConfig
from gateway.errors import GatewayError
from gateway.fleet.health import Health
from gateway.fleet.load import (
    Fleet,
    Load,
    MetricsError,
    Scraper,
    has_load_source,
    read_load,
    read_metrics,
)
from gateway.mock.capacity import in_process
from gateway.routes import Backend, Route
from gateway.transports import for_backend
from tests.fleet_support import ModelServer
from tests.support import free_port

MODEL = 'model_name="meta-llama/Llama-3.1-8B-Instruct"'
#: an excerpt of a vLLM V1 server's /metrics, in its order, with what surrounds our three
VLLM_V1 = f"""# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{{generation="0"}} 12026.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",{MODEL}}} 3.0
vllm:num_requests_running{{engine="1",{MODEL}}} 4.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",{MODEL}}} 2.0
vllm:num_requests_waiting{{engine="1",{MODEL}}} 5.0
# HELP vllm:num_requests_waiting_by_reason Requests waiting, by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{{engine="0",{MODEL},reason="capacity"}} 99.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",{MODEL}}} 0.41
vllm:kv_cache_usage_perc{{engine="1",{MODEL}}} 0.83
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{engine="0",{MODEL}}} 36672.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.001",{MODEL}}} 0.0
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.005",{MODEL}}} 2.0
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",{MODEL}}} 7.0
vllm:time_to_first_token_seconds_count{{engine="0",{MODEL}}} 7.0
vllm:time_to_first_token_seconds_sum{{engine="0",{MODEL}}} 1.25
"""
#: an older (V0) vLLM: gpu_cache_usage_perc, no engine label
VLLM_V0 = f"""# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{{MODEL}}} 8.0
# HELP vllm:num_requests_swapped Number of requests swapped to CPU.
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{{{MODEL}}} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{{MODEL}}} 1.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{{{MODEL}}} 0.92
# HELP vllm:cpu_cache_usage_perc CPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:cpu_cache_usage_perc gauge
vllm:cpu_cache_usage_perc{{{MODEL}}} 0.0
"""
SGLANG = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen",tp_rank="0"} 12.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="qwen",tp_rank="0"} 3.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="qwen",tp_rank="0"} 0.57
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{model_name="qwen",tp_rank="0"} 812.5
"""


# ---------------------------------------------------------------- reading the text


def test_vllm_v1_queues_and_running_are_summed_kv_is_the_fullest_engine():
    assert read_load(VLLM_V1) == (7.0, 7.0, 0.83)


def test_vllm_v0_reads_the_older_kv_cache_name():
    assert read_load(VLLM_V0) == (1.0, 8.0, 0.92)


def test_the_newer_kv_cache_name_wins_when_both_are_there():
    both = VLLM_V0 + f"vllm:kv_cache_usage_perc{{{MODEL}}} 0.1\n"
    assert read_load(both)[2] == 0.1


def test_sglang():
    assert read_load(SGLANG) == (3.0, 12.0, 0.57)


def test_what_the_servers_say_of_their_size():
    # vLLM's cache_config_info: an info gauge whose labels are the cache's settings
    config = (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",'
        'gpu_memory_utilization="0.9",num_cpu_blocks="4096",num_gpu_blocks="27615"} 1.0\n'
    )
    assert read_metrics(VLLM_V1 + config) == (7.0, 7.0, 0.83, None, 27615.0)
    assert read_metrics(VLLM_V1)[3:] == (None, None)
    capacity = "# TYPE sglang:max_running_requests gauge\nsglang:max_running_requests 48.0\n"
    assert read_metrics(SGLANG + capacity) == (3.0, 12.0, 0.57, 48.0, None)
    garbled = 'vllm:num_requests_waiting 0\nvllm:cache_config_info{num_gpu_blocks="many"} 1\n'
    assert read_metrics(garbled) == (0.0, None, None, None, None)


def test_untyped_lines_and_only_a_queue_depth():
    assert read_load("vllm:num_requests_waiting 4\n") == (4.0, None, None)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "process_cpu_seconds_total 1.0\n",
        "vllm:kv_cache_usage_perc 0.5\n",  # no queue depth: nothing to rank by
        'vllm:num_requests_waiting{engine="0" 3\n',  # broken
        "vllm:num_requests_waiting three\n",
    ],
)
def test_text_without_a_readable_queue_depth_is_refused(text):
    with pytest.raises(MetricsError):
        read_load(text)


# ---------------------------------------------------------------- scraping real servers


def watching(server: ModelServer, period_ms: float = 200, **cfg: object) -> Backend:
    config = BackendConfig(
        name=server.name,
        url=f"{server.url}/v1",
        metrics_url=f"{server.url}/metrics",
        metrics_interval_ms=period_ms,
        **cfg,  # type: ignore[arg-type]
    )
    return Backend(config, for_backend(config), environ={})


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer("a", capacity=2) as s:
        yield s


def scrape(backend: Backend) -> Load:
    async def once() -> Load:
        scraper = Scraper(backend, lambda b, load: None)
        try:
            return await scraper.scrape()
        finally:
            await scraper.aclose()

    return asyncio.run(asyncio.wait_for(once(), 10))


def test_a_scrape_reads_the_servers_own_state(server):
    load = scrape(watching(server))
    assert (load.queue, load.running, load.kv_cache, load.saturated) == (0.0, 0.0, 0.0, False)
    assert load.until == pytest.approx(load.at + 3 * 0.2)


@pytest.mark.parametrize(
    ("forced", "saturated"),
    [
        ({"queue": 4, "kv": 0.79}, False),
        ({"queue": 5, "kv": 0.1}, True),  # queue at max_queue
        ({"queue": 0, "kv": 0.8}, True),  # KV-cache at max_kv_cache
        ({"queue": 5, "kv": 0.1, "fmt": "sglang"}, True),
        ({"queue": 1, "kv": 0.3, "fmt": "sglang"}, False),
    ],
)
def test_forced_values_and_saturation(server, forced, saturated):
    server.force(running=3, **forced)
    load = scrape(watching(server, max_queue=5, max_kv_cache=0.8))
    assert (load.queue, load.running, load.kv_cache) == (forced["queue"], 3.0, forced["kv"])
    assert load.saturated is saturated


@pytest.mark.parametrize("mode", ["fail", "garbage"])
def test_a_failing_or_unreadable_endpoint_is_an_error(server, mode):
    server.mode = mode
    with pytest.raises(MetricsError):
        scrape(watching(server))


def test_a_hanging_endpoint_times_out_after_one_period(server):
    server.mode = "hang"
    with pytest.raises(TimeoutError):
        scrape(watching(server, period_ms=100))


def test_a_refused_connection_is_an_error():
    port = free_port()  # nothing listens there
    config = BackendConfig(
        name="gone", url=f"http://127.0.0.1:{port}/v1", metrics_url=f"http://127.0.0.1:{port}/m"
    )
    with pytest.raises(GatewayError):
        scrape(Backend(config, for_backend(config), environ={}))


def test_an_in_process_mock_with_a_capacity_is_read_in_process():
    config = BackendConfig(name="m", url="mock://scrape-me?capacity=4")
    b = Backend(config, for_backend(config), environ={})
    assert has_load_source(b)
    cap = in_process(config.url)
    assert cap is not None and cap.try_acquire()
    load = scrape(b)
    assert (load.queue, load.running, load.kv_cache) == (0.0, 1.0, 0.25)
    cap.release()
    plain = BackendConfig(name="p", url="mock://")
    assert not has_load_source(Backend(plain, for_backend(plain), environ={}))


# ---------------------------------------------------------------- the scrapers' tasks


def health_of(b: Backend) -> Health:
    cfg = RouteConfig(models=("*",), backends=(b.name,))
    return Health((b,), (Route(cfg, (b,)),))


def test_the_fleet_publishes_loses_and_regains_the_load(server, caplog):
    b = watching(server, period_ms=100)
    health = health_of(b)

    async def run() -> None:
        fleet = Fleet([b], health.publish)
        assert len(fleet.scrapers) == 1
        fleet.start()
        try:

            async def until(check, what: str) -> None:
                async with asyncio.timeout(10):  # the scraper's task sets it: poll
                    while not check():  # noqa: ASYNC110
                        await asyncio.sleep(0.01)

            server.force(queue=2, running=1, kv=0.5)
            await until(lambda: (health.load(b) or Load(0, 0, 0, 0, 0, 0)).queue == 2, "known")
            server.mode = "fail"
            await until(lambda: health.load(b) is None, "unknown")
            failing_from = server.scrapes
            await until(lambda: server.scrapes >= failing_from + 3, "three failed scrapes")
            gauges = health.load_gauges()
            assert gauges["gateway_backend_queue_depth"] == {}
            assert gauges["gateway_backend_saturated"] == {("a",): 0.0}
            assert ("a",) in gauges["gateway_backend_metrics_age_seconds"]
            server.mode = "hang"  # a hung endpoint: unknown too, the task goes on
            await asyncio.sleep(0.3)
            assert health.load(b) is None
            server.force(queue=7, running=2, kv=0.9)
            await until(lambda: health.load(b) is not None, "known again")
            gauges = health.load_gauges()
            assert gauges["gateway_backend_queue_depth"] == {("a",): 7.0}
            assert gauges["gateway_backend_running_requests"] == {("a",): 2.0}
            assert gauges["gateway_backend_kv_cache_usage_ratio"] == {("a",): 0.9}
            assert gauges["gateway_backend_saturated"] == {("a",): 1.0}
            assert health.snapshot()["a"]["load"]["saturated"] is True
        finally:
            await fleet.aclose()
        left = [t for t in asyncio.all_tasks() if t.get_name().startswith("scrape ")]
        assert not left, left  # the scraper's task ended with the fleet

    with caplog.at_level(logging.INFO, logger="gateway"):
        asyncio.run(asyncio.wait_for(run(), 30))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    # one line when it starts failing (not one per failed scrape), one when it is back; the
    # hang that followed the errors continued that failure (a loaded machine may add a
    # timed-out scrape of its own elsewhere: only the 500s are counted)
    failed = (
        f"backend a: load unknown, its metrics scrape failed: {server.url}/metrics answered 500"
    )
    assert warnings.count(failed) == 1
    assert "backend a: metrics scraped again" in caplog.messages


def test_a_fleet_without_load_sources_has_no_scrapers():
    config = BackendConfig(name="p", url="http://127.0.0.1:9/v1")
    assert (
        Fleet([Backend(config, for_backend(config), environ={})], lambda b, x: None).scrapers == ()
    )
