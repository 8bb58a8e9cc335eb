"""Files through the gateway (docs/spec.md §24): upload and download throughput, direct vs
through the gateway, and the gateway's peak RSS while a file passes. Prints a markdown table;
not a test (no assertion on speed).

    python loadtests/files.py [--sizes 1,50,200] [--rounds 3]

Processes: ``gateway mock-upstream`` (keeps each file in memory) and ``gateway serve`` with one
route to it, both on loopback, each started here and stopped by its own PID. Each round uploads
a file of each size with the ``openai`` SDK (``files.create``) and reads it back
(``files.content``), first straight to the mock, then through the gateway; the table shows the
best round per size (others share the machine: load only ever slows a round down) and the
gateway's VmHWM (peak resident set) before the first transfer and after the largest.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import Process, free_port, gateway_cli

MB = 1024 * 1024


def peak_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmHWM for pid {pid}")


def transfer(client: openai.OpenAI, data: bytes) -> tuple[float, float]:
    """Seconds to upload ``data`` and to read it back."""
    start = time.perf_counter()
    made = client.files.create(file=("bench.bin", data), purpose="user_data")
    uploaded = time.perf_counter()
    back = client.files.content(made.id).read()
    done = time.perf_counter()
    if len(back) != len(data):
        raise RuntimeError(f"read back {len(back)} bytes of {len(data)}")
    client.files.delete(made.id)
    return uploaded - start, done - uploaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1,50,200", help="file sizes in MB")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    mock_port, gw_port = free_port(), free_port()
    mock = Process(gateway_cli("mock-upstream", "--port", str(mock_port)), mock_port)
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "gateway.toml"
        config.write_text(
            f'[server]\nport = {gw_port}\n[logging]\naccess_log = "off"\nlevel = "warning"\n'
            f'[[backends]]\nname = "m"\nurl = "http://127.0.0.1:{mock_port}/v1"\n'
            '[[routes]]\nmodels = ["*"]\nbackends = ["m"]\n'
        )
        gateway = Process(gateway_cli("serve", "-c", str(config)), gw_port)
        try:
            run(sizes, args.rounds, mock_port, gateway)
        finally:
            gateway.stop()
            mock.stop()


def run(sizes: list[int], rounds: int, mock_port: int, gateway: Process) -> None:
    direct = openai.OpenAI(base_url=f"http://127.0.0.1:{mock_port}/v1", api_key="x", timeout=600)
    through = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", timeout=600)
    pid = gateway.proc.pid
    transfer(through, b"warm")
    rss_before = peak_kb(pid)
    best: dict[int, list[tuple[float, float]]] = {}
    for _ in range(rounds):
        for size in sizes:
            data = os.urandom(size * MB)
            d, g = transfer(direct, data), transfer(through, data)
            rows = best.setdefault(size, [d, g])
            rows[0] = min(rows[0], d, key=sum)
            rows[1] = min(rows[1], g, key=sum)
    rss_after = peak_kb(pid)
    print(f"\nfiles through the gateway, best of {rounds} rounds ({os.cpu_count()} CPUs, shared)\n")
    print(
        "| MB | upload direct MB/s | upload via gateway MB/s | ratio | download direct MB/s "
        "| download via gateway MB/s | ratio |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for size, ((du, dd), (gu, gd)) in best.items():
        print(
            f"| {size} | {size / du:.0f} | {size / gu:.0f} | {du / gu:.2f} | {size / dd:.0f} "
            f"| {size / gd:.0f} | {dd / gd:.2f} |"
        )
    print(
        f"\ngateway peak RSS (VmHWM): {rss_before / 1024:.1f} MiB before, "
        f"{rss_after / 1024:.1f} MiB after every transfer (largest file {max(sizes)} MB)"
    )


if __name__ == "__main__":
    main()
