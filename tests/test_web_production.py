"""Search and the web in production (agent.py): what chapters 29 and 30 leave to the production layer.

The chapters' behaviour (grep and glob over rg, web_fetch's address policy and fence,
web_search over Brave, the browser) is tested in test_ex29.py, test_ex30.py and
tests/real_browser, on agent.py too. Here is what agent.py promises beyond them:

- grep and glob go where read_file goes: their path passes the file tools' gate, so
  .sessions/ and .trash/ are refused and .env asks (with no terminal: refused), where a
  chapter's search reads them all;
- BRAVE_SEARCH_API_KEY is a setting like the others, from the environment or .env, and a
  secret like the API key: no command inherits it, under its name or inside another
  variable's value, and no tool result carries it to the model or the session file.

agent.py runs as a subprocess against the fake provider; the tests read what the provider
received, what the tools returned and what is on disk.
"""

from __future__ import annotations

import json

import pytest
from test_ex29 import KEY, run_calls, search_env
from web_fixtures import BRAVE_PATH, WebServer, brave

from helpers import session_file

KEY_GONE = "[BRAVE_SEARCH_API_KEY removed]"
REFUSED = "error: .sessions/ and .trash/ hold the agent's own records; the file tools do not touch them"


@pytest.fixture
def site():
    with WebServer() as server:
        yield server


@pytest.mark.parametrize("tool, arguments", [("grep", {"pattern": "."}), ("glob", {"pattern": "*"})])
def test_a_search_of_the_agents_records_is_refused_and_of_env_asks(provider, workdir, tool, arguments) -> None:
    (workdir / ".env").write_text("OPENAI_API_KEY=sk-in-the-env-file-1234\n")
    (workdir / ".trash").mkdir()
    (workdir / ".trash" / "old.txt").write_text("an overwritten secret\n")
    found, _ = run_calls(
        "final",
        provider,
        workdir,
        [("s", tool, arguments | {"path": ".sessions"}), ("t", tool, arguments | {"path": ".trash"})],
        [("e", tool, arguments | {"path": ".env"})],  # no terminal: the question is refused
    )
    assert found["s"] == found["t"] == REFUSED
    assert found["e"] == "error: permission denied — the user did not approve this"
    assert "sk-in-the-env-file" not in json.dumps(provider.requests[-1]["body"])


def test_the_search_key_is_read_from_env_like_every_setting(provider, workdir, site) -> None:
    site.route(BRAVE_PATH, brave(("Found", "https://example.org/", "it")))
    (workdir / ".env").write_text(f"BRAVE_SEARCH_API_KEY={KEY}\n")
    found, _ = run_calls(
        "final", provider, workdir, [("q", "web_search", {"query": "q"})], AGENT_TEST_BRAVE_URL=site.url(BRAVE_PATH)
    )
    assert "1. Found" in found["q"]
    assert site.requests[0]["headers"]["x-subscription-token"] == KEY


def test_the_search_key_reaches_no_command_and_no_tool_result(provider, workdir, site) -> None:
    (workdir / "leak.txt").write_text(f"brave={KEY}\n")
    commands = {"command": "printenv BRAVE_SEARCH_API_KEY HIDES; cat leak.txt; echo end"}
    found, run = run_calls(
        "final",
        provider,
        workdir,
        [("r", "read_file", {"path": "leak.txt"}), ("g", "grep", {"pattern": "brave"})],
        [("b", "bash", commands)],
        answers="y\n",
        HIDES=f"prefix-{KEY}-suffix",  # a variable that holds the key inside its value goes too
        **search_env(site),
    )
    assert found["r"] == f"brave={KEY_GONE}\n"
    assert found["g"] == f"leak.txt:1:brave={KEY_GONE}"
    assert found["b"] == f"brave={KEY_GONE}\nend\n"
    stored = session_file(workdir, run.stderr).read_text()
    for where in (stored, *(json.dumps(request["body"]) for request in provider.requests)):
        assert KEY not in where


def test_a_key_shorter_than_8_characters_is_no_secret_to_take_out(provider, workdir) -> None:
    (workdir / "note.txt").write_text("abc is short\n")
    found, _ = run_calls(
        "final", provider, workdir, [("r", "read_file", {"path": "note.txt"})], BRAVE_SEARCH_API_KEY="abc"
    )
    assert found["r"] == "abc is short\n"


def test_a_key_shorter_than_8_characters_takes_no_variable_from_a_command(provider, workdir) -> None:
    """Ollama takes any key, and its users write "ollama" or "x": looked for inside values, such a
    key took TERM=xterm, a HOME or a models directory away from every command. The key itself,
    by its name, still goes."""
    found, _ = run_calls(
        "final",
        provider,
        workdir,
        [("b", "bash", {"command": "printenv MODELS TERM OPENAI_API_KEY; echo end"})],
        answers="y\n",
        OPENAI_API_KEY="x",
        MODELS="/srv/ollama/models",
        TERM="xterm",
    )
    assert found["b"] == "/srv/ollama/models\nxterm\nend\n"
