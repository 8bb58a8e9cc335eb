"""The agent CLIs pointed at the gateway (docs/spec.md §23): Claude Code (``claude mcp add
--transport http`` or ``--mcp-config``) and Codex (its ``[mcp_servers]`` config) list and call
the built-in server's tools through ``/mcp`` and ``/mcp/{server}``, their model calls going to the
gateway's mock, which calls an MCP tool when a request offers one (gateway/mock/tools.py).

Each CLI runs as a subprocess, offline (only the gateway on loopback), in a temporary HOME with a
gateway key of its own tenant, so what the gateway logged and counted is known to be that CLI's.
The binaries are the pinned ones scripts/setup installs in .agents-cli/; a missing one fails.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gateway.config import Config
from tests.spend_support import sample
from tests.support import GatewayServer, gateway_config

BIN = Path(__file__).resolve().parents[2] / ".agents-cli" / "node_modules" / ".bin"
KEYS = {"claude-code": "sk-claude-code-test-key", "codex": "sk-codex-test-key"}
TIMEOUT_S = 120


def agents_config() -> Config:
    """The mock model backend, the built-in MCP server, one key (tenant) per CLI."""
    keys = "".join(
        f"""
[[auth.keys]]
tenant = "{tenant}"
sha256 = "{hashlib.sha256(key.encode()).hexdigest()}"
mcp_servers = ["builtin"]
mcp_tools = ["builtin__echo"]
"""
        for tenant, key in KEYS.items()
    )
    return gateway_config(
        f"""
[logging]
access_log = "all"

[[backends]]
name = "mock"
url = "mock://"
provider = "mock"

[[routes]]
models = ["*"]
backends = ["mock"]

[[mcp_servers]]
name = "builtin"
url = "mock://"

[auth]
mode = "keys"
{keys}
"""
    )


def binary(name: str) -> str:
    path = BIN / name
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is missing: scripts/setup installs the agent CLIs (npm)")
    return str(path)


def run(args: list[str], home: Path, env: dict[str, str]) -> str:
    """Run a CLI in ``home`` (its HOME and working directory) with only ``env`` (no credentials
    or proxies of ours); its whole process group is killed when it outlasts TIMEOUT_S."""
    work = home / "work"
    work.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        args,
        cwd=work,
        env={"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(
            f"{args[:2]} still running after {TIMEOUT_S} s:\n{out.decode(errors='replace')}"
        )
    text = out.decode(errors="replace")
    assert proc.returncode == 0, f"{args[:2]} exited {proc.returncode}:\n{text}"
    return text


def claude(gw: GatewayServer, home: Path, path: str, setup: str) -> dict[str, Any]:
    """Claude Code in print mode; its MCP server ``gateway`` added with ``claude mcp add`` or given
    with ``--mcp-config``; the one tool it may call is the gateway's echo."""
    exe, url = binary("claude"), gw.url + path
    key = KEYS["claude-code"]
    env = {
        "ANTHROPIC_BASE_URL": gw.url,
        "ANTHROPIC_API_KEY": key,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "ENABLE_TOOL_SEARCH": "false",  # MCP tools offered to the model, not deferred
    }
    tool = "mcp__gateway__builtin__echo" if path == "/mcp" else "mcp__gateway__echo"
    args = [exe, "-p", "Echo something", "--output-format", "json", "--allowedTools", tool]
    if setup == "mcp add":
        header = f"Authorization: Bearer {key}"
        run(
            [exe, "mcp", "add", "--transport", "http", "gateway", url, "--header", header],
            home,
            env,
        )
    else:
        servers = {
            "gateway": {"type": "http", "url": url, "headers": {"Authorization": f"Bearer {key}"}}
        }
        (home / "mcp.json").write_text(json.dumps({"mcpServers": servers}))
        args += ["--mcp-config", str(home / "mcp.json"), "--strict-mcp-config"]
    result: dict[str, Any] = json.loads(run(args, home, env).strip().splitlines()[-1])
    return result


def codex(gw: GatewayServer, home: Path, path: str) -> str:
    """``codex exec`` with the gateway as its model provider (Responses API) and as its MCP
    server ``gateway`` (bearer token from an env var, tools approved in the config)."""
    (home / ".codex").mkdir()
    (home / ".codex" / "config.toml").write_text(
        f"""
model = "gpt-5"
model_provider = "gateway"

[model_providers.gateway]
name = "gateway"
base_url = "{gw.base_url}"
env_key = "GATEWAY_KEY"
wire_api = "responses"

[mcp_servers.gateway]
url = "{gw.url + path}"
bearer_token_env_var = "GATEWAY_KEY"
default_tools_approval_mode = "approve"
"""
    )
    env = {"CODEX_HOME": str(home / ".codex"), "GATEWAY_KEY": KEYS["codex"]}
    return run([binary("codex"), "exec", "--skip-git-repo-check", "Echo something"], home, env)


def assert_one_tool_call_between_model_calls(
    lines: list[dict[str, Any]], tenant: str, model_path: str, path: str
) -> None:
    """The gateway's access log: the CLI listed the tools and called echo once, through
    ``path``, after the model call that asked for it and before the one that got its result."""
    mine = [x for x in lines if x["tenant"] == tenant]
    assert mine, f"no access-log line of {tenant}: {lines}"
    assert {x["path"] for x in mine} == {path, model_path}
    mcp = [x for x in mine if x.get("mcp")]
    assert "tools/list" in [x["mcp"]["method"] for x in mcp]
    calls = [x for x in mcp if x["mcp"]["method"] == "tools/call"]
    assert [(x["mcp"]["server"], x["mcp"]["tool"], x["mcp"]["status"]) for x in calls] == [
        ("builtin", "echo", "ok")
    ]
    # Claude Code tries the newest Messages form first (a mid-conversation system message, a
    # beta); the mock, following the public API, answers 400 and the CLI asks again without it
    model = [x for x in mine if x["path"] == model_path and x["status"] != 400]
    assert all(x["status"] == 200 for x in model + calls)
    (call,) = calls
    assert any(x["ts"] < call["ts"] for x in model), "no model call asked for the tool"
    assert any(x["ts"] > call["ts"] for x in model), "no model call got the tool's result"


@pytest.mark.parametrize(("path", "setup"), [("/mcp", "mcp add"), ("/mcp/builtin", "mcp-config")])
def test_claude_code_calls_a_tool_through_the_gateway(gateway, access_lines, tmp_path, path, setup):
    gw = gateway(agents_config())
    result = claude(gw, tmp_path, path, setup)
    assert result["is_error"] is False and result["permission_denials"] == []
    tool = "mcp__gateway__builtin__echo" if path == "/mcp" else "mcp__gateway__echo"
    assert result["result"].startswith(f"The {tool} tool returned: ")  # the mock quotes it
    assert result["num_turns"] == 2
    assert_one_tool_call_between_model_calls(access_lines, "claude-code", "/v1/messages", path)
    server = "*" if path == "/mcp" else "builtin"
    calls = {"server": "builtin", "method": "tools/call", "tool": "echo", "status": "ok"}
    assert sample(gw.url, "gateway_mcp_requests_total", **calls) == 1
    listed = {"server": server, "method": "tools/list", "tool": "", "status": "ok"}
    assert sample(gw.url, "gateway_mcp_requests_total", **listed) >= 1


@pytest.mark.parametrize("path", ["/mcp", "/mcp/builtin"])
def test_codex_calls_a_tool_through_the_gateway(gateway, access_lines, tmp_path, path):
    gw = gateway(agents_config())
    out = codex(gw, tmp_path, path)
    tool = "builtin__echo" if path == "/mcp" else "echo"
    assert f"mcp: gateway/{tool} (completed)" in out, out
    assert f"The {tool} tool returned: " in out, out  # the mock quotes the result
    assert_one_tool_call_between_model_calls(access_lines, "codex", "/v1/responses", path)
    server = "*" if path == "/mcp" else "builtin"
    calls = {"server": "builtin", "method": "tools/call", "tool": "echo", "status": "ok"}
    assert sample(gw.url, "gateway_mcp_requests_total", **calls) == 1
    listed = {"server": server, "method": "tools/list", "tool": "", "status": "ok"}
    assert sample(gw.url, "gateway_mcp_requests_total", **listed) >= 1
