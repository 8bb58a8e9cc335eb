"""``gateway keys …`` and ``gateway tenants …`` against a real ``gateway serve`` on the
embedded store (its SQLite file in ``--data-dir``; docs/spec.md §28)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.admin.admin_support import ADMIN_KEY, admin, admin_toml, chat, wait_for
from tests.support import Process, free_port, gateway_cli


def cli(url: str, *args: str, key: str | None = ADMIN_KEY) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_ADMIN_KEY"}
    if key is not None:
        env["GATEWAY_ADMIN_KEY"] = key
    command = gateway_cli(*args, "--url", url)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)


def test_keys_and_tenants_from_the_command_line(tmp_path: Path):
    config = tmp_path / "gateway.toml"
    config.write_text(admin_toml() + '[logging]\naccess_log = "off"\n')
    port = free_port()
    args = ["serve", "-c", str(config), "--port", str(port), "--data-dir", str(tmp_path / "d")]
    server = Process(gateway_cli(*args), port)
    try:
        url = server.url
        made = cli(url, "tenants", "create", "team-a", "--budget", "50/month")
        assert made.returncode == 0, made.stderr
        out = cli(url, "keys", "create", "--tenant", "team-a", "--models", "gpt-4o*",
                  "--budget", "10/month")  # fmt: skip
        assert out.returncode == 0, out.stderr
        secret = out.stdout.split("key: ", 1)[1].split()[0]
        key_id = out.stdout.split()[0]
        assert "budget_usd=10.0" in out.stdout and "shown this once" in out.stdout
        assert chat(url, secret).status_code == 200
        listed = cli(url, "keys", "list")
        assert key_id in listed.stdout and secret not in listed.stdout
        rotated = cli(url, "keys", "rotate", key_id, "--grace", "0")
        new = rotated.stdout.split("key: ", 1)[1].split()[0]
        assert chat(url, new).status_code == 200 and chat(url, secret).status_code == 401
        assert cli(url, "keys", "block", key_id).returncode == 0
        assert chat(url, new).status_code == 401
        assert "spend" in cli(url, "keys", "get", key_id, "--json").stdout
        assert cli(url, "keys", "revoke", key_id).returncode == 0
        assert cli(url, "keys", "get", key_id).returncode == 1
        assert "team-a" in cli(url, "tenants", "list").stdout
        assert (tmp_path / "d" / "keys.sqlite3").exists()
        refused = cli(url, "keys", "list", key="wrong")
        assert refused.returncode == 1 and "401" in refused.stderr
        assert cli(url, "keys", "list", key=None).returncode == 2
    finally:
        output = server.stop()
    assert secret not in output and new not in output


def test_the_workers_of_one_gateway_share_the_sqlite_store(tmp_path: Path):
    """``--workers 2`` on the embedded store: each worker follows the one file, so a key made
    through whichever worker answered is served (then refused) by both."""
    config = tmp_path / "gateway.toml"
    config.write_text(admin_toml() + '[logging]\naccess_log = "off"\n')
    port = free_port()
    args = ["serve", "-c", str(config), "--port", str(port), "--workers", "2"]
    server = Process(gateway_cli(*args, "--data-dir", str(tmp_path / "d")), port)
    try:
        made = admin(server.url, "POST", "keys", {"tenant": "t"}).json()

        def all_answer(status: int) -> bool:  # fresh connections: the kernel picks the worker
            return all(chat(server.url, made["key"]).status_code == status for _ in range(12))

        wait_for(lambda: all_answer(200), "served by both workers", 1.0)
        admin(server.url, "DELETE", f"keys/{made['id']}")
        wait_for(lambda: all_answer(401), "refused by both workers", 1.0)
    finally:
        server.stop()
