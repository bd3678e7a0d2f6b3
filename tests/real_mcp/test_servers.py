"""agent.py against real MCP servers nobody here wrote: mcp-server-time and mcp-server-git from PyPI.

The model is the fake provider on 127.0.0.1; the servers are the reference ones,
in the venv setup.py makes, named by absolute path in .mcp.json, started by
agent.py itself. What is checked is what reaches the provider (the tools as
the servers list them, the results of their calls), what a person at the
terminal is asked (each server once, before it first starts; a call only if the
server does not mark the tool read-only), what is remembered between runs, and
that no server outlives its run.

Every run pauses the last scripted reply (the fake provider's pause_after=0) so
that the servers can be seen while they run: the agent's children, and every
process in their sessions. After the run each of them must be gone, checked by
its pid. The schemas the tools must be offered with come from the servers
themselves, asked here independently of agent.py (`listed_tools`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import shlex
import subprocess
import time
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import NamedTuple
from zoneinfo import ZoneInfo

import pytest

from fake_provider import FakeProvider, Reply, text
from helpers import Live, alive, calls, kill_quietly, wait_until

from .conftest import Servers

TASK = "What time is noon in Paris in Tokyo, and what changed in the repository?"
FINAL = "Done."
QUESTION = "allow? (y/N)"
REFUSED = "error: permission denied — the user did not approve this call"
NOBODY = "(no answer from a terminal: refused)"
PROTOCOL = "2025-11-25"  # the newest version agent.py speaks; the reference servers speak it too
FIRST_MESSAGE = "Add the parser"
SECOND_MESSAGE = "Fix the off-by-one in the tokenizer"


# ---------------------------------------------------------------- processes, by pid, from /proc


class Proc(NamedTuple):
    ppid: int
    session: int
    tty: int  # tty_nr: 0 when it has no controlling terminal


def processes() -> dict[int, Proc]:
    """Every live process: its parent, its session and its terminal, from /proc/<pid>/stat."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if fields[0] != "Z":
            found[int(entry.name)] = Proc(int(fields[1]), int(fields[3]), int(fields[4]))
    return found


def cmdline(pid: int) -> list[str]:
    try:
        return [part.decode() for part in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]]
    except OSError:
        return []


class Seen(NamedTuple):
    agent_tty: int  # the agent's controlling terminal (tty_nr), 0 for none
    children: list[int]  # the agent's children: the servers it started
    servers: list[list[str]]  # their command lines
    sessions: set[int]  # their sessions: each server runs in one of its own
    pids: set[int]  # every process of those sessions: the servers and whatever they started


def look(agent: int) -> Seen:
    """The agent's children and every process in their sessions (each server runs in one of its own)."""
    table = processes()
    children = sorted(pid for pid, proc in table.items() if proc.ppid == agent)
    sessions = {table[pid].session for pid in children}
    pids = {pid for pid, proc in table.items() if proc.session in sessions} | set(children)
    tty = table[agent].tty if agent in table else -1
    return Seen(tty, children, [cmdline(pid) for pid in children], sessions, pids)


def left_over(seen: Seen) -> list[tuple[int, list[str]]]:
    """What is still running of what was seen: a pid seen, or any process in one of their sessions."""
    table = processes()
    return [(pid, cmdline(pid)) for pid, proc in table.items() if pid in seen.pids or proc.session in seen.sessions]


# ---------------------------------------------------------------- a run of agent.py


class Run(NamedTuple):
    code: int
    stdout: str
    stderr: str
    terminal: str  # what the terminal showed; "" with no terminal
    requests: list[dict]  # the chat requests the provider got
    seen: Seen  # the servers, while the last reply was paused

    @property
    def results(self) -> dict[str, str]:
        """Every tool result the model received, by call id (from the last request)."""
        return {m["tool_call_id"]: m["content"] for m in self.requests[-1]["messages"] if m["role"] == "tool"}

    def offered(self) -> dict[str, dict]:
        """The MCP tools of the first request, by name: each one's function."""
        functions = [entry["function"] for entry in self.requests[0].get("tools", [])]
        return {function["name"]: function for function in functions if function["name"].startswith("mcp__")}


def run(workdir: Path, *replies: Reply, answers: str | None) -> Run:
    """TASK with the model's replies scripted, the last one paused until the servers have been
    looked at. answers: the lines a person at a terminal types, one a question, then Ctrl-D;
    None: no terminal at all (pipes only, a session of its own). The approvals file is the
    test's own: XDG_CONFIG_HOME is a sibling of the working directory, as HOME is."""
    *before, last = replies
    seen = None
    with FakeProvider() as provider:
        provider.script(*before, dataclasses.replace(last, pause_after=0))
        config = str(workdir.parent / "config")
        with Live("final", TASK, provider=provider, cwd=workdir, answers=answers, XDG_CONFIG_HOME=config) as live:
            try:
                deadline = time.monotonic() + 90
                while not provider.paused.wait(0.05):
                    if live.proc.poll() is not None:
                        code, out, err = live.finish()
                        raise AssertionError(f"the run ended before its last request ({code}):\n{out}\n{err}")
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"the last request never came: {len(provider.chat_requests)} came")
                seen = look(live.proc.pid)
                provider.release()
                code, out, err = live.finish(timeout=60)
            except BaseException:  # the agent is killed, and so is every server process it left
                if seen is None and live.proc.poll() is None:
                    seen = look(live.proc.pid)
                live.kill()
                live.proc.wait(30)
                for pid in seen.pids if seen else ():
                    kill_quietly(pid)
                raise
        terminal = live.terminal.text if live.terminal else ""
        requests = provider.chat_requests
    assert "Traceback" not in err, err
    # The servers themselves are gone the moment the agent has exited: it waited for each one.
    # What they started may take a moment to die of its SIGKILL.
    servers_left = [(pid, cmdline(pid)) for pid in seen.children if alive(pid)]
    try:
        assert not servers_left, f"servers outlived the agent: {servers_left}"
        wait_until(lambda: not left_over(seen), "every process of the servers' sessions gone", timeout=10)
    finally:
        for pid, _ in left_over(seen):
            kill_quietly(pid)
    return Run(code, out, err, terminal, requests, seen)


def assert_done(result: Run) -> None:
    assert result.code == 0 and result.stdout == FINAL + "\n", (result.code, result.stdout, result.stderr)


def put_config(workdir: Path, **entries: dict) -> None:
    (workdir / ".mcp.json").write_text(json.dumps({"mcpServers": entries}, indent=1))


def approvals(workdir: Path) -> list[list[str]]:
    """The lines of the test's approvals file, split at tabs: key, project, server."""
    path = workdir.parent / "config" / "agent-py" / "mcp-allowed"
    return [line.split("\t") for line in path.read_text().splitlines()] if path.exists() else []


def started(stderr: str, name: str) -> tuple[str, int] | None:
    """(protocol, number of tools) from the line a server's start prints, or None."""
    for line in stderr.splitlines():
        prefix = f"[MCP server '{name}': protocol "
        if line.startswith(prefix) and line.endswith(" tokens in every request]"):
            version, tools = line[len(prefix) :].split(", ")[:2]
            return version, int(tools.split()[0])
    return None


def remembered_line(workdir: Path, name: str, command: list[str]) -> str:
    path = workdir.parent / "config" / "agent-py" / "mcp-allowed"
    return f"[MCP server '{name}': allowed in an earlier run ({path}); starting {shlex.join(command)}]"


def asked_to_start(name: str, command: list[str], answer: str) -> str:
    """What the terminal shows of the question before a server starts, and the answer typed."""
    return f"start the MCP server '{name}': {shlex.join(command)}\n{QUESTION} {answer}\n"


def argv_of(entry: dict) -> list[str]:
    return [entry["command"], *entry.get("args", [])]


# ---------------------------------------------------------------- the servers, asked directly


def server_env(home: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8"}


def listed_tools(command: list[str], home: Path) -> list[dict]:
    """The tools a server lists, asked here with a handshake of our own (not agent.py's), every read bounded."""
    proc = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=server_env(home)
    )
    pending = b""

    def send(message: dict) -> None:
        proc.stdin.write(json.dumps(message).encode() + b"\n")
        proc.stdin.flush()

    def answer(request_id: int) -> dict:
        nonlocal pending
        deadline = time.monotonic() + 30
        while True:
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                message = json.loads(line)
                if message.get("id") == request_id:
                    return message["result"]
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
                raise TimeoutError(f"{command[0]} did not answer request {request_id}")
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                raise AssertionError(f"{command[0]} ended before answering request {request_id}")
            pending += chunk

    try:
        hello = {
            "protocolVersion": PROTOCOL,
            "capabilities": {},
            "clientInfo": {"name": "real_mcp tests", "version": "1"},
        }
        send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello})
        answer(1)
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        tools, cursor = [], None
        for request_id in range(2, 100):
            send(
                {
                    "jsonrpc": "2.0",
                    "id": request_id,
                    "method": "tools/list",
                    "params": {"cursor": cursor} if cursor else {},
                }
            )
            page = answer(request_id)
            tools += page["tools"]
            if not (cursor := page.get("nextCursor")):
                return tools
        raise AssertionError("tools/list never ended")
    finally:
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="module")
def time_tools(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return listed_tools([str(servers.time)], tmp_path_factory.mktemp("time-home"))


@pytest.fixture(scope="module")
def git_tools(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return listed_tools([str(servers.git)], tmp_path_factory.mktemp("git-home"))


def read_only(tool: dict) -> bool:
    return (tool.get("annotations") or {}).get("readOnlyHint") is True


def assert_offered_as_listed(result: Run, server: str, tools: list[dict]) -> None:
    """The first request offers every tool the server lists, by its name, with its description
    (saying whose it is) and its input schema exactly as the server gave them."""
    offered = {name: f for name, f in result.offered().items() if name.startswith(f"mcp__{server}__")}
    assert list(offered) == [f"mcp__{server}__{tool['name']}" for tool in tools]
    for tool in tools:
        function = offered[f"mcp__{server}__{tool['name']}"]
        assert function["description"] == f"[from MCP server {server}] {tool['description']}"
        assert function["parameters"] == tool["inputSchema"]


# ---------------------------------------------------------------- a repository, made by the test


def git(repo: Path, *args: str) -> str:
    env = server_env(repo.parent) | {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, timeout=30)
    assert done.returncode == 0, (args, done.stderr)
    return done.stdout


def make_repo(repo: Path) -> Path:
    """Two commits with known messages, then parser.py modified and not staged."""
    repo.mkdir()
    git(repo, "init", "--quiet")
    git(repo, "config", "user.name", "Test Person")
    git(repo, "config", "user.email", "test@example.invalid")
    git(repo, "config", "commit.gpgsign", "false")
    (repo / "parser.py").write_text("def parse(text):\n    return text.split()\n")
    git(repo, "add", "parser.py")
    git(repo, "commit", "--quiet", "-m", FIRST_MESSAGE)
    (repo / "tokenizer.py").write_text("def tokens(text):\n    return list(text)\n")
    git(repo, "add", "tokenizer.py")
    git(repo, "commit", "--quiet", "-m", SECOND_MESSAGE)
    (repo / "parser.py").write_text("def parse(text):\n    return text.split(',')\n")
    return repo


def repo_state(repo: Path) -> tuple[str, ...]:
    """What a commit or an add would change: the commits, the index, the working tree."""
    return (
        git(repo, "log", "--format=%H %s"),
        git(repo, "diff", "--cached", "--name-status"),
        git(repo, "status", "--porcelain"),
        (repo / "parser.py").read_text(),
    )


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """The project agent.py runs in; HOME is tmp_path, the approvals file under tmp_path/config."""
    work = tmp_path / "work"
    work.mkdir()
    return work


# ---------------------------------------------------------------- mcp-server-time


def paris_today() -> date:
    return datetime.now(ZoneInfo("Europe/Paris")).date()


def as_the_server_says(moment: datetime) -> dict:
    return {
        "timezone": str(moment.tzinfo),
        "datetime": moment.isoformat(timespec="seconds"),
        "day_of_week": moment.strftime("%A"),
        "is_dst": bool(moment.dst()),
    }


def test_time_server_converts_noon_in_paris_to_tokyo_and_asks_only_to_start(
    servers: Servers, workdir: Path, time_tools: list[dict]
) -> None:
    entry = {"command": str(servers.time)}
    put_config(workdir, time=entry)
    convert = {"source_timezone": "Europe/Paris", "time": "12:00", "target_timezone": "Asia/Tokyo"}
    bad = {"source_timezone": "Mars/Olympus", "time": "12:00", "target_timezone": "Asia/Tokyo"}
    round_1 = calls(("c", "mcp__time__convert_time", convert), ("bad", "mcp__time__convert_time", bad))
    before = paris_today()
    result = run(workdir, round_1, text(FINAL), answers="y\n")
    after = paris_today()
    assert_done(result)

    # One question: the start, with the command line as it runs. Both tools are marked read-only,
    # so neither call asks.
    assert [tool["name"] for tool in time_tools] == ["get_current_time", "convert_time"]
    assert all(read_only(tool) for tool in time_tools)
    assert result.terminal.count(QUESTION) == 1, result.terminal
    assert asked_to_start("time", argv_of(entry), "y") in result.terminal, result.terminal
    assert [line[1:] for line in approvals(workdir)] == [[str(workdir), "time"]]
    assert started(result.stderr, "time") == (PROTOCOL, 2), result.stderr
    assert [argv[1:] for argv in result.seen.servers] == [argv_of(entry)]

    assert_offered_as_listed(result, "time", time_tools)
    assert len(result.requests) == 2

    # The conversion, as the server computes it for today's date in Paris (12:00 CET is 20:00
    # in Tokyo; in summer, CEST, it is 19:00).
    converted = json.loads(result.results["c"])
    day = date.fromisoformat(converted["source"]["datetime"][:10])
    assert day in (before, after), converted
    noon = datetime(day.year, day.month, day.day, 12, tzinfo=ZoneInfo("Europe/Paris"))
    tokyo = noon.astimezone(ZoneInfo("Asia/Tokyo"))
    hours = (tokyo.utcoffset() - noon.utcoffset()) / timedelta(hours=1)
    assert converted == {
        "source": as_the_server_says(noon),
        "target": as_the_server_says(tokyo),
        "time_difference": f"{hours:+.1f}h",
    }
    assert f"T{'19:00' if noon.dst() else '20:00'}:00+09:00" in result.results["c"]

    # The server's own error (isError) is an error result, its message kept.
    assert result.results["bad"].startswith("error: "), result.results["bad"]
    assert "Mars/Olympus" in result.results["bad"]


# ---------------------------------------------------------------- mcp-server-git


def test_git_server_reads_without_asking_and_a_refused_write_leaves_the_repository_alone(
    servers: Servers, workdir: Path, tmp_path: Path, git_tools: list[dict]
) -> None:
    repo = make_repo(tmp_path / "repo")
    state = repo_state(repo)
    entry = {"command": str(servers.git), "args": ["--repository", str(repo)]}
    put_config(workdir, git=entry)
    where = str(repo)
    reads = calls(
        ("status", "mcp__git__git_status", {"repo_path": where}),
        ("log", "mcp__git__git_log", {"repo_path": where, "max_count": 10}),
    )
    add = {"repo_path": where, "files": ["parser.py"]}
    commit = {"repo_path": where, "message": "Sneak a commit in"}
    writes = calls(("add", "mcp__git__git_add", add), ("commit", "mcp__git__git_commit", commit))
    result = run(workdir, reads, writes, text(FINAL), answers="y\nn\nn\n")
    assert_done(result)

    by_name = {tool["name"]: tool for tool in git_tools}
    assert read_only(by_name["git_status"]) and read_only(by_name["git_log"])
    assert not read_only(by_name["git_add"]) and not read_only(by_name["git_commit"])
    assert started(result.stderr, "git") == (PROTOCOL, len(git_tools)), result.stderr
    assert [argv[1:] for argv in result.seen.servers] == [argv_of(entry)]
    assert_offered_as_listed(result, "git", git_tools)

    # Three questions: the start, then each write with its arguments, refused. None for the reads.
    assert result.terminal.count(QUESTION) == 3, result.terminal
    assert asked_to_start("git", argv_of(entry), "y") in result.terminal, result.terminal
    for tool, arguments in (("git_add", add), ("git_commit", commit)):
        assert f"{tool}({json.dumps(arguments)})\n{QUESTION} n\n" in result.terminal, result.terminal
        assert "'git'" in result.terminal

    assert "modified:   parser.py" in result.results["status"], result.results["status"]
    log = result.results["log"]
    for message in (FIRST_MESSAGE, SECOND_MESSAGE):
        assert f"Message: {message}\n" in log, log
    for commit_id in git(repo, "rev-list", "HEAD").split():
        assert f"Commit: {commit_id}\n" in log, log
    assert result.results["add"] == REFUSED
    assert result.results["commit"] == REFUSED

    assert repo_state(repo) == state  # nothing staged, nothing committed
    assert git(repo, "rev-list", "--count", "HEAD") == "2\n"


# ---------------------------------------------------------------- the remembered yes


def test_a_yes_is_remembered_with_no_terminal_until_the_entry_changes(
    servers: Servers, workdir: Path, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    git_entry = {"command": str(servers.git), "args": ["--repository", str(repo)]}
    time_entry = {"command": str(servers.time)}
    put_config(workdir, git=git_entry, time=time_entry)

    # 1. At a terminal: each server asked about once (in name order), both allowed.
    first = run(workdir, text(FINAL), answers="y\ny\n")
    assert_done(first)
    assert first.terminal.count(QUESTION) == 2, first.terminal
    git_question = first.terminal.index(asked_to_start("git", argv_of(git_entry), "y"))
    assert git_question < first.terminal.index(asked_to_start("time", argv_of(time_entry), "y"))
    assert [line[1:] for line in approvals(workdir)] == [[str(workdir), "git"], [str(workdir), "time"]]
    assert sorted(argv[1:] for argv in first.seen.servers) == [argv_of(git_entry), argv_of(time_entry)]

    # 2. No terminal at all: both start with no question, each saying it was allowed before,
    # and their tools work.
    reads = calls(
        ("status", "mcp__git__git_status", {"repo_path": str(repo)}),
        ("now", "mcp__time__get_current_time", {"timezone": "Asia/Tokyo"}),
    )
    second = run(workdir, reads, text(FINAL), answers=None)
    assert_done(second)
    assert second.seen.agent_tty == 0 and second.terminal == ""
    assert NOBODY not in second.stderr, second.stderr
    for name, entry in (("git", git_entry), ("time", time_entry)):
        assert remembered_line(workdir, name, argv_of(entry)) in second.stderr.splitlines(), second.stderr
        assert started(second.stderr, name) is not None, second.stderr
    assert sorted(argv[1:] for argv in second.seen.servers) == [argv_of(git_entry), argv_of(time_entry)]
    assert "modified:   parser.py" in second.results["status"]
    assert json.loads(second.results["now"])["timezone"] == "Asia/Tokyo"
    assert len(approvals(workdir)) == 2  # nothing new to remember

    # 3. The time entry changed (an added argument): with no terminal, it is not started; git still is.
    changed = {"command": str(servers.time), "args": ["--local-timezone", "Etc/UTC"]}
    put_config(workdir, git=git_entry, time=changed)
    third = run(workdir, text(FINAL), answers=None)
    assert_done(third)
    assert third.seen.agent_tty == 0
    assert third.stderr.splitlines().count(NOBODY) == 1, third.stderr
    assert remembered_line(workdir, "git", argv_of(git_entry)) in third.stderr.splitlines(), third.stderr
    assert started(third.stderr, "time") is None, third.stderr
    assert "[MCP server 'time' not started: not allowed (a yes at a terminal starts it from now on)]" in third.stderr
    assert [argv[1:] for argv in third.seen.servers] == [argv_of(git_entry)]
    assert not [name for name in third.offered() if name.startswith("mcp__time__")]
    assert [name for name in third.offered() if name.startswith("mcp__git__")]

    # 4. At a terminal, the changed entry is asked about again, with its new command line; git is not.
    fourth = run(workdir, text(FINAL), answers="y\n")
    assert_done(fourth)
    assert fourth.terminal.count(QUESTION) == 1, fourth.terminal
    assert asked_to_start("time", argv_of(changed), "y") in fourth.terminal, fourth.terminal
    assert sorted(argv[1:] for argv in fourth.seen.servers) == [argv_of(git_entry), argv_of(changed)]
    assert [line[1:] for line in approvals(workdir)] == [[str(workdir), s] for s in ("git", "time", "time")]


# ---------------------------------------------------------------- no server left behind


def test_no_process_of_a_server_outlives_its_run(servers: Servers, workdir: Path, tmp_path: Path) -> None:
    """Every run above checks this (run() looks at the servers' sessions while the last reply waits);
    here it is on its own, with the git server having worked and the time server idle, and the
    pids seen checked to be real servers of this run's venv before they are checked gone."""
    repo = make_repo(tmp_path / "repo")
    put_config(workdir, git={"command": str(servers.git)}, time={"command": str(servers.time)})
    work = calls(
        ("log", "mcp__git__git_log", {"repo_path": str(repo), "max_count": 5}),
        ("diff", "mcp__git__git_diff_unstaged", {"repo_path": str(repo)}),
    )
    result = run(workdir, work, text(FINAL), answers="y\ny\n")
    assert_done(result)
    assert "text.split(',')" in result.results["diff"], result.results["diff"]
    assert len(result.seen.servers) == 2
    assert all(Path(argv[1]).parent == servers.bin for argv in result.seen.servers), result.seen.servers
    assert result.seen.sessions == set(result.seen.children)  # each server leads a session of its own
    assert len(result.seen.pids) >= 2
    assert not [pid for pid in result.seen.pids if alive(pid)]
