"""``[[agents]]`` and the ``agents`` grant in config (docs/spec.md §4, §30): every problem named
by its key path."""

from __future__ import annotations

import pytest

from gateway.config import ConfigError, load_config

BASE = """
[[backends]]
name = "mock"
url = "mock://"
provider = "mock"
[[routes]]
name = "default"
models = ["*"]
backends = ["mock"]
"""


def test_agents_and_grants_load():
    cfg = load_config(
        text=BASE
        + '[[agents]]\nname = "research-1"\nurl = "https://agents.example/r"\ntimeout_s = 5\n'
        + '[auth]\nmode = "keys"\n[[auth.keys]]\ntenant = "t"\nsha256 = "' + "ab" * 32 + '"\n'
        + 'agents = ["research-*"]\n[[auth.tenants]]\nname = "t"\nagents = ["*"]\n',
        env={},
    )  # fmt: skip
    (agent,) = cfg.agents
    assert (agent.name, agent.url, agent.timeout_s) == ("research-1", "https://agents.example/r", 5)
    assert cfg.auth.keys[0].agents == ("research-*",) and cfg.auth.tenants[0].agents == ("*",)


@pytest.mark.parametrize(
    ("agent", "path"),
    [
        ('name = "a/b"\nurl = "http://h"', "agents[0].name"),
        ('name = "a"\nurl = "ftp://h"', "agents[0].url"),
        ('name = "a"\nurl = "http://u:p@h"', "agents[0].url"),
        ('name = "a"\nurl = "http://h/?x=1"', "agents[0].url"),
        ('name = "a"\nurl = "http://h"\ntimeout_s = 0', "agents[0].timeout_s"),
        ('name = "a"\nurl = "http://h"\nmax_message_bytes = -1', "agents[0].max_message_bytes"),
        ('name = "a"\nurl = "http://h"\nsurprise = 1', "agents[0].surprise"),
    ],
)
def test_bad_agents_are_named_by_their_key_path(agent, path):
    with pytest.raises(ConfigError) as info:
        load_config(text=BASE + "[[agents]]\n" + agent + "\n", env={})
    assert any(e.startswith(path + ":") for e in info.value.errors), info.value.errors


def test_two_agents_of_one_name_are_refused():
    agent = '[[agents]]\nname = "a"\nurl = "http://h"\n'
    with pytest.raises(ConfigError) as info:
        load_config(text=BASE + agent + agent, env={})
    assert any("duplicate agent" in e for e in info.value.errors)
