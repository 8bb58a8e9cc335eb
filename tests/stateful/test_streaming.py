"""Uploads are streamed to the backend and contents streamed back, never held whole
(docs/spec.md §24): a 50 MB file through the ``openai`` SDK, both ways, moves the gateway
process's peak RSS (VmHWM) by a small fraction of the file."""

from __future__ import annotations

from pathlib import Path

import openai

from tests.gateway_process import gateway_process
from tests.stateful.support import start_mock

FILE_BYTES = 50 * 1024 * 1024
#: the gateway's peak RSS may grow by at most this much while the file passes both ways
MAX_GROWTH_KB = 16 * 1024


def peak_kb(pid: int) -> int:
    """VmHWM: the process's peak resident set, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmHWM for pid {pid}")


def test_a_50_mb_file_passes_both_ways_with_flat_rss(tmp_path):
    backend = start_mock()
    body = (
        f'[[backends]]\nname = "a"\nurl = "{backend.url}/v1"\n\n'
        '[[routes]]\nmodels = ["*"]\nbackends = ["a"]\n'
    )
    try:
        with (
            gateway_process(tmp_path, body) as gw,
            openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-any", max_retries=0) as client,
        ):
            data = bytes(range(256)) * (FILE_BYTES // 256)
            small = client.files.create(file=("warm.bin", b"warm"), purpose="user_data")
            assert client.files.content(small.id).read() == b"warm"
            before = peak_kb(gw.proc.pid)
            made = client.files.create(file=("big.bin", data), purpose="user_data")
            assert made.bytes == FILE_BYTES
            assert backend.objects.files.files[made.id].data == data
            after_upload = peak_kb(gw.proc.pid)
            back = client.files.content(made.id).read()
            after_download = peak_kb(gw.proc.pid)
            assert back == data
            print(
                f"\npeak RSS of the gateway (KiB): before {before}, after the 50 MB upload "
                f"{after_upload}, after the download {after_download}"
            )
            assert after_upload - before < MAX_GROWTH_KB
            assert after_download - before < MAX_GROWTH_KB
    finally:
        backend.server.stop()
