"""Chapter 7: bash is a privileged tool.

The real exercises/ex07/agent.py runs as a subprocess against the fake
provider, and so does agent.py ("final"), which inherits the bash tool; the
model's bash calls are scripted. The tests check the tool results that reached
the server, the processes left behind, the agent's memory, and the files on
disk. The default timeout is checked in-process, on a clock that stands in for
the standard library's inside the loaded program, so 30 seconds of the
agent's time pass without 30 seconds of waiting.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import Terminal, hermetic_env, load_program, program, run_agent
from fake_provider import FakeProvider, Reply, text
from helpers import (
    Live,
    assert_ok,
    bash_calls,
    calls,
    calls_saved_first,
    disk_messages,
    hint,
    kill_quietly,
    live_processes,
    new_session_id,
    results,
    since,
    stderr_lines,
    wait_dead,
)

pytestmark = pytest.mark.parametrize("chapter", [7, "final"])
TASK = "Run the commands."
NO_OUTPUT = "(command succeeded with no output)"
MARKER = re.compile(r"\A\[\.\.\. first (\d+) bytes truncated, showing the end \.\.\.\]\n")
YES = "y\n" * 40  # chapter 9's gate asks about most of these commands: approve every one


def answers_for(chapter: int | str) -> str | None:
    """From chapter 9 on, a person at the terminal approves every question; before it, no terminal."""
    return YES if since(chapter, 9) else None


def run(chapter: int | str, provider: FakeProvider, workdir: Path, *replies: Reply, stdin: str = "") -> dict[str, str]:
    """Run the agent to a "Done." answer; return every tool result the model got, by call id."""
    provider.script(*replies, text("Done."))
    result = run_agent(chapter, TASK, provider=provider, cwd=workdir, stdin=stdin, answers=answers_for(chapter))
    assert_ok(result, stdout="Done.\n")
    return results(provider)


def split_marker(result: str) -> tuple[int, str]:
    """(K from the truncation marker, the text shown after it)."""
    match = MARKER.match(result)
    assert match, result[:200]
    return int(match.group(1)), result[match.end() :]


# ---------------------------------------------------------------- where and how commands run


def test_tool_is_declared_with_an_optional_integer_timeout(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    run(chapter, provider, workdir, bash_calls(c1="true"))
    tools = {tool["function"]["name"]: tool["function"] for tool in provider.chat_requests[0]["tools"]}
    chapter_7 = {"read_file", "write_file", "edit_file", "bash"}
    if chapter == "final":
        assert chapter_7 <= set(tools)  # later chapters add tools after these
    else:
        assert set(tools) == chapter_7
    parameters = tools["bash"]["parameters"]
    assert parameters["required"] == ["command"]
    assert parameters["properties"]["command"]["type"] == "string"
    assert parameters["properties"]["timeout"]["type"] == "integer"
    # The model is told the default and the limit it must respect.
    description = parameters["properties"]["timeout"]["description"]
    assert re.search(r"\bdefault 30\b", description), description
    assert "120" in description, description


def test_runs_in_the_start_directory_with_stdin_closed(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    (workdir / "here.txt").write_text("x", encoding="utf-8")
    (workdir / "sub").mkdir()
    start = os.path.realpath(workdir)
    got = run(
        chapter,
        provider,
        workdir,
        bash_calls(
            pwd1="pwd",
            ls="ls",
            cd_root="cd / && pwd",
            pwd2="pwd",
            cd_sub="cd sub",
            pwd3="pwd",
            stdin_is="readlink /proc/self/fd/0",
            # The agent's own stdin holds text: a command must not read it.
            cat="cat",
            combined="echo out; echo err >&2; echo out2",
        ),
        bash_calls(pwd4="pwd"),  # a later round: still the start directory
        stdin="text meant for the agent, not for commands\n",
    )
    assert got["pwd1"] == got["pwd2"] == got["pwd3"] == got["pwd4"] == start + "\n", got
    assert got["ls"] == "here.txt\nsub\n"
    assert got["cd_root"] == "/\n"
    assert got["cd_sub"] == NO_OUTPUT
    assert got["stdin_is"] == "/dev/null\n"
    assert got["cat"] == NO_OUTPUT
    assert got["combined"] == "out\nerr\nout2\n"


def test_exit_status_is_information_not_failure(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    got = run(
        chapter,
        provider,
        workdir,
        bash_calls(
            hi="echo hi; exit 3",
            silent_fail="exit 4",
            err_fail="echo oops >&2; exit 1",
            empty="true",
            no_newline="printf 'no newline'",
            missing="no_such_command_xyz",
        ),
    )
    assert got["hi"] == "hi\n[exit status 3]"
    assert got["silent_fail"] == "[exit status 4]"
    assert got["err_fail"] == "oops\n[exit status 1]"
    assert got["empty"] == NO_OUTPUT
    assert got["no_newline"] == "no newline"
    assert "no_such_command_xyz" in got["missing"] and got["missing"].endswith("\n[exit status 127]")
    assert not any(result.startswith("error:") for result in got.values()), got


def test_bash_walks_past_read_before_write(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    # The chapter's lesson: the registry's rule binds the file tools only.
    target = workdir / "f.txt"
    target.write_bytes(b"old\n")
    got = run(
        chapter,
        provider,
        workdir,
        calls(
            ("w", "write_file", {"path": "f.txt", "content": "new\n"}),
            ("b", "bash", {"command": "echo x >> f.txt"}),
        ),
    )
    assert got["w"].startswith("error: ") and "read" in got["w"], got["w"]
    assert got["b"] == NO_OUTPUT
    assert target.read_bytes() == b"old\nx\n"


def test_a_path_key_on_bash_does_not_count_as_reading_the_file(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    """Chapter 6's read-before-write takes the path of a file tool only. bash is the first tool
    without one: a stray "path" key on a bash call reads nothing, so the file is still unread."""
    target = workdir / "notes.txt"
    target.write_bytes(b"precious\n")
    got = run(
        chapter,
        provider,
        workdir,
        calls(("b", "bash", {"command": "pwd", "path": "notes.txt"})),
        calls(("w", "write_file", {"path": "notes.txt", "content": "overwritten\n"})),
    )
    assert got["b"] == os.path.realpath(workdir) + "\n"  # the call itself ran
    assert got["w"].startswith("error: ") and "read it first" in got["w"], got["w"]
    assert target.read_bytes() == b"precious\n"


# ---------------------------------------------------------------- the timeout argument


def test_timeout_argument_is_validated(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    bad = {"string": "5", "float": 1.5, "bool": True, "zero": 0, "negative": -1}
    good = {"one": 1, "max": 120}
    specs = {key: {"command": f"touch ran_{key}", "timeout": value} for key, value in {**bad, **good}.items()}
    specs["too_long"] = {"command": "touch ran_too_long", "timeout": 121}
    specs["default"] = {"command": "touch ran_default"}
    got = run(chapter, provider, workdir, bash_calls(**specs))
    for key in bad:
        assert got[key].startswith("error: ") and "timeout" in got[key], (key, got[key])
        assert not (workdir / f"ran_{key}").exists(), key
    assert got["too_long"].startswith("error: ") and "120" in got["too_long"], got["too_long"]
    assert "split" in got["too_long"], got["too_long"]
    assert not (workdir / "ran_too_long").exists()
    for key in [*good, "default"]:
        assert got[key] == NO_OUTPUT, (key, got[key])
        assert (workdir / f"ran_{key}").exists(), key


def test_timeout_kills_the_whole_process_group(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    # A duration no other process on the machine uses, to find this run's sleeps.
    duration = f"61.{secrets.randbelow(10**6):06d}"
    command = f"echo started; sleep {duration} & sleep {duration}"
    provider.script(bash_calls(k={"command": command, "timeout": 1}), text("Done."))
    with Live(chapter, TASK, provider=provider, cwd=workdir, answers=answers_for(chapter)) as agent:
        try:
            # Time the tool round only (between the two requests), not Python's start-up.
            provider.wait_requests(1, timeout=60)
            started = time.monotonic()
            provider.wait_requests(2, timeout=90)
            elapsed = time.monotonic() - started
            assert_ok(agent.completed(), stdout="Done.\n")
            assert elapsed < 10, f"the tool round took {elapsed:.1f} s; the kill should come after about 1 s"
            assert (
                results(provider)["k"]
                == "error: command exceeded 1 s and was killed. Output before the kill:\nstarted\n"
            )
            survivors = [pid for pid in live_processes(["sleep", duration]) if not wait_dead(pid)]
            assert survivors == [], "sleep processes from the killed command are still running"
        finally:
            for pid in live_processes(["sleep", duration]):  # only this test's own leftovers
                kill_quietly(pid)


class AgentClock:
    """Stands in for the `time` module inside one loaded program. Its monotonic()
    moves one second per reading, so the agent's 30 seconds pass in 30 readings
    however fast or loaded the machine is. Everything else is the real module."""

    def __init__(self) -> None:
        self.readings: list[float] = []

    def monotonic(self) -> float:
        self.readings.append(float(len(self.readings)))
        return self.readings[-1]

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)


# Output keeps the agent's read loop turning: a file far bigger than the 30 turns take in
# (at most 64 KiB each), so `cat` is still writing when the kill comes. `cat FILE` is also a
# command chapter 9's gate lets run without a question: in-process, nobody is at a terminal.
TICKS = "tick\n" * 2_000_000
TICKING = "cat ticks.txt"


@pytest.mark.parametrize(("arguments", "seconds"), [({}, 30), ({"timeout": 3}, 3)], ids=["default", "timeout-3"])
def test_default_timeout_is_30_seconds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chapter: int | str, arguments: dict, seconds: int
) -> None:
    """The command is killed when the agent's clock says 30 s have passed since it started, not before."""
    agent = load_program(chapter, tmp_path, monkeypatch)
    (tmp_path / "ticks.txt").write_text(TICKS, encoding="utf-8")
    if since(chapter, 9):
        assert agent.permission(TICKING) == "allow"  # never a question: it would go to pytest's own terminal
    clock = AgentClock()
    monkeypatch.setattr(agent, "time", clock)
    kills: list[tuple[float, bool]] = []  # (the agent's clock, was the command still running?)
    real_killpg = os.killpg

    def watched_killpg(group: int, number: int) -> None:
        kills.append((clock.readings[-1], os.waitid(os.P_PID, group, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None))
        real_killpg(group, number)

    monkeypatch.setattr(os, "killpg", watched_killpg)
    started = time.monotonic()
    result = agent.bash({"command": TICKING, **arguments})
    assert time.monotonic() - started < 20, "the kill waited for real seconds, not the agent's"

    prefix = f"error: command exceeded {seconds} s and was killed. Output before the kill:\n"
    assert result.startswith(prefix), result[:200]
    truncated, shown = split_marker(result[len(prefix) :])
    *whole, last = shown.split("\n")
    assert whole and set(whole) == {"tick"} and "tick".startswith(last), result[:200]  # the kill may cut a line
    assert truncated + len(shown) < len(TICKS)  # killed before the end of the file
    # Readings: the start (when Popen returned), then one per turn of the read loop.
    assert kills == [(clock.readings[0] + seconds, True)], (kills, clock.readings)
    assert clock.readings[-2] == clock.readings[0] + seconds - 1  # one second earlier, it was left to run


# ---------------------------------------------------------------- output: the tail, bounded


def test_long_output_keeps_a_line_aligned_tail(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    full = "".join(f"{n}\n" for n in range(1, 100001)).encode()
    got = run(chapter, provider, workdir, bash_calls(seq="seq 1 100000", short="seq 1 3"))
    result = got["seq"]
    assert len(result.encode()) < 8.3 * 1024, len(result.encode())
    truncated, shown = split_marker(result)
    shown_bytes = shown.encode()
    assert full.endswith(shown_bytes)
    assert truncated == len(full) - len(shown_bytes)
    assert full[: len(full) - len(shown_bytes)].endswith(b"\n"), "the shown part starts mid-line"
    assert int(shown.split("\n", 1)[0]) > 90000
    assert shown.endswith("99999\n100000\n")
    assert len(shown_bytes) >= 8 * 1024 - len(b"100000\n"), "less than the 8 KiB cap shown"
    assert got["short"] == "1\n2\n3\n"  # under the cap: no marker


MEASURE = """\
import resource, subprocess, sys
code = subprocess.run(sys.argv[2:]).returncode
with open(sys.argv[1], "w") as out:
    out.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(code)
"""


def test_huge_output_keeps_memory_bounded(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    size = 300_000_000
    provider.script(bash_calls(big=f"yes | head -c {size}"), text("Done."))
    # A helper process runs the agent and reports its children's peak RSS.
    rss_file = workdir.parent / "maxrss"
    agent = [sys.executable, str(program(chapter)), TASK]
    terminal = Terminal(answers) if (answers := answers_for(chapter)) is not None else None
    try:
        result = subprocess.run(
            [sys.executable, "-c", MEASURE, str(rss_file), *(terminal.argv(agent) if terminal else agent)],
            cwd=workdir,
            env=hermetic_env(provider, workdir.parent),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=300,
            start_new_session=terminal is None,
        )
    finally:
        if terminal:
            terminal.close()
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert result.stdout == "Done.\n"
    peak_mb = int(rss_file.read_text()) / 1024  # Linux reports kilobytes
    assert peak_mb < 150, f"peak RSS {peak_mb:.0f} MB while a command printed {size // 10**6} MB"
    truncated, shown = split_marker(results(provider)["big"])
    assert shown and set(shown.split("\n")[:-1]) == {"y"} and shown.endswith("y\n")
    assert truncated == size - len(shown.encode())
    assert len(shown) >= 8 * 1024 - len(b"y\n")


# ---------------------------------------------------------------- every command's process group dies with it


def test_a_background_child_is_killed_when_the_command_finishes(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    # The child lets go of the output pipe, so the command is done when sh exits; it must not outlive it.
    command = "(sleep 100 > /dev/null 2>&1 & echo $! > child.txt); echo started"
    got = run(chapter, provider, workdir, bash_calls(bg=command))
    child = int((workdir / "child.txt").read_text())
    try:
        assert got["bg"] == "started\n"
        assert wait_dead(child), "the command's background child is still running after the command finished"
    finally:
        kill_quietly(child)


STOP_SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT]


@pytest.mark.parametrize(
    "stop", [*STOP_SIGNALS, "\x1c"], ids=[*(signal.Signals(n).name for n in STOP_SIGNALS), "Ctrl-backslash typed"]
)
def test_a_stop_signal_mid_tool_kills_the_command_and_exits_130(
    provider: FakeProvider, workdir: Path, chapter: int | str, stop: int | str
) -> None:
    """Ctrl-C, kill (SIGTERM), a closed terminal (SIGHUP) and Ctrl-\\ (SIGQUIT, sent by kill or typed at
    the terminal, which sends it to its foreground group: the agent, never the command, which runs in a
    session of its own) all stop the agent the same way: the running command's whole process group is
    killed, exit 130; a session program has saved the completed rounds and says how to resume."""
    (workdir / "notes.txt").write_text("notes ✏️\n", encoding="utf-8")
    first = calls(("r1", "read_file", {"path": "notes.txt"}))
    provider.script(first, bash_calls(long="sleep 60 & echo $! > child.txt; echo $$ > shell.txt; wait"))
    with Live(chapter, TASK, provider=provider, cwd=workdir, answers=answers_for(chapter) or "") as live:
        result = live.stopped_mid_command(workdir, stop)
    assert result.stdout == ""
    lines = stderr_lines(result.stderr)
    if not since(chapter, 11):
        assert lines[-1] == "interrupted", result.stderr
        return
    session_id = new_session_id(result.stderr)
    assert lines[-1] == hint(session_id), result.stderr
    assert lines[-2].startswith("interrupted"), result.stderr
    stored = disk_messages(workdir / ".sessions" / f"{session_id}.jsonl")
    # Round 1 whole; from chapter 19 on, round 2's call too, saved before it ran, with no result;
    # from chapter 24 on (a turn stopped, not the process killed mid-way) with its result: killed.
    killed = since(chapter, 24)
    roles = ["system", "user", "assistant", "tool"] + ["assistant"] * calls_saved_first(chapter) + ["tool"] * killed
    assert [m["role"] for m in stored] == roles
    assert [c["id"] for c in stored[2]["tool_calls"]] == ["r1"]
    assert stored[3] == {"role": "tool", "tool_call_id": "r1", "content": "notes ✏️\n"}
    if killed:
        assert stored[5]["content"].startswith("error: interrupted by the user; the command was killed"), stored[5]
