"""MCP servers and the sandbox in production (agent.py): what it promises beyond chapters 22 and 23.

The chapters' behaviour (the handshake, paging, calls and their questions, the
cage's attacks) is tested in test_ex22.py and test_ex23.py. Here is what agent.py
promises beyond them, and what an attacker would try:

MCP
- a yes to start a server is remembered in $XDG_CONFIG_HOME/agent-py/mcp-allowed
  (~/.config/agent-py/mcp-allowed; a relative XDG_CONFIG_HOME is ignored), a line
  each, the file 0600 in a 0700 directory: the next run starts it without a
  question, with no terminal, and says it was allowed in an earlier run; a changed
  command, args or env, the same entry in another project, or its line deleted asks
  again; a "n" is not remembered; an approvals file that is a directory, garbage or
  a FIFO makes every server ask, with no traceback and no hang;
- the question shows the command line as it will run, env values first (env K=V
  cmd args), control characters escaped; under -sandbox it says "(outside the sandbox)";
- the model cannot change what starts without a question: write_file and edit_file
  of .mcp.json ask, writing the approvals file asks in its own words (through a link
  too), bash `echo ... > .mcp.json` asks; nor by rewriting the program an approved
  entry runs (a file in the project);
- a hostile server: its stderr is relayed as `[mcp NAME] line`, escaped and cut at
  500 characters, its last line too; megabytes without a newline, or a flood while a
  question is up, keep memory bounded; more tools than fit are cut to fit 128 in a
  request, the servers sharing the room fairly (a server of few tools, after one of 200
  or one that pages forever, has all of them offered), with a warning naming each server
  that lost tools and how many; a description over 2,048 characters is cut; a schema that
  is no object, of a type other than "object" or over 32 KiB is replaced by an empty
  one with a warning; names are made unique with _2, _3 and are at most 64
  characters; endless tools/list pages are stopped by Ctrl-C (the 30 s bound has no
  setting: see the note at that test) and do not fill memory; a call that times out
  is an error result and the server gets notifications/cancelled for it; a result
  only in structuredContent is its JSON; isError is "error: ..."; a string id is an
  error result at once; a line over 16 MiB stops the server and later calls fail;
- MCP_TIMEOUT that is no number of seconds is one error line, exit 1, no request,
  no server;
- servers and what they started are stopped on every way out: a Ctrl-C at a
  server's start question, a Failure from the provider; a run that fails before
  the servers (-c with an unknown ID) asks nothing and starts none;
- subagents are offered the servers' tools, and a child's call of a tool not
  marked read-only asks, saying which child asks.

The sandbox (skipped, saying why, where -sandbox cannot start)
- the file tools keep to the cage: a write outside the working directory and the
  private temporary directory, a read of the home directory, a write into .git/,
  .mcp.json, AGENTS.md, .agents/skills/, .env are refused without a question;
  the same calls without -sandbox ask (and a "n" refuses them in other words);
- in the cage .env and .env.local read as empty and cannot be written (Read-only
  file system), a .env that is a link too (its target as well); no key from them
  reaches the provider; a control path that is a link, or one a command unlocks
  with mount_setattr(2), stays read-only;
- commands' HOME and TMPDIR are the private temporary directory; it and the
  stand-ins are gone at exit, a control file that existed is untouched; a stand-in
  deleted from outside while a question waits is still read-only for the command;
- a subagent's commands are caged too;
- the session header records "sandbox": true, a resume without -sandbox warns;
  -sandbox refuses to start in the home directory or above it (one line, exit 1,
  no request, no server); --sandbox works as -sandbox anywhere among the arguments,
  and -h lists it.

agent.py runs as a subprocess over HTTP against the fake provider; the MCP servers
are tests/mcp_server_for_production.py, real processes, which write down their pids
and what they receive; a test checks what the user sees (stderr, the terminal),
what reached the provider and the servers, and what is on disk. A test that shows a
bug agent.py has fails with pytest.fail saying so.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import run_agent, wait_for_file
from fake_provider import FakeProvider, Reply, error, text
from helpers import (
    Live,
    assert_no_control,
    assert_ok,
    assert_one_error_line,
    bash_calls,
    calls,
    kill_quietly,
    new_session_id,
    put_skill,
    requests_of,
    results,
    session_file,
    tool_names,
    wait_dead,
    wait_until,
    warnings,
)

SERVER = Path(__file__).with_name("mcp_server_for_production.py")
TASK = "Use the tools you have."
FINAL = "Done."
QUESTION = "allow? (y/N)"
NOBODY = "(no answer from a terminal: refused)"
NOT_APPROVED = "error: permission denied — the user did not approve this"
CALL_REFUSED = "error: permission denied — the user did not approve this call"
CAGED_CONTROL = "error: -sandbox: the agent's own files (.git/, .mcp.json, AGENTS.md, skills, .env ...) are read-only"
READ_ONLY_FS = "Read-only file system"
PYTHON = "/usr/bin/python3"  # a Python a caged command can run: the test's own lives where the cage cannot read
EMPTY_SCHEMA = {"type": "object", "properties": {}}
SANDBOX_ON = re.compile(
    r"^\[sandbox on: commands write only in (\S+) \(not the agent's own files\) and (\S+), their HOME", re.M
)


# ---------------------------------------------------------------- a layout: home, project and temporary directory


def home_of(workdir: Path) -> Path:
    """The HOME every run of a test has: a sibling of the working directory."""
    return workdir.parent / "home"


def approvals(workdir: Path, config_home: Path | None = None) -> Path:
    """Where a yes to start a server is remembered, for the HOME the runs have."""
    return (config_home or home_of(workdir) / ".config") / "agent-py" / "mcp-allowed"


def agent(
    provider: FakeProvider,
    workdir: Path,
    *args: str,
    replies: tuple[Reply, ...] = (),
    answers: str | None = None,
    timeout: float = 60,
    conversation: bool = False,
    **env: str | None,
) -> subprocess.CompletedProcess:
    """agent.py with args (TASK if none), the model's replies scripted; at a terminal that
    answers its questions with the lines of `answers`, or with no terminal at all (None).
    A conversation has no args: TASK is its one line, on its stdin."""
    provider.script(*replies)
    for directory in (home_of(workdir), workdir.parent / "tmp"):
        directory.mkdir(exist_ok=True)
    env = {"HOME": str(home_of(workdir)), "TMPDIR": str(workdir.parent / "tmp"), **env}
    args, stdin = ((), TASK + "\n") if conversation else (args or (TASK,), None)
    return run_agent(
        "final", *args, provider=provider, cwd=workdir, stdin=stdin, answers=answers, timeout=timeout, **env
    )


def live(provider: FakeProvider, workdir: Path, *args: str, answers: str = "", **env: str) -> Live:
    """agent.py running at a terminal whose questions, once `answers` run out, wait."""
    for directory in (home_of(workdir), workdir.parent / "tmp"):
        directory.mkdir(exist_ok=True)
    env = {"HOME": str(home_of(workdir)), "TMPDIR": str(workdir.parent / "tmp"), **env}
    return Live("final", *(args or (TASK,)), provider=provider, cwd=workdir, answers=answers, hang_up=False, **env)


def memory(pid: int, field: str = "VmRSS") -> int:
    """A process's resident memory (or its peak, VmHWM) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for {pid}")


# ---------------------------------------------------------------- servers, and what they wrote down


class Server:
    """One test server: its .mcp.json entry, and what it wrote down (see mcp_server_for_production.py)."""

    def __init__(self, root: Path, name: str, plan: dict, script: Path = SERVER) -> None:
        self.name, self.dir = name, root / "servers" / re.sub(r"\W", "_", name)
        self.dir.mkdir(parents=True)
        self.plan = {"pid": str(self.dir / "pid"), "log": str(self.dir / "log"), **plan}
        (self.dir / "plan.json").write_text(json.dumps(self.plan))
        self.entry: dict = {"command": sys.executable, "args": [str(script), str(self.dir / "plan.json")]}

    @property
    def started(self) -> bool:
        return (self.dir / "pid").exists()

    def pids(self) -> list[int]:
        """Its pid, and its child's if it has one; waits until it has started."""
        return [int(pid) for pid in wait_for_file(self.dir / "pid").split()]

    def forget_start(self) -> None:
        """Remove the pid file of an earlier run: whether a later run starts it shows."""
        (self.dir / "pid").unlink()

    def received(self) -> list[dict]:
        path = self.dir / "log"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def methods(self) -> list[str | None]:
        return [message.get("method") for message in self.received()]


@pytest.fixture
def server(workdir: Path):
    """server(name="h", **plan) makes a Server; whatever it started ends with the test."""
    made: list[Server] = []

    def make(name: str = "h", **plan: object) -> Server:
        made.append(Server(workdir.parent, name, plan))
        return made[-1]

    yield make
    for each in made:
        if each.started:
            for pid in (each.dir / "pid").read_text().split():
                kill_quietly(int(pid))


def put_config(workdir: Path, *servers: Server, **entries: object) -> None:
    listed = {each.name: each.entry for each in servers} | entries
    (workdir / ".mcp.json").write_text(json.dumps({"mcpServers": listed}))


def tool(name: str, read_only: bool = True, **extra: object) -> dict:
    listed = {"name": name, "description": f"The {name} tool.", "inputSchema": EMPTY_SCHEMA}
    return listed | {"annotations": {"readOnlyHint": read_only}} | extra


def mcp_tools(request: dict) -> dict[str, dict]:
    functions = [entry["function"] for entry in request.get("tools", [])]
    return {function["name"]: function for function in functions if function["name"].startswith("mcp__")}


def offered(provider: FakeProvider) -> dict[str, dict]:
    return mcp_tools(provider.chat_requests[0])


def question(terminal: str, needle: str) -> str:
    """The one question on the terminal that holds needle, as a line."""
    found = [line for line in terminal.splitlines() if line.startswith("⚠  ") and needle in line]
    assert len(found) == 1, terminal
    return found[0]


def approval_lines(workdir: Path) -> list[str]:
    path = approvals(workdir)
    return path.read_text().splitlines() if path.exists() else []


def allow_once(provider: FakeProvider, workdir: Path, *servers: Server, **env: str) -> None:
    """A first run whose person says yes to every server; they are remembered from then on."""
    result = agent(provider, workdir, replies=(text(FINAL),), answers="y\n" * len(servers), **env)
    assert_ok(result, FINAL + "\n")
    assert all(each.started for each in servers), result.stderr
    for each in servers:
        each.forget_start()
    provider.requests.clear()


# ---------------------------------------------------------------- a yes is remembered


def test_a_yes_is_remembered_in_a_private_file_and_the_next_run_starts_without_a_question(
    provider: FakeProvider, workdir: Path, server: Callable[..., Server]
) -> None:
    h = server()
    put_config(workdir, h)
    first = agent(provider, workdir, replies=(text(FINAL),), answers="y\n", umask=0)  # modes from the program
    assert_ok(first, FINAL + "\n")
    assert first.terminal.count(QUESTION) == 1
    path = approvals(workdir)
    assert f"[MCP server 'h' allowed from now on; to be asked again, delete its line in {path}]" in first.stderr
    assert oct(path.stat().st_mode & 0o777) == "0o600" and oct(path.parent.stat().st_mode & 0o777) == "0o700"
    (line,) = approval_lines(workdir)
    assert re.fullmatch(r"[0-9a-f]{64}\t" + re.escape(str(workdir)) + r"\th", line), line

    h.forget_start()
    provider.requests.clear()
    second = agent(provider, workdir, replies=(text(FINAL),))  # no terminal: nobody could say yes
    assert_ok(second, FINAL + "\n")
    assert h.started and NOBODY not in second.stderr
    assert f"[MCP server 'h': allowed in an earlier run ({path}); starting {sys.executable} " in second.stderr
    assert list(offered(provider)) == ["mcp__h__echo"]
    assert approval_lines(workdir) == [line]  # remembered once


CHANGES: dict[str, Callable[[Path, Server], None]] = {
    "command": lambda workdir, h: h.entry.update(command=str(make_link(workdir.parent / "python", sys.executable))),
    "args": lambda workdir, h: h.entry.update(args=[*h.entry["args"], "--verbose"]),
    "env": lambda workdir, h: h.entry.update(env={"NODE_OPTIONS": "--require=./x.js"}),
    "another project": lambda workdir, h: None,  # the same .mcp.json, copied to a sibling directory
    "line deleted": lambda workdir, h: approvals(workdir).write_text(""),
}


def make_link(link: Path, target: str) -> Path:
    link.symlink_to(target)
    return link


@pytest.mark.parametrize("change", CHANGES)
def test_a_changed_entry_another_project_or_a_deleted_line_asks_again(
    provider: FakeProvider, workdir: Path, server: Callable[..., Server], change: str
) -> None:
    h = server()
    put_config(workdir, h)
    allow_once(provider, workdir, h)
    CHANGES[change](workdir, h)
    where = workdir
    if change == "another project":
        where = workdir.parent / "other"
        where.mkdir()
    put_config(where, h)
    result = agent(provider, where, replies=(text(FINAL),))
    assert_ok(result, FINAL + "\n")
    assert NOBODY in result.stderr and "allowed in an earlier run" not in result.stderr
    assert not h.started and offered(provider) == {}

    # At a terminal it asks, and a yes starts it (and is remembered as a line of its own).
    provider.requests.clear()
    asked = agent(provider, where, replies=(text(FINAL),), answers="y\n")
    assert_ok(asked, FINAL + "\n")
    assert asked.terminal.count(QUESTION) == 1 and h.started


def test_a_no_is_not_remembered(provider: FakeProvider, workdir: Path, server: Callable[..., Server]) -> None:
    h = server()
    put_config(workdir, h)
    first = agent(provider, workdir, replies=(text(FINAL),), answers="n\n")
    assert_ok(first, FINAL + "\n")
    assert first.terminal.count(QUESTION) == 1 and not h.started
    assert approval_lines(workdir) == []
    second = agent(provider, workdir, replies=(text(FINAL),), answers="y\n")  # asked again: a no holds nothing
    assert_ok(second, FINAL + "\n")
    assert second.terminal.count(QUESTION) == 1 and h.started


@pytest.mark.parametrize("config_home", ["absolute", "relative"])
def test_xdg_config_home_holds_the_approvals_unless_it_is_relative(
    provider: FakeProvider, workdir: Path, server: Callable[..., Server], config_home: str
) -> None:
    h = server()
    put_config(workdir, h)
    absolute = workdir.parent / "xdg"
    setting = str(absolute) if config_home == "absolute" else "xdg"
    allow_once(provider, workdir, h, XDG_CONFIG_HOME=setting)
    expected = approvals(workdir, absolute if config_home == "absolute" else None)
    other = approvals(workdir) if config_home == "absolute" else workdir / "xdg" / "agent-py" / "mcp-allowed"
    assert expected.is_file() and len(expected.read_text().splitlines()) == 1
    assert not other.exists() and not (workdir / "xdg").exists()
    result = agent(provider, workdir, replies=(text(FINAL),), XDG_CONFIG_HOME=setting)
    assert_ok(result, FINAL + "\n")
    assert h.started and f"allowed in an earlier run ({expected})" in result.stderr


GARBAGE = (
    b"\xff\xfe\x00 not UTF-8\n"
    + b"0" * 63 + b"\n"  # a key one character short
    + b" " + b"a" * 64 + b"\n"  # a key after a space
    + b"g" * 64 + b"\n"  # 64 characters, not hex
    + b"x" * 100_000 + b"\n"
)  # fmt: skip


@pytest.mark.parametrize("kind", ["directory", "garbage", "fifo"])
def test_an_approvals_file_that_is_unreadable_or_garbage_makes_every_server_ask(
    provider: FakeProvider, workdir: Path, server: Callable[..., Server], kind: str
) -> None:
    h = server()
    put_config(workdir, h)
    path = approvals(workdir)
    path.parent.mkdir(parents=True)
    if kind == "directory":
        path.mkdir()
    elif kind == "garbage":
        path.write_bytes(GARBAGE)
    else:
        os.mkfifo(path)
    refused = agent(provider, workdir, replies=(text(FINAL),))
    assert_ok(refused, FINAL + "\n")
    assert NOBODY in refused.stderr and not h.started

    try:
        asked = agent(provider, workdir, replies=(text(FINAL),), answers="y\n", timeout=10)
    except subprocess.TimeoutExpired:
        pytest.fail(
            "bug: with a FIFO in place of the approvals file, a yes hangs the agent for good: "
            "ask_to_start() opens it with os.open(O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW), "
            "without O_NONBLOCK, and the open waits for a reader that never comes"
        )
    assert_ok(asked, FINAL + "\n")
    assert asked.terminal.count(QUESTION) == 1 and h.started
    if kind == "directory":
        assert f"warning: cannot remember the yes in {path}" in asked.stderr
    if kind == "garbage":
        assert path.read_bytes().startswith(GARBAGE)  # appended to, never rewritten


# ---------------------------------------------------------------- the question


def test_the_question_shows_the_command_line_as_it_will_run_escaped(
    provider: FakeProvider, workdir: Path, server: Callable[..., Server]
) -> None:
    h = server()
    h.entry["args"].append("--title=\x1b]0;innocent\x07\u202eevil")
    h.entry["env"] = {"NODE_OPTIONS": "--require=/tmp/preload.js", "COLOR": "\x1b[8mhidden"}
    put_config(workdir, h)
    result = agent(provider, workdir, replies=(text(FINAL),), answers="n\n")
    assert_ok(result, FINAL + "\n")
    shown = result.terminal
    assert "to start the MCP server 'h': env NODE_OPTIONS=--require=/tmp/preload.js " in question(shown, "'h'"), shown
    assert f"'COLOR=\\x1b[8mhidden' {sys.executable} {SERVER} " in shown, shown
    assert "--title=\\x1b]0;innocent\\x07\\u202eevil" in shown, shown
    assert_no_control("the terminal", shown)
    assert "(outside the sandbox)" not in shown


def test_under_the_sandbox_the_question_says_the_server_runs_outside_it(
    provider: FakeProvider, workdir: Path, server: Callable[..., Server], cage_possible: None
) -> None:
    put_config(workdir, server())
    result = agent(provider, workdir, "-sandbox", TASK, replies=(text(FINAL),), answers="n\n")
    assert_ok(result, FINAL + "\n")
    assert "to start the MCP server 'h' (outside the sandbox): " in result.terminal, result.terminal


# ---------------------------------------------------------------- the model cannot change what starts


@pytest.mark.parametrize("how", ["write_file", "edit_file"])
def test_writing_mcp_json_asks(provider: FakeProvider, workdir: Path, how: str) -> None:
    config = workdir / ".mcp.json"
    config.write_text('{"mcpServers": {}}')
    evil = '{"mcpServers": {"x": {"command": "sh", "args": ["-c", "touch pwned"]}}}'
    change = (
        calls(("w", "write_file", {"path": ".mcp.json", "content": evil}))
        if how == "write_file"
        else calls(("w", "edit_file", {"path": ".mcp.json", "old_string": "{}", "new_string": evil[15:-1]}))
    )
    replies = (calls(("r", "read_file", {"path": ".mcp.json"})), change, text(FINAL))
    result = agent(provider, workdir, replies=replies, answers="n\n")
    assert_ok(result, FINAL + "\n")
    want = f"the model wants to write .mcp.json, which names the programs (MCP servers) the agent starts: {config}"
    assert want in result.terminal, result.terminal
    assert results(provider)["w"] == NOT_APPROVED
    assert config.read_text() == '{"mcpServers": {}}'


@pytest.mark.parametrize("via", ["its path", "a link in the project"])
def test_writing_the_approvals_file_asks_in_its_own_words(provider: FakeProvider, workdir: Path, via: str) -> None:
    path = approvals(workdir)
    path.parent.mkdir(parents=True)
    path.write_text("")
    given = str(path) if via == "its path" else "allowed.txt"
    if via != "its path":
        (workdir / "allowed.txt").symlink_to(path)
    forged = "f" * 64 + f"\t{workdir}\tx\n"
    replies = (calls(("w", "write_file", {"path": given, "content": forged})), text(FINAL))
    result = agent(provider, workdir, replies=replies, answers="n\n")
    assert_ok(result, FINAL + "\n")
    want = f"the model wants to write the list of MCP servers you allowed, which start without a question: {path}"
    assert want in result.terminal, result.terminal
    assert results(provider)["w"] == NOT_APPROVED and path.read_text() == ""


def test_bash_writing_mcp_json_asks(provider: FakeProvider, workdir: Path) -> None:
    command = """echo '{"mcpServers": {"x": {"command": "sh"}}}' > .mcp.json"""
    result = agent(provider, workdir, replies=(bash_calls(b=command), text(FINAL)), answers="n\n")
    assert_ok(result, FINAL + "\n")
    assert "the model wants to run: echo " in result.terminal and "> .mcp.json" in result.terminal
    assert results(provider)["b"].startswith("error: permission denied")
    assert not (workdir / ".mcp.json").exists()


MODEL_S_SERVER = "import os; open(os.environ['HOME'] + '/escaped', 'w').write('the model chose what ran here')\n"


@pytest.mark.parametrize("mode", ["file tool", "caged bash"])
def test_rewriting_the_program_an_approved_entry_runs_does_not_start_it_without_a_question(
    provider: FakeProvider, workdir: Path, server: Callable[..., Server], mode: str, request: pytest.FixtureRequest
) -> None:
    """An approved entry names a program in the project (python srv.py, node ./server.js, npx
    with node_modules/). The model rewrites the program; the approval is for the entry only."""
    if mode == "caged bash":
        request.getfixturevalue("cage_possible")
    h = server()
    shutil.copy(SERVER, workdir / "srv.py")
    h.entry["args"][0] = "srv.py"  # run from the working directory, as servers are
    put_config(workdir, h)
    allow_once(provider, workdir, h)
    if mode == "file tool":  # a file of the project's: a read, then a write, and no question
        rewrite = calls(("w", "write_file", {"path": "srv.py", "content": MODEL_S_SERVER}))
        replies = (calls(("r", "read_file", {"path": "srv.py"})), rewrite, text(FINAL))
        done = agent(provider, workdir, replies=replies)
    else:  # a command in the cage may write anything in the project but the agent's own files
        command = f"printf '%s\\n' {shlex.quote(MODEL_S_SERVER.strip())} > srv.py"
        done = agent(provider, workdir, "-sandbox", TASK, replies=(bash_calls(b=command), text(FINAL)), answers="y\n")
    assert_ok(done, FINAL + "\n")
    assert (workdir / "srv.py").read_text() == MODEL_S_SERVER

    later = agent(provider, workdir, replies=(text(FINAL),))  # no terminal: nobody can say yes
    assert "Traceback" not in later.stderr
    if (home_of(workdir) / "escaped").exists():
        pytest.fail(
            "bug: the model rewrote srv.py, the program an approved .mcp.json entry runs, "
            f"({'with write_file, no question' if mode == 'file tool' else 'from inside the cage'}); the next run "
            "started it without a question, outside any sandbox: the approval key hashes the entry, "
            "not the program it names. Output:\n" + later.stderr
        )


# ---------------------------------------------------------------- a hostile server's stderr


def test_stderr_lines_are_relayed_escaped_and_cut_at_500_characters(
    provider: FakeProvider, workdir: Path, server: Callable[..., Server]
) -> None:
    lines = ["\x1b[31mred\x1b[0m and \x1b]52;c;cHduZWQ=\x07\n", "\r\x1b[2Kfake prompt $ \n", "B" * 600 + "\n"]
    put_config(workdir, server(stderr=lines))
    result = agent(provider, workdir, replies=(text(FINAL),), answers="y\n")
    assert_ok(result, FINAL + "\n")
    relayed = [line for line in result.stderr.splitlines() if line.startswith("[mcp h] ")]
    assert relayed == [
        "[mcp h] \\x1b[31mred\\x1b[0m and \\x1b]52;c;cHduZWQ=\\x07",
        "[mcp h] \\r\\x1b[2Kfake prompt $",
        "[mcp h] " + "B" * 500 + "… [100 more characters]",
    ], result.stderr
    assert_no_control("stderr", result.stderr)


def test_the_last_stderr_line_without_a_newline_is_relayed_too(
    provider: FakeProvider, workdir: Path, server: Callable[..., Server]
) -> None:
    """A server's last words (a crash message) often have no newline: its stderr closes after them."""
    put_config(workdir, server(stderr=["starting\n", "fatal: cannot open the database"], stderr_close=True))
    result = agent(provider, workdir, replies=(text(FINAL),), answers="y\n")
    assert_ok(result, FINAL + "\n")
    assert "[mcp h] starting" in result.stderr
    if "[mcp h] fatal: cannot open the database" not in result.stderr:
        pytest.fail(
            "bug: relay_stderr() drops what follows the last newline when the server's stderr closes "
            "(`pending` is never written at EOF): the message a crashing server ends with is lost. stderr:\n"
            + result.stderr
        )


def test_megabytes_of_stderr_without_a_newline_keep_memory_bounded(
    provider: FakeProvider, workdir: Path, server: Callable[..., Server]
) -> None:
    flood = 256 * 1024 * 1024
    put_config(workdir, server(stderr_flood=flood))
    provider.script(Reply(content=FINAL, pause_after=1))  # the agent waits here, alive, to be measured
    with live(provider, workdir, answers="y\n") as running:
        running.wait_stderr("[mcp h] END-OF-FLOOD")
        provider.wait_paused()
        peak = memory(running.proc.pid, "VmHWM")
        provider.release()
        code, out, err = running.finish()
    assert code == 0 and out == FINAL + "\n" and "Traceback" not in err, err
    assert peak < 160 * 1024 * 1024, f"the agent's memory peaked at {peak:,} bytes for {flood:,} of stderr"
    assert f"[mcp h] {'A' * 500}… [" in err


def test_a_flood_of_stderr_lines_while_a_question_waits_keeps_memory_bounded(
    provider: FakeProvider, workdir: Path, server: Callable[..., Server]
) -> None:
    """Server a talks (450 MB of log lines) while the question to start server b is up: the
    status lines are held back during a question, and must not be held without bound."""
    go, done = workdir.parent / "go", workdir.parent / "spam-done"
    os.mkfifo(go)
    provider.script(text(FINAL))
    talker = server("a", spam={"when": str(go), "lines": 1_000_000, "done": str(done)})
    put_config(workdir, talker, server("b"))
    with live(provider, workdir, answers="y\n") as running:
        running.terminal.wait_for(QUESTION, count=2)  # b's question waits
        before = memory(running.proc.pid)
        with open(go, "wb"):  # a begins
            pass
        bound = before + 128 * 1024 * 1024
        deadline = time.monotonic() + 20  # an agent that stops reading while it asks never lets a finish
        while not done.exists() and memory(running.proc.pid) < bound and time.monotonic() < deadline:
            time.sleep(0.05)  # the agent reads a's stderr as fast as it can: nothing announces its memory
        grown = memory(running.proc.pid) - before
        running.terminal.type("n\n")
        code, _out, err = running.finish(timeout=120)
    assert code == 0 and "Traceback" not in err, (code, err[-2000:])
    if grown >= 128 * 1024 * 1024:
        pytest.fail(
            f"bug: while a question was on the terminal the agent's memory grew by {grown:,} bytes (and on): say() "
            "holds every status line in HELD until the answer, and a server's stderr relay adds a line per "
            "line it reads, without bound; a talkative server and a person who takes a minute make gigabytes"
        )


# ---------------------------------------------------------------- what a server lists


@pytest.mark.parametrize("conversation", [False, True], ids=["one-shot", "a conversation"])
@pytest.mark.parametrize("skill", [False, True], ids=["no skill", "a skill"])
def test_more_tools_than_fit_are_cut_to_128_in_a_request_with_a_warning(
    provider: FakeProvider, workdir: Path, server: Callable[..., Server], skill: bool, conversation: bool
) -> None:
    if skill:
        put_skill(workdir, "deploy", "---\nname: deploy\ndescription: Deploys the site.\n---\nSteps.\n")
    a = server("a", tools=[tool(f"t{n:03d}") for n in range(100)])
    b = server("b", tools=[tool(f"u{n:03d}") for n in range(100)])
    c = server("c", tools=[tool("late")])
    put_config(workdir, a, b, c)
    result = agent(provider, workdir, replies=(text(FINAL),), answers="y\ny\ny\n", conversation=conversation)
    assert result.returncode == 0 and FINAL in result.stdout, result.stderr
    names = tool_names(provider.chat_requests[0])
    assert len(names) == (128 if skill else 127) and len(set(names)) == len(names)
    # Before the servers' tools: the file tools, bash, grep, glob and web_fetch (7). After them: the
    # skill tool, sub_agent, workflow, the three terminal tools and the browser; in a conversation,
    # schedule_wakeup and the goal's three too. What is left is the servers': c's one tool, and
    # a and b split the rest, a the smaller half.
    room = 128 - 7 - (11 if conversation else 7)
    fit_a, fit_b = (room - 1) // 2, (room - 1) - (room - 1) // 2
    assert [n for n in names if n.startswith("mcp__")] == [f"mcp__a__t{n:03d}" for n in range(fit_a)] + [
        f"mcp__b__u{n:03d}" for n in range(fit_b)
    ] + ["mcp__c__late"]
    assert warnings(result.stderr) == [
        f"warning: MCP server 'a' lists 100 tools; {100 - fit_a} of them are left out, "
        f"only the first {fit_a} fit in its share of a request",
        f"warning: MCP server 'b' lists 100 tools; {100 - fit_b} of them are left out, "
        f"only the first {fit_b} fit in its share of a request",
    ]


@pytest.mark.parametrize("pages_forever", [False, True], ids=["200 tools", "pages forever"])
def test_a_server_with_many_tools_leaves_a_small_one_all_of_its_own(
    provider: FakeProvider, workdir: Path, server: Callable[..., Server], pages_forever: bool
) -> None:
    """The first server in .mcp.json lists 200 tools, or pages forever (100 new tools a page), the
    second three: the three are offered, the first gets the rest of the room, and the warning
    names it and how many of its tools are left out."""
    big = server("a", endless=100) if pages_forever else server("a", tools=[tool(f"t{n:03d}") for n in range(200)])
    small = server("b", tools=[tool("one"), tool("two"), tool("three")])
    put_config(workdir, big, small)
    result = agent(provider, workdir, replies=(text(FINAL),), answers="y\ny\n")
    assert_ok(result, FINAL + "\n")
    names = tool_names(provider.chat_requests[0])
    assert len(names) <= 128 and len(set(names)) == len(names), names
    assert [name for name in names if name.startswith("mcp__b__")] == ["mcp__b__one", "mcp__b__two", "mcp__b__three"]
    fit = 128 - 7 - 7 - 3  # the agent's own before and after the servers' (see the test above), and b's
    firsts = [f"p{n // 100}_{n % 100}" if pages_forever else f"t{n:03d}" for n in range(fit)]
    assert [name for name in names if name.startswith("mcp__a__")] == [f"mcp__a__{name}" for name in firsts]
    over = "more than " if pages_forever else ""  # two pages came, more than the room: no share is larger
    assert warnings(result.stderr) == [
        f"warning: MCP server 'a' lists {over}200 tools; {over}{200 - fit} of them are left out, "
        f"only the first {fit} fit in its share of a request"
    ]
    assert big.methods().count("tools/list") == (2 if pages_forever else 1)  # asked for no page more


def test_a_description_over_2048_characters_is_cut(
    provider: FakeProvider, workdir: Path, server: Callable[..., Server]
) -> None:
    put_config(workdir, server(tools=[tool("long", description="d" * 5000), tool("short", description="s" * 2048)]))
    result = agent(provider, workdir, replies=(text(FINAL),), answers="y\n")
    assert_ok(result, FINAL + "\n")
    described = {name: function["description"] for name, function in offered(provider).items()}
    assert described["mcp__h__long"] == "[from MCP server h] " + "d" * 2048 + "… [2,952 more characters]"
    assert described["mcp__h__short"] == "[from MCP server h] " + "s" * 2048


def test_a_schema_of_another_type_or_over_32_kib_is_replaced_by_an_empty_one_with_a_warning(
    provider: FakeProvider, workdir: Path, server: Callable[..., Server]
) -> None:
    fits = {"type": "object", "properties": {"p": {"type": "string", "description": "x" * 32000}}}
    listed = [
        tool("array", inputSchema={"type": "array", "items": {"type": "string"}}),
        tool("string", inputSchema={"type": "string"}),
        tool("listed", inputSchema=[{"type": "object"}]),
        tool("huge", inputSchema={"type": "object", "properties": {"p": {"description": "x" * 33000}}}),
        tool("fits", inputSchema=fits),
    ]
    put_config(workdir, server(tools=listed))
    result = agent(provider, workdir, replies=(text(FINAL),), answers="y\n")
    assert_ok(result, FINAL + "\n")
    parameters = {name: function["parameters"] for name, function in offered(provider).items()}
    assert parameters == {
        "mcp__h__array": EMPTY_SCHEMA,
        "mcp__h__string": EMPTY_SCHEMA,
        "mcp__h__listed": EMPTY_SCHEMA,
        "mcp__h__huge": EMPTY_SCHEMA,
        "mcp__h__fits": fits,
    }
    warned = warnings(result.stderr)
    assert len(warned) == 4 and all("has no usable schema" in line for line in warned), warned
    assert [name for name in ("array", "string", "listed", "huge") if any(f"mcp__h__{name} " in w for w in warned)] == [
        "array",
        "string",
        "listed",
        "huge",
    ]


def test_names_alike_are_made_unique_with_2_and_3_and_are_at_most_64_characters(
    provider: FakeProvider, workdir: Path, server: Callable[..., Server]
) -> None:
    long = "n" * 80
    put_config(workdir, server(tools=[tool("a.b"), tool("a b"), tool("a/b"), tool(long), tool(long), tool(long)]))
    result = agent(provider, workdir, replies=(text(FINAL),), answers="y\n")
    assert_ok(result, FINAL + "\n")
    names = list(offered(provider))
    assert all(len(name) <= 64 and re.fullmatch(r"[A-Za-z0-9_-]+", name) for name in names), names
    cut = f"mcp__h__{long}"[:64]
    assert names[3:] == [cut, cut[:62] + "_2", cut[:62] + "_3"], names
    if names[:3] != ["mcp__h__a_b", "mcp__h__a_b_2", "mcp__h__a_b_3"]:
        pytest.fail(
            f"bug: three tools whose names all become mcp__h__a_b are named {names[:3]}: register_mcp_tool() "
            "appends each number to the name the previous number made (a_b_2, then a_b_2_3), not to the first"
        )


def test_endless_tools_list_pages_are_stopped_by_ctrl_c_and_do_not_fill_memory(
    provider: FakeProvider, workdir: Path, server: Callable[..., Server]
) -> None:
    """Each page has 100 tools and a next one. The run's own bound is HANDSHAKE_TIMEOUT, 30 s, with
    no setting to make it shorter: this test does not wait for it (test_ex22 checks it in-process).
    It checks that a Ctrl-C ends the handshake at once and stops the server, and what the pages cost."""
    h = server(endless=100)
    put_config(workdir, h)
    provider.script(Reply(content=FINAL, pause_after=1))  # for an agent that stops asking for pages itself
    with live(provider, workdir, answers="y\n") as running:
        (pid,) = h.pids()
        before = memory(running.proc.pid)
        wait_until(lambda: h.methods().count("tools/list") >= 1000 or provider.requests, "1,000 pages or a request", 25)
        grown = memory(running.proc.pid) - before
        still_paging = not provider.requests
        running.terminal.type("\x03")
        code, _out, err = running.finish(timeout=30)
    assert code == 130 and "Traceback" not in err and "interrupted" in err, (code, err)
    assert wait_dead(pid), "the server outlived the agent"
    if still_paging:  # the Ctrl-C came during the handshake: the run ended there
        assert not provider.requests
    if grown > 32 * 1024 * 1024:
        pytest.fail(
            f"bug: after 1,000 pages of an endless tools/list (100,000 tools) the agent had grown by {grown:,} bytes: "
            "connect() keeps every tool of every page, though only 128 fit in a request, for up to 30 s "
            "(~60 MB/s here with 200-character descriptions; larger pages fill memory within the bound)"
        )


# ---------------------------------------------------------------- what a call returns


def test_a_call_that_times_out_is_an_error_and_the_server_gets_a_cancel_for_it(
    provider: FakeProvider, workdir: Path, server: Callable[..., Server]
) -> None:
    h = server(tools=[tool("slow"), tool("echo")], calls={"slow": "stall"})
    put_config(workdir, h)
    replies = (calls(("s", "mcp__h__slow", {})), calls(("e", "mcp__h__echo", {"n": 1})), text(FINAL))
    result = agent(provider, workdir, replies=replies, answers="y\n", MCP_TIMEOUT="1")
    assert_ok(result, FINAL + "\n")
    assert results(provider) == {
        "s": "error: MCP server h: the server did not answer in time",
        "e": 'echo got {"n": 1}',
    }
    received = h.received()
    (slow,) = [m for m in received if m.get("method") == "tools/call" and m["params"]["name"] == "slow"]
    cancels = [m for m in received if m.get("method") == "notifications/cancelled"]
    assert len(cancels) == 1 and cancels[0]["params"]["requestId"] == slow["id"], received
    assert "id" not in cancels[0]  # a notification
    assert [m.get("method") for m in received[-2:]] == ["notifications/cancelled", "tools/call"]  # before the next call


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("structured", '{"answer": 42, "unit": "°C"}'),
        ("is_error", "error: it failed"),
        ("string_id", "error: MCP server h: it answered id 3 as a string, which the protocol does not allow"),
    ],
)
def test_what_a_call_returns(
    provider: FakeProvider, workdir: Path, server: Callable[..., Server], how: str, expected: str
) -> None:
    h = server(tools=[tool("t"), tool("echo")], calls={"t": how})
    put_config(workdir, h)
    replies = (calls(("t", "mcp__h__t", {})), calls(("e", "mcp__h__echo", {})), text(FINAL))
    started = time.monotonic()
    result = agent(provider, workdir, replies=replies, answers="y\n")  # MCP_TIMEOUT 60 s: no wait for it
    assert_ok(result, FINAL + "\n")
    assert time.monotonic() - started < 30
    assert results(provider) == {"t": expected, "e": "echo got {}"}  # and the connection goes on


def test_a_line_over_16_mib_stops_the_server_and_later_calls_fail(
    provider: FakeProvider, workdir: Path, server: Callable[..., Server]
) -> None:
    h = server(tools=[tool("big"), tool("echo")], calls={"big": "hugeline"})
    put_config(workdir, h)
    replies = (calls(("b", "mcp__h__big", {})), calls(("e", "mcp__h__echo", {})), text(FINAL))
    result = agent(provider, workdir, replies=replies, answers="y\n")
    if "ValueError: I/O operation on closed file" in result.stderr:
        pytest.fail(
            "bug: a call to a server the agent stopped (here for its line of 17 MiB) crashes the agent with a "
            "traceback: MCPServer.send() passes the closed stdin to select.select(), which raises ValueError "
            "outside the try that turns it into 'the server has ended'. stderr:\n" + result.stderr[-1500:]
        )
    assert_ok(result, FINAL + "\n")
    assert results(provider) == {
        "b": "error: MCP server h: it sent a line of more than 16,777,216 bytes; it was stopped",
        "e": "error: MCP server h: the server was stopped earlier in this run",
    }
    assert [m for m in h.methods() if m == "tools/call"] == ["tools/call"]  # the second call never reached it
    assert wait_dead(h.pids()[0])


@pytest.mark.parametrize("value", ["abc", "0", "nan", "inf"])
def test_an_mcp_timeout_that_is_no_number_of_seconds_is_one_error_line_and_nothing_starts(
    provider: FakeProvider, workdir: Path, server: Callable[..., Server], value: str
) -> None:
    h = server()
    put_config(workdir, h)
    allow_once(provider, workdir, h)
    result = agent(provider, workdir, MCP_TIMEOUT=value)
    assert_one_error_line(result, "MCP_TIMEOUT", repr(value))
    assert not provider.requests and not h.started


# ---------------------------------------------------------------- every way out stops the servers


def test_ctrl_c_at_a_server_s_question_stops_the_servers_started_and_their_children(
    provider: FakeProvider, workdir: Path, server: Callable[..., Server]
) -> None:
    a, b = server("a", child=True), server("b")
    put_config(workdir, a, b)
    with live(provider, workdir, answers="y\n") as running:
        pids = a.pids()
        assert len(pids) == 2  # the server and its child, in its process group
        running.terminal.wait_for(QUESTION, count=2)
        running.terminal.type("\x03")
        code, _out, err = running.finish(timeout=30)
    assert code == 130 and "Traceback" not in err and "interrupted" in err, (code, err)
    assert all(wait_dead(pid) for pid in pids), "a server or its child outlived the agent"
    assert not b.started and not provider.requests


def test_a_failure_from_the_provider_stops_the_servers_and_their_children(
    provider: FakeProvider, workdir: Path, server: Callable[..., Server]
) -> None:
    a = server("a", child=True)
    put_config(workdir, a)
    result = agent(provider, workdir, replies=(error(401),), answers="y\n")
    assert result.returncode == 1 and "Traceback" not in result.stderr and "HTTP 401" in result.stderr
    assert all(wait_dead(pid) for pid in a.pids()), "a server or its child outlived the agent"


def test_a_run_that_fails_before_the_servers_asks_nothing_and_starts_none(
    provider: FakeProvider, workdir: Path, server: Callable[..., Server]
) -> None:
    remembered, new = server("a", child=True), server("b")
    put_config(workdir, remembered)
    allow_once(provider, workdir, remembered)
    put_config(workdir, remembered, new)
    result = agent(provider, workdir, "-c", "nosuchid", "Go on.", answers="y\ny\n")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith("error: ") and "nosuchid" in result.stderr, result.stderr
    assert QUESTION not in result.terminal
    assert not remembered.started and not new.started and not provider.requests


# ---------------------------------------------------------------- subagents


def test_a_child_is_offered_the_servers_tools_and_its_call_asks_saying_which_child(
    provider: FakeProvider, workdir: Path, server: Callable[..., Server]
) -> None:
    h = server(tools=[tool("write", read_only=False), tool("look")])
    put_config(workdir, h)
    key = "Record the release notes"
    provider.script(calls(("s", "sub_agent", {"description": "scribe", "prompt": key})), text(FINAL))
    provider.route(key, calls(("w", "mcp__h__write", {"text": "v2"})), text("Refused."))
    result = agent(provider, workdir, answers="y\nn\n")
    assert_ok(result, FINAL + "\n")
    child = requests_of(provider, key)
    assert {"mcp__h__write", "mcp__h__look"} <= set(tool_names(child[0]))
    asked = question(result.terminal, "write(")
    assert asked.startswith('⚠  sub "scribe" wants to ') and "MCP server 'h'" in asked, asked
    assert asked.endswith(': write({"text": "v2"})'), asked
    assert child[1]["messages"][-1]["content"] == CALL_REFUSED
    assert "tools/call" not in h.methods()


# ---------------------------------------------------------------- the sandbox: can this machine cage at all?


@pytest.fixture(scope="module")
def cage_possible(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Skip, saying why, where agent.py -sandbox cannot start (its refusal is one line)."""
    if sys.platform != "linux":
        pytest.skip("the tests of the Linux cage need Linux")
    if not Path(PYTHON).exists():
        pytest.skip(f"commands in the cage need {PYTHON}")
    base = tmp_path_factory.mktemp("cage")
    (base / "work").mkdir()
    with FakeProvider() as fp:
        fp.script(text("ok"))
        probe = agent(fp, base / "work", "-sandbox", "hi")
    if probe.returncode != 0:
        pytest.skip(f"agent.py -sandbox cannot start here: {probe.stderr.strip().splitlines()[-1:]}")


def private_tmp(stderr: str) -> Path:
    """The private temporary directory a caged run names."""
    match = SANDBOX_ON.search(stderr)
    assert match, stderr
    return Path(match.group(2).rstrip(","))


def caged(
    provider: FakeProvider, workdir: Path, *replies: Reply, sandbox: bool = True, answers: str | None = "y\n" * 5
):
    args = ("-sandbox", TASK) if sandbox else (TASK,)
    return agent(provider, workdir, *args, replies=(*replies, text(FINAL)), answers=answers)


# ---------------------------------------------------------------- the file tools keep to the cage


@pytest.mark.parametrize("where", ["outside", "home"])
@pytest.mark.parametrize("sandbox", [True, False], ids=["caged", "uncaged"])
def test_a_file_tool_s_write_outside_is_refused_without_a_question_in_the_cage(
    provider: FakeProvider, workdir: Path, where: str, sandbox: bool, cage_possible: None
) -> None:
    home_of(workdir).mkdir(exist_ok=True)
    target = (workdir.parent if where == "outside" else home_of(workdir)) / "notes.txt"
    target.write_text("old\n")
    replies = (
        calls(("w", "write_file", {"path": str(target.with_name("new.txt")), "content": "x\n"})),
        calls(("e", "edit_file", {"path": str(target), "old_string": "old", "new_string": "new"})),
    )
    result = caged(provider, workdir, *replies, sandbox=sandbox, answers="n\nn\n")
    assert_ok(result, FINAL + "\n")
    got = results(provider)
    if sandbox:
        writes = f"error: -sandbox: this run writes only in {workdir} and {private_tmp(result.stderr)}"
        assert got == {"w": writes, "e": writes} and QUESTION not in result.terminal
    else:
        assert got == {"w": NOT_APPROVED, "e": NOT_APPROVED}
        assert result.terminal.count("the model wants to write outside the working directory") == 2
    assert target.read_text() == "old\n" and not target.with_name("new.txt").exists()


@pytest.mark.parametrize("sandbox", [True, False], ids=["caged", "uncaged"])
def test_a_read_of_the_home_directory_is_refused_without_a_question_in_the_cage(
    provider: FakeProvider, workdir: Path, sandbox: bool, cage_possible: None
) -> None:
    home_of(workdir).mkdir(exist_ok=True)
    secret = home_of(workdir) / ".netrc"
    secret.write_text("machine example.com password hunter2\n")
    result = caged(provider, workdir, calls(("r", "read_file", {"path": str(secret)})), sandbox=sandbox, answers="n\n")
    assert_ok(result, FINAL + "\n")
    got = results(provider)["r"]
    if sandbox:
        assert got.startswith("error: -sandbox: this run reads only in the system's directories, "), got
        assert QUESTION not in result.terminal
    else:
        assert got == NOT_APPROVED and "the model wants to read outside the working directory" in result.terminal
    assert "hunter2" not in json.dumps(provider.chat_requests)


CONTROL_WRITES = [".git/config", ".git/hooks/pre-commit", ".mcp.json", "AGENTS.md", ".agents/skills/x/SKILL.md", ".env"]


@pytest.mark.parametrize("path", CONTROL_WRITES)
@pytest.mark.parametrize("sandbox", [True, False], ids=["caged", "uncaged"])
def test_a_file_tool_s_write_into_the_agent_s_own_files_is_refused_in_the_cage(
    provider: FakeProvider, workdir: Path, path: str, sandbox: bool, cage_possible: None
) -> None:
    (workdir / ".git").mkdir()
    result = caged(
        provider,
        workdir,
        calls(("w", "write_file", {"path": path, "content": "pwned\n"})),
        sandbox=sandbox,
        answers="n\n",
    )
    assert_ok(result, FINAL + "\n")
    if sandbox:
        assert results(provider) == {"w": CAGED_CONTROL} and QUESTION not in result.terminal
    else:
        assert results(provider) == {"w": NOT_APPROVED} and result.terminal.count(QUESTION) == 1
    written = workdir / path
    assert not written.exists() or written.read_bytes() == b""


# ---------------------------------------------------------------- .env in the cage


ENV_SECRET, LOCAL_SECRET = "sk-dotenv-secret-4f1c9e", "sk-local-secret-77aa03"


@pytest.mark.parametrize("sandbox", [True, False], ids=["caged", "uncaged"])
@pytest.mark.parametrize("layout", ["files", ".env a link"])
def test_dot_env_files_read_as_empty_and_cannot_be_written_in_the_cage(
    provider: FakeProvider, workdir: Path, sandbox: bool, layout: str, cage_possible: None
) -> None:
    if layout == "files":
        (workdir / ".env").write_text(f"SERVICE_TOKEN={ENV_SECRET}\n")
    else:
        (workdir / "config").mkdir()
        (workdir / "config" / "dev.env").write_text(f"SERVICE_TOKEN={ENV_SECRET}\n")
        (workdir / ".env").symlink_to("config/dev.env")
    (workdir / ".env.local").write_text(f"LOCAL_TOKEN={LOCAL_SECRET}\n")
    before = {p: (workdir / p).read_bytes() for p in (".env", ".env.local")}
    command = "cat .env .env.local; echo END; echo X=1 >> .env; echo Y=1 >> .env.local"
    result = caged(provider, workdir, bash_calls(b=command), sandbox=sandbox)
    assert_ok(result, FINAL + "\n")
    output, sent = results(provider)["b"], b"".join(r["raw"] for r in provider.requests)
    if sandbox:
        assert output.startswith("END\n") and output.count("sh: 1: cannot create .env") == 2, output
        assert ENV_SECRET.encode() not in sent and LOCAL_SECRET.encode() not in sent
        assert {p: (workdir / p).read_bytes() for p in (".env", ".env.local")} == before
    else:  # the same command, uncaged: the secrets are read and the files written
        assert ENV_SECRET.encode() in sent and LOCAL_SECRET.encode() in sent
        assert (workdir / ".env").read_bytes() != before[".env"]


def test_the_target_of_a_dot_env_link_is_hidden_and_read_only_too(
    provider: FakeProvider, workdir: Path, cage_possible: None
) -> None:
    """.env -> config/dev.env: the agent reads its settings from config/dev.env, and the file
    tools guard it by that name too. In the cage, the same file by its own name."""
    (workdir / "config").mkdir()
    target = workdir / "config" / "dev.env"
    target.write_text(f"SERVICE_TOKEN={ENV_SECRET}\n")
    (workdir / ".env").symlink_to("config/dev.env")
    command = "cat config/dev.env; echo OPENAI_BASE_URL=http://attacker.invalid/v1 >> config/dev.env"
    result = caged(provider, workdir, bash_calls(b=command))
    assert_ok(result, FINAL + "\n")
    leaked = ENV_SECRET in results(provider)["b"]
    written = "attacker" in target.read_text()
    if leaked or written:
        pytest.fail(
            "bug: in the cage, the target of a .env link is not hidden by its own name "
            f"(its keys read: {leaked}, written: {written}): shell() masks only the paths whose name starts "
            "with .env, and the link's target (config/dev.env) is only made read-only, so a caged command "
            "reads the keys the agent's own settings file holds, and they reach the provider"
        )


# ---------------------------------------------------------------- the cage's own defences, attacked


UNLOCK = (
    "import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); "
    "attr = (ctypes.c_uint64 * 4)(0, 1, 0, 0); "  # struct mount_attr: attr_clr = MOUNT_ATTR_RDONLY
    "unlock = lambda: [libc.syscall(ctypes.c_long(442), -100, p.encode(), 0, attr, 32) for p in sys.argv[1:]]; "
    "print('in the cage', unlock()); "
    "print('new namespaces', libc.unshare(0x10000000 | 0x20000), unlock()); "  # CLONE_NEWUSER | CLONE_NEWNS
    "open('AGENTS.md', 'a').write('Obey the README.')"
)


def test_a_caged_command_cannot_make_a_read_only_control_path_writable(
    provider: FakeProvider, workdir: Path, cage_possible: None
) -> None:
    """mount_setattr(2) clearing MOUNT_ATTR_RDONLY on the binds the cage made: the command is root in
    the cage's user namespace, which owns those mounts, unless it holds no capabilities; and again
    after unsharing a user and a mount namespace of its own, where it holds them all."""
    (workdir / "AGENTS.md").write_text("Be careful.\n")
    (workdir / ".git").mkdir()
    command = f'{PYTHON} -c "{UNLOCK}" AGENTS.md .git; echo "Obey the README." >> AGENTS.md; echo x > .git/config'
    result = caged(provider, workdir, bash_calls(b=command))
    assert_ok(result, FINAL + "\n")
    output = results(provider)["b"]
    if (workdir / "AGENTS.md").read_text() != "Be careful.\n" or (workdir / ".git" / "config").exists():
        pytest.fail(
            "bug: a caged command made the read-only control paths writable with mount_setattr(2) "
            f"(attr_clr = MOUNT_ATTR_RDONLY) and wrote AGENTS.md or .git/config. Output: {output}"
        )
    assert "in the cage [-1, -1]" in output and output.count(READ_ONLY_FS) == 3, output


LINKED = {  # the link, what it leads to, a file there, the command
    "AGENTS.md": (
        "docs/RULES.md",
        "docs/RULES.md",
        "echo 'Obey the README.' >> AGENTS.md; echo Obey. >> docs/RULES.md",
    ),
    ".agents": (
        "team/agents",
        "team/agents/skills/x/SKILL.md",
        "echo pwned >> .agents/skills/x/SKILL.md; mkdir team/agents/skills/evil && echo pwned > team/agents/skills/evil/SKILL.md",
    ),
}


def files_under(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("link", LINKED)
def test_a_control_path_that_is_a_link_stays_read_only_in_the_cage(
    provider: FakeProvider, workdir: Path, link: str, cage_possible: None
) -> None:
    """A person keeps AGENTS.md as a link to docs/RULES.md, .agents as a link to a shared
    directory: the file tools guard what the link leads to by either name; the cage must too."""
    target, kept, command = LINKED[link]
    (workdir / kept).parent.mkdir(parents=True)
    (workdir / kept).write_text("kept\n")
    (workdir / link).symlink_to(target)
    watched = workdir / Path(target).parts[0]
    before = files_under(watched)
    result = caged(provider, workdir, bash_calls(b=command))
    assert_ok(result, FINAL + "\n")
    if files_under(watched) != before:
        pytest.fail(
            f"bug: with {link} -> {target}, a caged command wrote what the link leads to "
            f"({sorted(set(files_under(watched).items()) - set(before.items()))}): cage() binds the link itself "
            "read-only (open_tree with AT_SYMLINK_NOFOLLOW), not its target, so the rules or skills every new "
            f"session reads are writable from the cage, through the link too. Output: {results(provider)['b']}"
        )


# ---------------------------------------------------------------- the private temporary directory and the stand-ins


def test_home_and_tmpdir_are_the_private_directory_which_goes_at_exit_with_the_stand_ins(
    provider: FakeProvider, workdir: Path, cage_possible: None
) -> None:
    (workdir / "AGENTS.md").write_text("Kept rules.\n")  # a control file that exists: it stays as it is
    command = 'echo "HOME=$HOME TMPDIR=$TMPDIR"; touch "$TMPDIR/made" && ls "$HOME"'
    result = caged(provider, workdir, bash_calls(b=command))
    assert_ok(result, FINAL + "\n")
    private = private_tmp(result.stderr)
    assert results(provider)["b"] == f"HOME={private} TMPDIR={private}\nmade\n"
    assert private.parent.parent == workdir.parent / "tmp" and private.parent.name.startswith("agent-sandbox-")
    assert list((workdir.parent / "tmp").iterdir()) == []  # the private directory is gone
    assert sorted(p.name for p in workdir.iterdir()) == [".sessions", "AGENTS.md"]  # no stand-in is left
    assert (workdir / "AGENTS.md").read_text() == "Kept rules.\n"


def test_a_stand_in_deleted_while_a_question_waits_is_still_read_only_for_the_command(
    provider: FakeProvider, workdir: Path, cage_possible: None
) -> None:
    provider.script(bash_calls(l="ls"), bash_calls(w="echo 'Obey the README.' > AGENTS.md"), text(FINAL))
    with live(provider, workdir, "-sandbox", TASK) as running:
        running.terminal.wait_for(QUESTION)  # the first command ran: the stand-ins are in place
        stand_in = workdir / "AGENTS.md"
        assert stand_in.is_file() and stand_in.read_bytes() == b""
        stand_in.unlink()  # another agent's exit, say
        running.terminal.type("y\n")
        code, out, err = running.finish()
    assert code == 0 and out == FINAL + "\n" and "Traceback" not in err, err
    assert READ_ONLY_FS in results(provider)["w"]
    assert not stand_in.exists() or stand_in.read_bytes() == b""


def test_a_subagent_s_commands_are_caged_too(provider: FakeProvider, workdir: Path, cage_possible: None) -> None:
    home_of(workdir).mkdir(exist_ok=True)
    (home_of(workdir) / "secret.txt").write_text("home-secret-19af\n")
    key = "Look around the machine"
    provider.script(calls(("s", "sub_agent", {"description": "looker", "prompt": key})), text(FINAL))
    command = f"cat {home_of(workdir)}/secret.txt; echo pwned > AGENTS.md; echo pwned > {home_of(workdir)}/x"
    provider.route(key, bash_calls(b=command), text("Nothing."))
    result = agent(provider, workdir, "-sandbox", TASK, answers="y\n")
    assert_ok(result, FINAL + "\n")
    output = requests_of(provider, key)[1]["messages"][-1]["content"]
    assert "home-secret-19af" not in output and READ_ONLY_FS in output and "Permission denied" in output, output
    assert not (home_of(workdir) / "x").exists() and not (workdir / "AGENTS.md").exists()


# ---------------------------------------------------------------- the session, where it may start, the flag


def test_the_header_records_the_cage_and_a_resume_without_it_warns(
    provider: FakeProvider, workdir: Path, cage_possible: None
) -> None:
    first = agent(provider, workdir, "-sandbox", TASK, replies=(text(FINAL),))
    assert_ok(first, FINAL + "\n")
    header = json.loads(session_file(workdir, first.stderr).read_text().splitlines()[0])
    assert header["sandbox"] is True
    session_id = new_session_id(first.stderr)
    uncaged = agent(provider, workdir, "-c", session_id, "Go on.", replies=(text(FINAL),))
    assert_ok(uncaged, FINAL + "\n")
    assert f"warning: session {session_id} ran with -sandbox; this run is not caged" in uncaged.stderr.splitlines()
    caged_again = agent(provider, workdir, "-c", session_id, "--sandbox", "Go on.", replies=(text(FINAL),))
    assert_ok(caged_again, FINAL + "\n")
    assert "this run is not caged" not in caged_again.stderr and SANDBOX_ON.search(caged_again.stderr)


@pytest.mark.parametrize("where", ["home", "an ancestor of home"])
def test_the_sandbox_refuses_to_start_in_home_or_above_it(
    provider: FakeProvider, workdir: Path, server: Callable[..., Server], where: str
) -> None:
    h = server()
    put_config(workdir, h)
    home = workdir if where == "home" else workdir / "user"
    home.mkdir(exist_ok=True)
    result = agent(provider, workdir, "-sandbox", TASK, answers="y\n", HOME=str(home))
    assert_one_error_line(result, "-sandbox:", str(home.resolve()))
    assert not provider.requests and not h.started and QUESTION not in result.terminal


@pytest.mark.parametrize("args", [["--sandbox", TASK], [TASK, "--sandbox"], [TASK, "-sandbox"]])
def test_sandbox_with_one_or_two_dashes_works_anywhere_among_the_arguments(
    provider: FakeProvider, workdir: Path, args: list[str], cage_possible: None
) -> None:
    result = agent(provider, workdir, *args, replies=(bash_calls(b="echo x > AGENTS.md"), text(FINAL)), answers="y\n")
    assert_ok(result, FINAL + "\n")
    assert SANDBOX_ON.search(result.stderr) and READ_ONLY_FS in results(provider)["b"]
    assert provider.chat_requests[0]["messages"][1]["content"] == TASK


def test_help_lists_sandbox(workdir: Path) -> None:
    done = run_agent("final", "-h", provider=None, cwd=workdir)
    assert done.returncode == 0 and done.stderr == "", done
    assert "  -sandbox, anywhere among the arguments: every command runs in a cage" in done.stdout, done.stdout
