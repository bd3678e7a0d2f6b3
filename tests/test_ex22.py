"""Chapter 22: an MCP client over stdio (exercises/ex22/agent.py, and agent.py, which keeps its promises).

.mcp.json in the working directory names the servers, {"mcpServers": {"name":
{"command", "args", "env"}}}. An entry with a url, or of type "http", is skipped
with a warning that only stdio servers are supported; a file that is not JSON,
or not of that shape, is one warning, and the agent goes on. Each server is
asked about at the y/N gate before it starts, the question showing its command
line as it will run; with no terminal it is not started.

The client sends initialize with the newest protocol version it speaks, accepts
an older one it knows and refuses clearly one it does not, says
notifications/initialized, and lists the tools page by page (nextCursor). A
handshake has 30 s; a call MCP_TIMEOUT seconds (60 by default), then it is
given up with an error result. The server's own requests are answered (ping
with an empty result, the others with -32601), its notifications ignored; a
line that is no JSON object is skipped with a warning, an answer whose id is a
string is an error result, a line of more than 16 MiB stops the server: an
error result at worst, never a hang or a traceback. A result is capped like
bash's output, and isError makes it an "error:" result.

The tools join the registry as mcp__<server>__<tool>, cut and made unique to
fit ^[A-Za-z0-9_-]{1,64}$, their descriptions saying which server they are
from, a schema that is no JSON object replaced by an empty one with a warning.
A call of a tool the server marks read-only (readOnlyHint) runs without a
question; any other asks at the y/N gate, showing the tool and its arguments.

A server gets a minimal environment plus its env (never the API key), runs in
a session of its own (a Ctrl-C for the agent is not for it), its stderr comes
out on ours prefixed with its name, and every server is stopped, SIGTERM then
SIGKILL, on every way out: the end, an error, Ctrl-C, SIGTERM, SIGHUP.

The programs run as subprocesses against the fake provider, at a pseudo-terminal
that answers their questions. The servers are the book's time server and
tests/hostile_mcp.py, which misbehaves as a plan says and writes down its pid,
its environment, the signals it gets and every message it receives: whether a
server is gone is checked by its pid. One check runs in-process, on connect():
the handshake's bound, made 1 s instead of 30.

agent.py ("final") differs by design in details, each branched where a test meets it: it
offers at most 128 tools in a request (OpenAI's limit; the rest are dropped with a warning),
warns once per server about lines that are no JSON object, words some messages its own way,
remembers a yes to start a server (in $HOME/.config/agent-py/mcp-allowed: HOME is each
test's own, so a second run of a test starts the server without asking), and takes an
MCP_TIMEOUT of 1.5 s.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from hostile_mcp import FLOOD, GARBAGE, HUGE, HUGE_WIDE

from conftest import ROOT, TEST_KEY, run_agent, wait_for_file
from fake_provider import FakeProvider, Reply, error, text
from helpers import (
    Live,
    assert_ok,
    assert_one_error_line,
    calls,
    disk_messages,
    kill_quietly,
    record_arrivals,
    requests_of,
    results,
    session_file,
    tool_names,
    wait_dead,
    wait_until,
    warnings,
)

CHAPTER = 22
PROGRAMS = [CHAPTER, "final"]
programs = pytest.mark.parametrize("chapter", PROGRAMS)

HOSTILE = Path(__file__).with_name("hostile_mcp.py")
TIMESERVER = ROOT / "exercises" / "ex22" / "timeserver.py"
TIME_TOOLS = runpy.run_path(str(TIMESERVER))["TOOLS"]  # the book's server, as it lists its tools
TASK = "How many days are left until 2027-01-01?"
FINAL = "Done."
QUESTION = "allow? (y/N)"
REFUSED = "error: permission denied — the user did not approve this call"
NOBODY = "(no answer from a terminal: refused)"
NEWEST = "2025-11-25"  # the newest protocol version chapter 22 speaks
PROVIDER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # what providers accept as a tool's name
CAP = 8 * 1024  # bash's output cap (chapter 7 on)
EMPTY_SCHEMA = {"type": "object", "properties": {}}
PASSED_ON = {"PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TMPDIR", "TZ", "USER"}  # chapter 22's minimum
MAX_TOOLS = 128  # agent.py's cap on the tools of a request (OpenAI's limit); the chapter has none


# ---------------------------------------------------------------- servers, and what they wrote down


class Hostile:
    """One hostile server of a test: its .mcp.json entry, and what it wrote down.
    Its plan (see hostile_mcp.py) holds by default: it does not end when its stdin
    closes, so only a stop ends it, and a server left behind shows."""

    def __init__(self, root: Path, name: str, plan: dict) -> None:
        self.name, self.dir = name, root / f"mcp-{name}"
        self.dir.mkdir()
        files = {key: str(self.dir / key) for key in ("pid", "log", "signals", "environ", "session")}
        (self.dir / "plan.json").write_text(json.dumps({**files, "hold": True, **plan}))
        self.command = [sys.executable, str(HOSTILE), str(self.dir / "plan.json")]
        self.entry = {"command": self.command[0], "args": self.command[1:]}

    @property
    def started(self) -> bool:
        return (self.dir / "pid").exists()

    def pids(self) -> list[int]:
        """Its pid, and its child's if it has one; waits until it has started."""
        return [int(pid) for pid in wait_for_file(self.dir / "pid").split()]

    def written(self, key: str) -> list[str]:
        path = self.dir / key
        return path.read_text().splitlines() if path.exists() else []

    def received(self) -> list[dict]:
        """Every message it has received, in order."""
        return [json.loads(line) for line in self.written("log")]

    def methods(self) -> list[str | None]:
        return [message.get("method") for message in self.received()]

    def environ(self) -> dict[str, str]:
        return json.loads((self.dir / "environ").read_text())


@pytest.fixture
def hostile(tmp_path: Path):
    """hostile(name="h", **plan) makes a Hostile; whatever it started ends with the test."""
    made: list[Hostile] = []

    def make(name: str = "h", **plan: object) -> Hostile:
        made.append(Hostile(tmp_path, name, plan))
        return made[-1]

    yield make
    for server in made:
        for line in server.written("pid"):
            for pid in line.split():
                kill_quietly(int(pid))


def put_config(workdir: Path, *servers: Hostile, **entries: object) -> None:
    """.mcp.json naming the hostile servers by their names, and the other entries as they are."""
    listed = {server.name: server.entry for server in servers} | entries
    (workdir / ".mcp.json").write_text(json.dumps({"mcpServers": listed}))


TIME_SERVER = {"command": sys.executable, "args": [str(TIMESERVER)]}


def tool(name: str, read_only: bool = True, **extra: object) -> dict:
    """A tool as a server lists it: read-only unless said, so that calling it asks nothing."""
    listed = {"name": name, "description": f"The {name} tool.", "inputSchema": EMPTY_SCHEMA}
    return listed | {"annotations": {"readOnlyHint": read_only}} | extra


def echo(name: str, arguments: dict | None = None) -> str:
    """What the hostile server's tool `name` answers by default."""
    return f"{name} got {json.dumps(arguments or {})}"


def offered(provider: FakeProvider) -> dict[str, dict]:
    """The MCP tools the first request offers, by name: each one's function (name, description, parameters)."""
    functions = [entry["function"] for entry in provider.chat_requests[0].get("tools", [])]
    return {function["name"]: function for function in functions if function["name"].startswith("mcp__")}


def too_many(stderr: str, name: str, listed: int) -> int | None:
    """agent.py's warning that a server lists more tools than fit in its share of a request: how many
    it offers, or None (None too if the count it says are left out is not the rest)."""
    pattern = (
        rf"warning: MCP server '{re.escape(name)}' lists {listed} tools; (\d+) of them are left out,"
        r" only the first (\d+) fit in its share of a request"
    )
    match = re.fullmatch(pattern, "\n".join(warnings(stderr)))
    if not match or int(match.group(1)) + int(match.group(2)) != listed:
        return None
    return int(match.group(2))


def connected(stderr: str, name: str) -> tuple[str, int] | None:
    """(protocol version, number of tools) of the line a server's start prints, or None."""
    match = re.search(
        rf"^\[MCP server '{re.escape(name)}': protocol (\S+), (\d+) tools, ~[\d,]+ tokens[^\]]*\]$", stderr, re.M
    )
    return (match.group(1), int(match.group(2))) if match else None


def run(chapter: int | str, provider: FakeProvider, workdir: Path, *replies: Reply, answers: str | None = "y\n", **env):
    """TASK with the model's replies scripted, at a terminal whose person answers the
    questions with the lines of `answers` (the first: starting the server), then Ctrl-D;
    answers=None: no terminal at all."""
    provider.script(*replies)
    return run_agent(chapter, TASK, provider=provider, cwd=workdir, answers=answers, timeout=60, **env)


# ---------------------------------------------------------------- the book's time server


@programs
def test_the_time_server_s_tools_are_offered_and_a_read_only_call_asks_nothing(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    put_config(workdir, time=TIME_SERVER)
    days = calls(("d", "mcp__time__days_between", {"start": "2026-01-01", "end": "2027-01-01"}))
    result = run(chapter, provider, workdir, days, text(FINAL))
    assert_ok(result, FINAL + "\n")

    # One question: the start, showing the command line as it runs. None for the read-only call.
    command = shlex.join([sys.executable, str(TIMESERVER)])
    assert result.terminal.count(QUESTION) == 1, result.terminal
    assert f"'time': {command}\n{QUESTION} y\n" in result.terminal, result.terminal
    if chapter == CHAPTER:
        assert result.terminal == f"\n⚠  .mcp.json wants to start the MCP server 'time': {command}\n{QUESTION} y\n"
    assert connected(result.stderr, "time") == (NEWEST, 2), result.stderr

    # Its tools, in the first request: the names, a description saying whose, the schemas as listed.
    tools = offered(provider)
    assert list(tools) == [f"mcp__time__{listed['name']}" for listed in TIME_TOOLS]
    for listed in TIME_TOOLS:
        function = tools[f"mcp__time__{listed['name']}"]
        assert function["description"] == f"[from MCP server time] {listed['description']}"
        assert function["parameters"] == listed["inputSchema"]
    names = tool_names(provider.chat_requests[0])
    assert names.index("mcp__time__days_between") < names.index("sub_agent")  # children get them too

    # The answer, sent back to the model and on disk.
    assert results(provider) == {"d": "365 days"}
    stored = disk_messages(session_file(workdir, result.stderr))
    assert {"role": "tool", "tool_call_id": "d", "content": "365 days"} in stored


@programs
def test_a_bad_date_is_an_error_result(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    put_config(workdir, time=TIME_SERVER)
    bad = calls(("bad", "mcp__time__days_between", {"start": "2026-13-01", "end": "soon"}))
    assert_ok(run(chapter, provider, workdir, bad, text(FINAL)), FINAL + "\n")
    assert results(provider) == {"bad": "error: start and end must be dates written YYYY-MM-DD"}


@programs
def test_a_subagent_has_the_mcp_tools_too(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    put_config(workdir, time=TIME_SERVER)
    child_prompt = "Count the days from 2026-01-01 to 2027-01-01 with the time server."
    provider.route(
        "Count the days",
        calls(("d", "mcp__time__days_between", {"start": "2026-01-01", "end": "2027-01-01"})),
        text("365 days."),
    )
    sub = calls(("s", "sub_agent", {"description": "count", "prompt": child_prompt}))
    assert_ok(run(chapter, provider, workdir, sub, text(FINAL)), FINAL + "\n")
    first, _ = requests_of(provider, "Count the days")
    assert "mcp__time__days_between" in tool_names(first)
    assert results(provider) == {"s": "365 days."}


# ---------------------------------------------------------------- .mcp.json


@programs
def test_entries_with_a_url_or_of_type_http_are_skipped_with_a_warning(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile]
) -> None:
    server = hostile()
    web = {"type": "http", "command": sys.executable, "args": [str(HOSTILE)]}  # the type alone decides
    put_config(workdir, server, remote={"url": "https://mcp.example.com/mcp"}, web=web)
    result = run(chapter, provider, workdir, text(FINAL))
    assert_ok(result, FINAL + "\n")
    remote, web = warnings(result.stderr)
    assert "'remote'" in remote and "'web'" in web
    assert all("only" in line and "stdio" in line for line in (remote, web)), result.stderr
    assert result.terminal.count(QUESTION) == 1, "only the stdio server is asked about"
    assert list(offered(provider)) == ["mcp__h__echo"]


BAD_CONFIGS = {
    "not JSON": b'{"mcpServers": {',
    "not UTF-8": b'{"mcpServers": {"h": {"command": "\xff"}}}',
    "an array": b"[]",
    "no mcpServers": b'{"servers": {}}',
    "mcpServers an array": b'{"mcpServers": []}',
    "a directory": None,
}


@programs
@pytest.mark.parametrize("content", BAD_CONFIGS.values(), ids=BAD_CONFIGS)
def test_a_bad_mcp_json_is_one_warning_and_the_agent_goes_on(
    provider: FakeProvider, workdir: Path, chapter: int | str, content: bytes | None
) -> None:
    if content is None:
        (workdir / ".mcp.json").mkdir()
    else:
        (workdir / ".mcp.json").write_bytes(content)
    result = run(chapter, provider, workdir, text(FINAL), answers=None)
    assert_ok(result, FINAL + "\n")
    (warned,) = warnings(result.stderr)
    assert ".mcp.json" in warned, warned
    assert NOBODY not in result.stderr, "a question was asked"
    assert not offered(provider)


WRONG_ENTRIES = {
    "a string": "python3 server.py",
    "no command": {"args": ["server.py"]},
    "a number for a command": {"command": 5},
    "args a string": {"command": "python3", "args": "server.py"},
    "args a number": {"command": "python3", "args": 5},
    "env values not strings": {"command": "python3", "env": {"DEBUG": 1}},
    "env a list": {"command": "python3", "env": ["DEBUG=1"]},
}


@programs
def test_an_entry_of_the_wrong_shape_is_one_warning_and_the_others_start(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile]
) -> None:
    entries = {f"bad{n}": entry for n, entry in enumerate(WRONG_ENTRIES.values())}
    put_config(workdir, hostile(), **entries)
    result = run(chapter, provider, workdir, text(FINAL))
    assert_ok(result, FINAL + "\n")
    warned = warnings(result.stderr)
    assert len(warned) == len(entries), result.stderr
    for name, why in zip(entries, WRONG_ENTRIES, strict=True):
        assert sum(f"'{name}'" in line for line in warned) == 1, (why, warned)
    assert result.terminal.count(QUESTION) == 1, result.terminal  # no wrong entry is asked about
    assert list(offered(provider)) == ["mcp__h__echo"]


@programs
@pytest.mark.parametrize("answers", [None, "n\n"], ids=["no terminal", "no"])
def test_a_server_not_allowed_is_not_started(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile], answers: str | None
) -> None:
    server = hostile()
    put_config(workdir, server)
    result = run(chapter, provider, workdir, text(FINAL), answers=answers)
    assert_ok(result, FINAL + "\n")
    assert not server.started
    assert not offered(provider)
    if answers is None:
        assert NOBODY in result.stderr
    else:
        assert result.terminal.count(QUESTION) == 1


# ---------------------------------------------------------------- the handshake


@programs
def test_the_handshake_offers_the_newest_version_then_says_initialized_then_lists(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile]
) -> None:
    server = hostile()
    put_config(workdir, server)
    result = run(chapter, provider, workdir, text(FINAL))
    assert_ok(result, FINAL + "\n")
    initialize, initialized, listing = server.received()
    assert initialize["jsonrpc"] == "2.0" and initialize["method"] == "initialize"
    assert initialize["params"]["protocolVersion"] == NEWEST
    assert {"capabilities", "clientInfo"} <= set(initialize["params"])
    assert initialized == {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert listing["method"] == "tools/list" and not (listing.get("params") or {}).get("cursor")
    assert all(isinstance(m["id"], int) for m in (initialize, listing)) and initialize["id"] != listing["id"]
    assert connected(result.stderr, "h") == (NEWEST, 1)


@programs
def test_an_older_version_the_client_knows_is_accepted(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile]
) -> None:
    put_config(workdir, hostile(version="2024-11-05", tools=[tool("echo")]))
    result = run(chapter, provider, workdir, calls(("e", "mcp__h__echo", {})), text(FINAL))
    assert_ok(result, FINAL + "\n")
    assert connected(result.stderr, "h") == ("2024-11-05", 1)
    assert results(provider) == {"e": echo("echo")}


@programs
def test_a_version_the_client_does_not_know_is_refused_clearly_and_the_server_stopped(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile]
) -> None:
    server = hostile(version="1999-01-01")
    put_config(workdir, server)
    provider.script(text(FINAL, pause_after=1))
    with Live(chapter, TASK, provider=provider, cwd=workdir, answers="y\n") as live:
        provider.wait_paused()  # the agent goes on: its first request, without the server's tools
        (pid,) = server.pids()
        assert wait_dead(pid), "the refused server is still running"
        provider.release()
        code, out, err = live.finish(timeout=30)
    assert code == 0 and out == FINAL + "\n", (code, err)
    (refused,) = warnings(err)
    assert "'h'" in refused and "1999-01-01" in refused and NEWEST in refused, refused
    if chapter == CHAPTER:
        speaks = "2025-11-25, 2025-06-18, 2025-03-26, 2024-11-05"
        assert (
            refused
            == f"warning: MCP server 'h' failed its handshake: it speaks protocol '1999-01-01'; this client speaks {speaks}"
        )
    assert "tools/list" not in server.methods()
    assert server.written("signals") == ["SIGTERM"]
    assert not offered(provider)


@programs
def test_tools_list_is_followed_page_by_page_to_the_last(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile]
) -> None:
    server = hostile(tools=[tool(f"t{n}") for n in range(5)], page=2)
    put_config(workdir, server)
    result = run(chapter, provider, workdir, text(FINAL))
    assert_ok(result, FINAL + "\n")
    listings = [message for message in server.received() if message.get("method") == "tools/list"]
    assert [(m.get("params") or {}).get("cursor") for m in listings] == [None, "page-1", "page-2"]
    assert list(offered(provider)) == [f"mcp__h__t{n}" for n in range(5)]
    assert connected(result.stderr, "h") == (NEWEST, 5)


@programs
def test_a_slow_handshake_within_its_bound_is_waited_for(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile]
) -> None:
    put_config(workdir, hostile(handshake=1.5))
    result = run(chapter, provider, workdir, text(FINAL), MCP_TIMEOUT="1")  # MCP_TIMEOUT is for calls only
    assert_ok(result, FINAL + "\n")
    assert list(offered(provider)) == ["mcp__h__echo"]


@pytest.mark.parametrize("loaded", PROGRAMS, indirect=True)
@pytest.mark.parametrize(
    "plan", [{"handshake": "stall"}, {"endless": True}], ids=["initialize stalls", "endless pages"]
)
def test_a_handshake_that_does_not_finish_within_its_bound_is_given_up(
    loaded: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture,
    hostile: Callable[..., Hostile],
    plan: dict,
) -> None:
    """In-process, with the 30 s bound made 1 s: the only way to see it end without waiting 30 s
    (the chapter has no setting for it). connect() starts the server and shakes hands, asking nothing."""
    monkeypatch.setattr(loaded, "HANDSHAKE_TIMEOUT", 1)
    server = hostile(**plan)
    before = dict(loaded.registry.tools)
    outcome: list = []
    # agent.py's connect() lists the tools in the room it is given, for start_servers() to share out.
    args = (loaded.MAX_TOOLS,) if hasattr(loaded, "MAX_TOOLS") else (loaded.registry, 5)
    connecting = threading.Thread(
        target=lambda: outcome.append(loaded.connect("h", server.command, {}, *args)), daemon=True
    )
    started = time.monotonic()
    connecting.start()
    connecting.join(15)
    assert not connecting.is_alive(), "the handshake never ended"
    assert time.monotonic() - started < 5
    assert outcome == [None] and loaded.registry.tools == before
    (pid,) = server.pids()
    assert wait_dead(pid), "the server that failed its handshake is still running"
    err = capfd.readouterr().err
    assert "warning: MCP server 'h' failed its handshake" in err, err


# ---------------------------------------------------------------- the tools' names and schemas


@programs
def test_200_tools_and_names_of_100_characters_are_cut_and_made_unique_to_fit(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile]
) -> None:
    long_a, long_b = "a" * 56 + "x" * 44, "a" * 56 + "y" * 44  # 100 characters, the first 56 alike
    listed = [tool(long_a), tool(long_b), tool("do.this now!")] + [tool(f"tool_{n:03d}") for n in range(200)]
    put_config(workdir, hostile("h.1", tools=listed))
    result = run(chapter, provider, workdir, text(FINAL))
    assert_ok(result, FINAL + "\n")
    names = list(offered(provider))
    assert len(names) == len(set(names))
    assert all(PROVIDER_NAME.fullmatch(name) for name in names), [n for n in names if not PROVIDER_NAME.fullmatch(n)]
    assert names[0] == f"mcp__h_1__{long_a}"[:64]
    assert names[1].startswith("mcp__h_1__aaaa") and names[2] == "mcp__h_1__do_this_now_"
    if chapter == CHAPTER:
        assert len(names) == 203 and not warnings(result.stderr), result.stderr
    else:  # agent.py: what does not fit in a request (128 tools, OpenAI's limit) is dropped, with a warning
        assert too_many(result.stderr, "h.1", 203) == len(names) < 203, result.stderr
        assert len(provider.chat_requests[0]["tools"]) <= MAX_TOOLS
    assert names[3:] == [f"mcp__h_1__tool_{n:03d}" for n in range(len(names) - 3)]  # the first ones, in order
    assert connected(result.stderr, "h.1") == (NEWEST, len(names))

    # Each name calls its own tool, by the name the server gave it, in a second run.
    provider.requests.clear()
    picked = calls(*((f"c{n}", name, {}) for n, name in enumerate(names[:3])))
    again = run(chapter, provider, workdir, picked, text(FINAL))
    assert_ok(again, FINAL + "\n")
    assert results(provider) == {"c0": echo(long_a), "c1": echo(long_b), "c2": echo("do.this now!")}
    assert again.terminal.count(QUESTION) == (1 if chapter == CHAPTER else 0)  # agent.py remembers the first yes


@programs
def test_names_stay_unique_when_the_numbers_that_would_tell_them_apart_are_taken(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile]
) -> None:
    """A server whose names look like the cut and numbered forms of its longest one (mcp__h__zzz..._2
    to _999, all 64 characters), listed first, then the same long name three times, and a short one
    twice: every name still unique, no hang. agent.py offers only the tools that fit in a request
    (MAX_TOOLS), the first ones: for it, the forms from _100 on come after the long names."""
    cut = "z" * 56  # what is left of "z" * 100 after "mcp__h__", at 64 characters
    below_100 = [tool(cut[: 56 - len(f"_{n}")] + f"_{n}") for n in range(2, 100)]
    from_100 = [tool(cut[:52] + f"_{n:03d}") for n in range(1000)]  # _100 to _999, and _000 to _099 alike
    clashing = [tool("z" * 100), tool("z" * 100), tool("z" * 100), tool("dup"), tool("dup")]
    if chapter == CHAPTER:
        listed = [*below_100, *from_100, *clashing]
    else:  # agent.py: only the first tools fit in a request, so the ones that clash come before the most
        listed = [*below_100, *clashing, *from_100]
    put_config(workdir, hostile(tools=listed))
    provider.script(text(FINAL))
    result = run_agent(chapter, TASK, provider=provider, cwd=workdir, answers="y\n", timeout=30)
    assert_ok(result, FINAL + "\n")
    names = list(offered(provider))
    assert len(names) == len(set(names))
    at = listed.index(clashing[0])
    assert names[at] == "mcp__h__" + cut and names[at + 3] == "mcp__h__dup"  # the first of each keeps its name
    if chapter == CHAPTER:
        assert len(names) == len(listed)
    else:
        assert too_many(result.stderr, "h", len(listed)) == len(names) >= at + len(clashing), result.stderr
        assert len(provider.chat_requests[0]["tools"]) <= MAX_TOOLS
    assert all(PROVIDER_NAME.fullmatch(name) for name in names)


@programs
def test_a_schema_that_is_not_a_json_object_is_replaced_by_an_empty_one_with_a_warning(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile]
) -> None:
    schema = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    listed = [
        tool("a_list", inputSchema=["path"]),
        tool("a_string", inputSchema="object"),
        tool("null", inputSchema=None),
        tool("fine", inputSchema=schema),
    ]
    put_config(workdir, hostile(tools=listed))
    result = run(chapter, provider, workdir, calls(("l", "mcp__h__a_list", {})), text(FINAL))
    assert_ok(result, FINAL + "\n")
    warned = warnings(result.stderr)
    assert len(warned) == 3, result.stderr
    assert all(f"mcp__h__{name}" in line for name, line in zip(("a_list", "a_string", "null"), warned, strict=True))
    parameters = {name: function["parameters"] for name, function in offered(provider).items()}
    assert parameters == {
        "mcp__h__a_list": EMPTY_SCHEMA,
        "mcp__h__a_string": EMPTY_SCHEMA,
        "mcp__h__null": EMPTY_SCHEMA,
        "mcp__h__fine": schema,
    }
    assert results(provider) == {"l": echo("a_list")}  # still a tool that works


# ---------------------------------------------------------------- questions


@programs
@pytest.mark.parametrize("answer", ["y", "n"])
def test_a_call_of_a_tool_not_marked_read_only_asks_showing_its_arguments(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile], answer: str
) -> None:
    server = hostile(tools=[tool("write_note", read_only=False)])
    put_config(workdir, server)
    arguments = {"path": "notes/today.md", "text": "ship it"}
    write = calls(("w", "mcp__h__write_note", arguments))
    result = run(chapter, provider, workdir, write, text(FINAL), answers=f"y\n{answer}\n")
    assert_ok(result, FINAL + "\n")
    assert result.terminal.count(QUESTION) == 2, result.terminal
    question = result.terminal.split(f"{QUESTION} y\n", 1)[1]
    assert f"write_note({json.dumps(arguments)})\n{QUESTION} {answer}\n" in question, question
    assert "'h'" in question
    if answer == "y":
        assert results(provider) == {"w": echo("write_note", arguments)}
    else:
        assert results(provider) == {"w": REFUSED}
        assert "tools/call" not in server.methods()


@programs
def test_only_a_tool_marked_read_only_runs_without_a_question(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile]
) -> None:
    listed = [
        tool("reader"),
        tool("writer", read_only=False),
        tool("plain", annotations=None),
        tool("unsaid", annotations={"title": "no hint"}),
        tool("stringly", annotations={"readOnlyHint": "true"}),
    ]
    server = hostile(tools=listed)
    put_config(workdir, server)
    batch = calls(*((name["name"], f"mcp__h__{name['name']}", {}) for name in listed))
    result = run(chapter, provider, workdir, batch, text(FINAL))  # the start is allowed, then Ctrl-D
    assert_ok(result, FINAL + "\n")
    assert result.terminal.count(QUESTION) == 1 + 4, result.terminal
    refused = {name: REFUSED for name in ("writer", "plain", "unsaid", "stringly")}
    assert results(provider) == {"reader": echo("reader"), **refused}
    assert [m["params"]["name"] for m in server.received() if m.get("method") == "tools/call"] == ["reader"]


# ---------------------------------------------------------------- a call's bounds


@programs
def test_a_call_that_stalls_is_given_up_after_mcp_timeout_with_an_error_result(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile]
) -> None:
    server = hostile(tools=[tool("wait")], calls={"wait": "stall"})
    put_config(workdir, server)
    arrivals = record_arrivals(provider)
    result = run(chapter, provider, workdir, calls(("s", "mcp__h__wait", {})), text(FINAL), MCP_TIMEOUT="1")
    assert_ok(result, FINAL + "\n")
    answer = results(provider)["s"]
    assert answer.startswith("error:") and "time" in answer, answer
    if chapter == CHAPTER:
        assert answer == "error: MCP server h: the server did not answer in time"
    (asked, _), (answered, _) = arrivals
    assert 1 <= answered - asked < 4, answered - asked
    (pid,) = server.pids()
    assert wait_dead(pid), "the stalled server outlived the agent"


@programs
def test_a_late_answer_is_waited_for_within_mcp_timeout(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile]
) -> None:
    put_config(workdir, hostile(tools=[tool("late")], calls={"late": "late"}))  # 2 s; MCP_TIMEOUT is 60
    assert_ok(run(chapter, provider, workdir, calls(("l", "mcp__h__late", {})), text(FINAL)), FINAL + "\n")
    assert results(provider) == {"l": echo("late")}


@programs
def test_an_answer_after_mcp_timeout_is_not_taken_for_the_next_call_s(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile]
) -> None:
    put_config(workdir, hostile(tools=[tool("late"), tool("echo")], calls={"late": "late"}))
    rounds = calls(("l", "mcp__h__late", {})), calls(("e", "mcp__h__echo", {"n": 2})), text(FINAL)
    assert_ok(run(chapter, provider, workdir, *rounds, MCP_TIMEOUT="1"), FINAL + "\n")
    got = results(provider)
    assert got["l"].startswith("error:") and "time" in got["l"], got
    assert got["e"] == echo("echo", {"n": 2})


@programs
def test_a_server_that_stops_reading_cannot_hold_a_call_past_mcp_timeout(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile]
) -> None:
    """After a call that stalls, the server reads nothing: a request bigger than a pipe holds
    cannot be written whole, and must not block the agent either."""
    put_config(workdir, hostile(tools=[tool("wait"), tool("echo")], calls={"wait": "stall"}))
    big = {"text": "x" * 300_000}
    rounds = calls(("s", "mcp__h__wait", {})), calls(("e", "mcp__h__echo", big)), text(FINAL)
    provider.script(*rounds)
    result = run_agent(chapter, TASK, provider=provider, cwd=workdir, answers="y\n", timeout=30, MCP_TIMEOUT="1")
    assert_ok(result, FINAL + "\n")
    got = results(provider)
    assert got["s"].startswith("error:") and got["e"].startswith("error:"), got
    said = "the server did not read" if chapter == CHAPTER else "it did not read"  # agent.py's wording
    assert got["e"] == f"error: MCP server h: {said} what it was sent in time; it was stopped", got


@programs
def test_a_huge_result_is_capped_like_bash_s_output(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile]
) -> None:
    """The cap is in bytes, as bash's is, and cut at a character's edge: 8,192 characters of
    Chinese would be 24 KiB. Two tools, one round: ASCII, then 3 bytes a character."""
    put_config(workdir, hostile(tools=[tool("dump"), tool("wide")], calls={"dump": "huge", "wide": "hugewide"}))
    result = run(chapter, provider, workdir, calls(("d", "mcp__h__dump", {}), ("w", "mcp__h__wide", {})), text(FINAL))
    assert_ok(result, FINAL + "\n")
    answers = results(provider)
    marker = "\n[... cut: the result is longer than 8,192 bytes ...]"
    assert answers["d"] == HUGE[:CAP] + marker
    kept = answers["w"].removesuffix(marker)
    assert HUGE_WIDE.startswith(kept) and CAP - 3 < len(kept.encode()) <= CAP, (len(kept.encode()), kept[-20:])
    stored = disk_messages(session_file(workdir, result.stderr))
    assert [m["content"] for m in stored if m["role"] == "tool"] == [answers["d"], answers["w"]]


@programs
def test_a_line_of_more_than_16_mib_is_an_error_result_and_the_server_is_stopped(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile]
) -> None:
    server = hostile(tools=[tool("spill"), tool("echo")], calls={"spill": "hugeline"})
    put_config(workdir, server)
    rounds = calls(("s", "mcp__h__spill", {})), calls(("e", "mcp__h__echo", {})), text(FINAL, pause_after=1)
    provider.script(*rounds)
    with Live(chapter, TASK, provider=provider, cwd=workdir, answers="y\n") as live:
        provider.wait_requests(3)
        provider.wait_paused()  # the run goes on, without the server
        (pid,) = server.pids()
        assert wait_dead(pid), "the server that sent the line is still running"
        provider.release()
        code, out, err = live.finish(timeout=30)
    assert code == 0 and out == FINAL + "\n" and "Traceback" not in err, (code, err)
    got = results(provider)
    assert got["s"].startswith("error:") and got["e"].startswith("error:"), got  # declared dead
    said = "the server sent" if chapter == CHAPTER else "it sent"  # agent.py's wording
    assert got["s"] == f"error: MCP server h: {said} a line of more than 16,777,216 bytes; it was stopped", got
    assert server.written("signals") == ["SIGTERM"]


@programs
def test_an_is_error_result_is_an_error_and_content_of_the_wrong_shape_no_traceback(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile]
) -> None:
    put_config(workdir, hostile(tools=[tool("fails"), tool("odd")], calls={"fails": "is_error", "odd": "bad_content"}))
    both = calls(("f", "mcp__h__fails", {}), ("o", "mcp__h__odd", {}))
    result = run(chapter, provider, workdir, both, text(FINAL))
    assert_ok(result, FINAL + "\n")
    got = results(provider)
    assert got["f"] == "error: it failed"
    assert got["o"] == "(no content)" or got["o"].startswith("error:"), got
    if chapter == CHAPTER:
        assert got["o"] == "(no content)"


# ---------------------------------------------------------------- what a hostile server sends


@programs
def test_the_server_s_requests_are_answered_and_its_notifications_ignored(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile]
) -> None:
    put_config(workdir, hostile(tools=[tool("asks")], calls={"asks": "ask"}))
    result = run(chapter, provider, workdir, calls(("a", "mcp__h__asks", {})), text(FINAL), MCP_TIMEOUT="10")
    assert_ok(result, FINAL + "\n")
    pong, refusal = json.loads(results(provider)["a"])  # what the server got back, in order
    assert pong == {"jsonrpc": "2.0", "id": "ping-1", "result": {}}
    assert refusal["jsonrpc"] == "2.0" and refusal["id"] == 7 and "result" not in refusal
    assert refusal["error"]["code"] == -32601, refusal
    assert not warnings(result.stderr)


@programs
def test_lines_that_are_no_json_object_are_skipped_with_a_warning_each(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile]
) -> None:
    """Each line, in the chapter; agent.py says it once per server."""
    put_config(workdir, hostile(tools=[tool("noisy")], calls={"noisy": "garbage"}))
    result = run(chapter, provider, workdir, calls(("g", "mcp__h__noisy", {})), text(FINAL))
    assert_ok(result, FINAL + "\n")
    assert results(provider) == {"g": echo("noisy")}  # not the answer to a request never made
    skipped = warnings(result.stderr)
    assert all(" h " in line for line in skipped), skipped
    if chapter == CHAPTER:
        assert len(skipped) == len(GARBAGE), result.stderr
    else:
        assert skipped == ["warning: MCP server h sent a line that is no JSON object; such lines are skipped"]


@programs
def test_a_flood_of_lines_that_are_no_json_is_no_traceback(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile]
) -> None:
    put_config(workdir, hostile(tools=[tool("flood")], calls={"flood": "flood"}))
    result = run(chapter, provider, workdir, calls(("f", "mcp__h__flood", {})), text(FINAL))
    assert_ok(result, FINAL + "\n")
    assert results(provider) == {"f": echo("flood")}
    assert len(warnings(result.stderr)) == (FLOOD if chapter == CHAPTER else 1)  # agent.py: once per server


@programs
def test_an_answer_whose_id_is_a_string_is_an_error_result_and_the_connection_goes_on(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile]
) -> None:
    put_config(workdir, hostile(tools=[tool("odd"), tool("echo")], calls={"odd": "string_id"}))
    rounds = calls(("o", "mcp__h__odd", {})), calls(("e", "mcp__h__echo", {})), text(FINAL)
    assert_ok(run(chapter, provider, workdir, *rounds, MCP_TIMEOUT="5"), FINAL + "\n")  # not a timeout
    got = results(provider)
    assert got["o"].startswith("error:") and "string" in got["o"], got
    assert got["e"] == echo("echo")


@programs
def test_a_server_that_crashes_mid_call_gives_error_results_and_no_traceback(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile]
) -> None:
    put_config(workdir, hostile(tools=[tool("boom"), tool("echo")], calls={"boom": "crash"}))
    rounds = calls(("b", "mcp__h__boom", {})), calls(("e", "mcp__h__echo", {})), text(FINAL)
    result = run(chapter, provider, workdir, *rounds)
    assert_ok(result, FINAL + "\n")
    got = results(provider)
    assert got["b"].startswith("error:") and got["e"].startswith("error:"), got
    if chapter == CHAPTER:
        assert got["b"] == "error: MCP server h: the server has ended"
    assert "Exception ignored" not in result.stderr, result.stderr


# ---------------------------------------------------------------- the server's process


@programs
def test_a_server_gets_a_minimal_environment_and_its_env_never_the_key(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile]
) -> None:
    server = hostile(stderr="hello from the server's log")
    env = {"GREETING": "hello", "LEAKED": f"Bearer {TEST_KEY}"}
    put_config(workdir, h=server.entry | {"env": env})
    result = run(chapter, provider, workdir, text(FINAL), AGENT_SECRET="the agent's only")
    assert_ok(result, FINAL + "\n")
    environ = server.environ()
    assert environ["GREETING"] == "hello" and environ["PATH"] == os.environ["PATH"]
    assert not any(TEST_KEY in value for value in environ.values()), environ
    assert not {"OPENAI_API_KEY", "OPENAI_BASE_URL", "MODEL", "AGENT_SECRET", "LEAKED"} & set(environ), environ
    assert set(environ) - {"GREETING"} <= PASSED_ON, environ
    # Its log on our stderr, saying whose; and a session of its own.
    assert "[mcp h] hello from the server's log\n" in result.stderr, result.stderr
    (pid,) = server.pids()
    assert server.written("session") == [f"{pid} {pid}"]


WAYS_OUT = {
    "end": 0,
    "error": 1,
    "ctrl-c": 130,  # typed at the terminal: the terminal's process group gets it, not the servers
    "SIGTERM": 130,
    "SIGHUP": 130,
}


@programs
@pytest.mark.parametrize("way", WAYS_OUT)
def test_every_server_and_what_it_started_is_stopped_on_every_way_out(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile], way: str
) -> None:
    quiet = hostile("a", child=True)
    busy = hostile("b", child=True, tools=[tool("wait")], calls={"wait": "stall"})
    put_config(workdir, quiet, busy)
    replies = {"end": [text(FINAL)], "error": [error(500)]}
    provider.script(*replies.get(way, [calls(("w", "mcp__b__wait", {}))]))
    with Live(chapter, TASK, provider=provider, cwd=workdir, answers="y\ny\n") as live:
        pids = quiet.pids() + busy.pids()
        if way not in replies:  # stopped while the agent waits for a call
            wait_until(lambda: "tools/call" in busy.methods(), "the call reached the server")
            if way == "ctrl-c":
                live.terminal.type("\x03")
            else:
                live.signal(getattr(signal, way))
        code, _out, err = live.finish(timeout=30)
    assert code == WAYS_OUT[way] and "Traceback" not in err, (code, err)
    assert all(wait_dead(pid) for pid in pids), "a server or its child outlived the agent"
    assert quiet.written("signals") == busy.written("signals") == ["SIGTERM"]  # the agent's stop, nothing else


@programs
def test_a_server_that_ignores_sigterm_is_killed(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile]
) -> None:
    server = hostile(ignore_term=True)
    put_config(workdir, server)
    assert_ok(run(chapter, provider, workdir, text(FINAL)), FINAL + "\n")
    (pid,) = server.pids()
    assert wait_dead(pid, timeout=1), "the server that ignored SIGTERM outlived the agent"
    assert server.written("signals") == ["SIGTERM"]


@programs
@pytest.mark.parametrize("during", ["handshake", "question"])
def test_a_stop_while_the_servers_start_stops_those_started(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile], during: str
) -> None:
    """SIGTERM while the second server shakes hands (it never answers), or while its question waits."""
    first, second = hostile("a"), hostile("b", handshake="stall")
    put_config(workdir, first, second)
    answers = "y\ny\n" if during == "handshake" else "y\n"  # the second question waits, unanswered
    with Live(chapter, TASK, provider=provider, cwd=workdir, answers=answers, hang_up=False) as live:
        pids = first.pids()
        if during == "handshake":
            pids += second.pids()
        else:
            live.terminal.wait_for(QUESTION, count=2)
        live.signal(signal.SIGTERM)
        code, _out, err = live.finish(timeout=30)
    assert code == 130 and "Traceback" not in err, (code, err)
    assert all(wait_dead(pid) for pid in pids), "a server started before the stop outlived the agent"
    assert not provider.requests


BAD_TIMEOUTS = [  # agent.py takes 1.5, as it takes STREAM_TIMEOUT (the next test)
    (chapter, value) for chapter in PROGRAMS for value in ("0", "1.5", "soon") if (chapter, value) != ("final", "1.5")
]


@pytest.mark.parametrize(("chapter", "value"), BAD_TIMEOUTS)
def test_an_mcp_timeout_that_is_no_whole_number_of_seconds_is_one_error_line(
    provider: FakeProvider, workdir: Path, chapter: int | str, value: str
) -> None:
    result = run_agent(chapter, TASK, provider=provider, cwd=workdir, MCP_TIMEOUT=value)
    assert_one_error_line(result, "MCP_TIMEOUT")
    if chapter != CHAPTER:  # agent.py's wording
        assert result.stderr == f"error: MCP_TIMEOUT must be a number of seconds from 1 to 1000000, not {value!r}\n"
    assert not provider.requests


@pytest.mark.parametrize("chapter", [program for program in PROGRAMS if program == "final"])
def test_agent_py_gives_a_call_up_after_an_mcp_timeout_of_1_5_seconds(
    provider: FakeProvider, workdir: Path, chapter: int | str, hostile: Callable[..., Hostile]
) -> None:
    """agent.py's MCP_TIMEOUT is a number of seconds, a fraction too: 1.5 s, not 1 and not 60."""
    put_config(workdir, hostile(tools=[tool("wait")], calls={"wait": "stall"}))
    arrivals = record_arrivals(provider)
    result = run(chapter, provider, workdir, calls(("s", "mcp__h__wait", {})), text(FINAL), MCP_TIMEOUT="1.5")
    assert_ok(result, FINAL + "\n")
    assert results(provider) == {"s": "error: MCP server h: the server did not answer in time"}
    (asked, _), (answered, _) = arrivals
    assert 1.5 <= answered - asked < 4, answered - asked
