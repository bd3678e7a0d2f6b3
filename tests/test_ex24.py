"""Chapter 24: the resident conversation (exercises/ex24/agent.py).

Without a task (or with -c ID and no task) the agent stays: it shows the prompt `\\n> ` on
stderr, runs a turn for each line typed, and ends at /exit, /quit or end of input (Ctrl-D)
with the resume hint, status 0. With a task it is one-shot, as before.

Ctrl-C during a turn stops the turn, not the agent: the request is cut, a running command's
process group killed, a pending question refused, the batch's other calls answered
"error: not run: interrupted by the user"; the history is healed with an assistant note,
`[this turn did not finish: interrupted by the user]`, so that the next request has no two
user messages in a row and no unanswered call; it is saved, `[turn interrupted; the
conversation is kept]` is shown, and the prompt comes back. An error (HTTP 500) ends the
turn the same way, its note naming the error. Ctrl-C at the prompt ends the agent (130,
`interrupted`, the hint), and so does a second Ctrl-C while the first one's stop has not
finished. SIGTERM, SIGHUP and SIGQUIT end it (130, the hint) after stopping the turn: a
command's process group is killed. An MCP server, in a session of its own, lives through a
Ctrl-C, and its late answer is not taken for the next call's.

Each program runs at a pseudo-terminal of its own (tests/resident.py): its stdin, stdout,
stderr and controlling terminal, so Ctrl-C typed there is the terminal's SIGINT and a
question is answered by what is typed after it. What is checked is what the terminal shows,
what reaches the fake provider, what is on disk, and which processes are still alive, by pid.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from resident import Resident

from conftest import run_agent, wait_for_file
from fake_provider import FakeProvider, Reply, error, sequence_error, text
from helpers import (
    SESSION_ID,
    alive,
    assert_ok,
    bash_calls,
    calls,
    conversation,
    disk_messages,
    hint,
    kill_quietly,
    new_session_id,
    put_session,
    resumed,
    session_bytes,
    shape,
    wait_dead,
    wait_until,
)

PROGRAMS = [24, 25, 26, 27, 30, "final"]  # 30: the last chapter keeps them all
each = pytest.mark.parametrize("chapter", PROGRAMS)

QUESTION = "allow? (y/N) "
STOPPED_NOTE = "[this turn did not finish: interrupted by the user]"
KEPT = "[turn interrupted; the conversation is kept]"
NOT_RUN = "error: not run: interrupted by the user"
KILLED = "error: interrupted by the user; the command was killed"
CHILD_INTERRUPTED = "error: interrupted: the user stopped the run before this subagent finished"
SLOW = 10  # seconds the fake provider waits before a delayed reply's first byte
QUICK = 5  # the bound for "at once": generous for a loaded CI machine, well within SLOW
HOSTILE = Path(__file__).with_name("hostile_mcp.py")


# ---------------------------------------------------------------- helpers


def session_path(workdir: Path, shown: str) -> Path:
    return workdir / ".sessions" / f"{new_session_id(shown)}.jsonl"


def stored(chapter: int | str, path: Path) -> list[dict]:
    """The session's messages on disk, read independently of the agent, without the system prompt."""
    return conversation(chapter, disk_messages(path))


def sent(chapter: int | str, body: dict) -> list[dict]:
    """A request's messages without the system prompt; checked valid for the provider, and without
    two user messages in a row."""
    messages = body["messages"]
    assert sequence_error(messages) is None, (sequence_error(messages), messages)
    messages = conversation(chapter, messages)
    roles = [m["role"] for m in messages]
    assert ("user", "user") not in zip(roles, roles[1:], strict=False), roles
    return messages


def tool_results(messages: list[dict]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}


def ctrl_c(terminal: Resident, prompts: int) -> float:
    """Type Ctrl-C during a turn; seconds until the prompt is shown for the `prompts`-th time."""
    typed = time.monotonic()
    terminal.type("\x03")
    return terminal.wait_prompt(prompts, timeout=30) - typed


def after_last_prompt(terminal: Resident) -> str:
    return terminal.text.rsplit("\n> ", 1)[-1]


def between_prompts(terminal: Resident, prompts: int) -> str:
    """What the terminal showed between the (prompts-1)-th prompt and the prompts-th."""
    return terminal.text.split("\n> ")[prompts - 1]


def stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name: state, ppid, pgrp, ...; None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def group_members(pgid: int) -> list[int]:
    """Live processes (not zombies) of process group pgid."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := stat_fields(int(entry.name))) and fields[0] != "Z":
            if int(fields[2]) == pgid:
                found.append(int(entry.name))
    return found


def find_process(argv: list[str], cwd: Path, timeout: float = 30) -> int:
    """The pid of the live process running exactly argv in directory cwd, once there is one."""
    wanted = [arg.encode() for arg in argv]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if (entry / "cmdline").read_bytes().split(b"\0")[:-1] == wanted and os.readlink(entry / "cwd") == str(
                    cwd.resolve()
                ):
                    if alive(int(entry.name)):
                        return int(entry.name)
            except OSError:
                continue  # gone meanwhile, or not ours to look at
        time.sleep(0.02)
    raise TimeoutError(f"no process runs {argv} in {cwd}")


def server_side_states(port: int) -> dict[int, str]:
    """The fake provider's end of each TCP connection to it, by the client's port: the kernel's
    state number in hex ("01" established, "08" close-wait: the client has closed its side)."""
    states = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, remote, state = line.split()[1:4]
        if int(local.rsplit(":", 1)[1], 16) == port and int(remote.rsplit(":", 1)[1], 16) != 0:
            states[int(remote.rsplit(":", 1)[1], 16)] = state
    return states


# ---------------------------------------------------------------- the conversation


@each
def test_three_lines_in_one_process_each_request_carries_the_earlier_exchange(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    provider.script(text("Paris."), text("About 2.1 million."), text("The Seine."))
    lines = ["What is the capital of France?", "How many people live there?", "Which river runs through it?"]
    terminal = resident(chapter, provider=provider, cwd=workdir)
    for number, line in enumerate(lines, 1):
        terminal.wait_prompt(number)
        terminal.line(line)
        terminal.wait_for(["Paris.", "About 2.1 million.", "The Seine."][number - 1])
    terminal.wait_prompt(4)
    assert terminal.process.poll() is None  # still there after three turns
    terminal.line("/exit")
    assert terminal.wait_exit() == 0, terminal.text
    session_id = new_session_id(terminal.text)
    assert terminal.text.endswith(hint(session_id) + "\n"), terminal.text
    assert "Traceback" not in terminal.text

    u1, u2, u3 = ({"role": "user", "content": line} for line in lines)
    a1, a2, a3 = ({"role": "assistant", "content": answer} for answer in ("Paris.", "About 2.1 million.", "The Seine."))
    requests = provider.chat_requests
    assert len(requests) == 3
    assert [sent(chapter, body) for body in requests] == [[u1], [u1, a1, u2], [u1, a1, u2, a2, u3]]
    assert len({body["messages"][0]["content"] for body in requests}) == 1  # one system prompt, the same each time
    assert stored(chapter, session_path(workdir, terminal.text)) == [u1, a1, u2, a2, u3, a3]


@each
@pytest.mark.parametrize("ending", ["/quit", "\x04"], ids=["quit", "ctrl_d"])
def test_quit_and_end_of_input_end_the_conversation_with_the_hint_and_status_0(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str, ending: str
) -> None:
    provider.script(text("Hello."))
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line("Hi")
    terminal.wait_prompt(2)
    if ending == "\x04":
        terminal.type(ending)
    else:
        terminal.line(ending)
    assert terminal.wait_exit() == 0, terminal.text
    assert terminal.text.endswith(hint(new_session_id(terminal.text)) + "\n"), terminal.text
    assert len(provider.chat_requests) == 1  # the ending is no turn
    assert stored(chapter, session_path(workdir, terminal.text)) == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
    ]


@each
def test_ctrl_d_at_the_first_prompt_ends_with_the_hint_and_status_0(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.type("\x04")
    assert terminal.wait_exit() == 0, terminal.text
    assert after_last_prompt(terminal).endswith(hint(new_session_id(terminal.text)) + "\n"), terminal.text
    assert provider.chat_requests == []


@each
def test_ctrl_c_at_the_prompt_ends_the_agent_with_130_and_the_hint(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    provider.script(text("Hello."))
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line("Hi")
    terminal.wait_prompt(2)
    assert terminal.interrupt_to_exit() == 130, terminal.text
    tail = after_last_prompt(terminal)
    assert "interrupted" in tail and tail.endswith(hint(new_session_id(terminal.text)) + "\n"), tail
    assert "Traceback" not in terminal.text
    assert len(provider.chat_requests) == 1
    assert stored(chapter, session_path(workdir, terminal.text))[-1] == {"role": "assistant", "content": "Hello."}


@each
def test_a_task_stays_one_shot_and_reads_no_line(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    provider.script(text("Four."), text("never asked for"))
    result = run_agent(chapter, "What is 2 + 2?", provider=provider, cwd=workdir, stdin="And 3 + 3?\n/exit\n")
    assert_ok(result, "Four.\n")
    assert len(provider.chat_requests) == 1  # the line on stdin is no second turn
    assert "\n> " not in result.stderr, result.stderr
    assert result.stderr.endswith(hint(new_session_id(result.stderr)) + "\n"), result.stderr


@each
def test_a_one_shot_task_that_fails_exits_1_with_the_error_and_the_hint(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    provider.script(error(500))
    result = run_agent(chapter, "What is 2 + 2?", provider=provider, cwd=workdir, stdin="And 3 + 3?\n")
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and result.stdout == "", result
    shown = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(shown) == 1 and "500" in shown[0], result.stderr
    assert result.stderr.endswith(hint(new_session_id(result.stderr)) + "\n"), result.stderr
    assert len(provider.chat_requests) == 1
    messages = stored(chapter, session_path(workdir, result.stderr))
    assert messages[0] == {"role": "user", "content": "What is 2 + 2?"}
    if chapter == "final":  # its one-shot file is as before: a resume repairs the history in memory
        assert len(messages) == 1, messages
    else:
        note = messages[1]
        assert note["role"] == "assistant" and note["content"].startswith("[this turn did not finish: "), note


@each
def test_c_id_without_a_task_resumes_the_session_as_a_conversation(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    earlier = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Remember the number 417."},
        {"role": "assistant", "content": "I will remember 417."},
    ]
    path = put_session(workdir, session_bytes(*earlier))
    provider.script(text("It was 417."))
    terminal = resident(chapter, "-c", SESSION_ID, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    assert resumed(terminal.text) == (SESSION_ID, 3), terminal.text
    terminal.line("Which number was it?")
    terminal.wait_prompt(2)
    question = {"role": "user", "content": "Which number was it?"}
    (body,) = provider.chat_requests
    assert [shape(m) for m in body["messages"]] == [shape(m) for m in [*earlier, question]]
    terminal.line("/exit")
    assert terminal.wait_exit() == 0, terminal.text
    assert terminal.text.endswith(hint(SESSION_ID) + "\n"), terminal.text
    assert disk_messages(path) == [*earlier, question, {"role": "assistant", "content": "It was 417."}]


# ---------------------------------------------------------------- Ctrl-C during a turn


@each
def test_ctrl_c_while_the_server_has_not_answered_brings_the_prompt_back_and_heals_the_history(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    provider.script(text("too late", delay=SLOW), text("Here now."))
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line("Take your time.")
    provider.wait_requests(1)
    assert ctrl_c(terminal, 2) < QUICK, terminal.text
    assert KEPT in terminal.text, terminal.text
    assert terminal.process.poll() is None
    path = session_path(workdir, terminal.text)
    first = [{"role": "user", "content": "Take your time."}, {"role": "assistant", "content": STOPPED_NOTE}]
    assert stored(chapter, path) == first  # healed and saved before the prompt came back

    terminal.line("Are you there?")
    terminal.wait_for("Here now.")
    terminal.wait_prompt(3)
    again = {"role": "user", "content": "Are you there?"}
    assert sent(chapter, provider.chat_requests[1]) == [*first, again]
    assert stored(chapter, path) == [*first, again, {"role": "assistant", "content": "Here now."}]
    assert "too late" not in terminal.text


@each
def test_ctrl_c_before_the_reply_starts_closes_the_request_and_sends_it_no_more(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    provider.script(Reply(hold=True), text("Here now."))  # the first never answers, not even its headers
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line("Take your time.")
    provider.wait_requests(1)
    terminal.type("\x03")
    provider.wait_hangups(1, timeout=QUICK)  # the agent closed the request the server had not answered
    terminal.wait_prompt(2)
    assert KEPT in terminal.text, terminal.text
    # The SDK tries a broken connection again by itself: a stopped request must not be sent again.
    with provider.received:
        provider.received.wait_for(lambda: len(provider.requests) > 1, 2)
    assert len(provider.requests) == 1, provider.chat_requests[1:]

    terminal.line("Are you there?")
    terminal.wait_for("Here now.")
    terminal.wait_prompt(3)
    assert len(provider.requests) == 2
    assert sent(chapter, provider.chat_requests[1])[-1] == {"role": "user", "content": "Are you there?"}


@each
def test_ctrl_c_mid_stream_closes_the_connection_and_keeps_no_half_answer(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    half = Reply(content="The first half of the answer, and then the second half.", pieces=6, pause_after=3)
    provider.script(half, text("Whole this time."))
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line("Explain it.")
    provider.wait_paused()
    (client_port,) = [port for port, state in server_side_states(provider.port).items() if state == "01"]
    assert ctrl_c(terminal, 2) < QUICK, terminal.text
    # The agent closed its side of the request: the provider's end waits in CLOSE_WAIT.
    wait_until(lambda: server_side_states(provider.port).get(client_port) != "01", "the request closed", timeout=QUICK)
    assert server_side_states(provider.port).get(client_port) in ("08", None)
    path = session_path(workdir, terminal.text)
    assert stored(chapter, path) == [
        {"role": "user", "content": "Explain it."},
        {"role": "assistant", "content": STOPPED_NOTE},
    ]
    provider.release()
    terminal.line("Again, please.")
    terminal.wait_for("Whole this time.")
    terminal.wait_prompt(3)
    assert sent(chapter, provider.chat_requests[1])[-2:] == [
        {"role": "assistant", "content": STOPPED_NOTE},
        {"role": "user", "content": "Again, please."},
    ]


@each
def test_ctrl_c_during_a_command_kills_its_process_group_and_the_next_turn_has_the_result(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    os.mkfifo(workdir / "block.fifo")  # nobody writes it: cat waits for ever
    provider.script(bash_calls(c="cat block.fifo"), text("Stopped, as you asked."))
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line("Read the pipe.")
    cat = find_process(["cat", "block.fifo"], workdir)
    group = os.getpgid(cat)
    try:
        assert group != os.getpgid(terminal.process.pid)  # a group of its own, not the agent's
        assert QUESTION not in terminal.text  # `cat FILE` needs no question
        assert ctrl_c(terminal, 2) < QUICK, terminal.text
        assert wait_dead(cat), "the command outlived the Ctrl-C"
        assert group_members(group) == []
    finally:
        kill_quietly(cat)
    assert KEPT in terminal.text
    path = session_path(workdir, terminal.text)
    messages = stored(chapter, path)
    assert tool_results(messages)["c"].startswith(KILLED), messages
    assert messages[-1] == {"role": "assistant", "content": STOPPED_NOTE}

    terminal.line("Never mind.")
    terminal.wait_for("Stopped, as you asked.")
    terminal.wait_prompt(3)
    request = sent(chapter, provider.chat_requests[1])
    assert tool_results(request)["c"].startswith(KILLED)
    assert request[-2:] == [{"role": "assistant", "content": STOPPED_NOTE}, {"role": "user", "content": "Never mind."}]


@each
def test_ctrl_c_during_an_approved_command_kills_its_background_child_too(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    os.mkfifo(workdir / "block.fifo")
    command = "sleep 300 & echo $$ $! > pids; cat block.fifo"
    provider.script(bash_calls(c=command))
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line("Start it.")
    terminal.wait_for(QUESTION)
    terminal.line("y")
    shell = child = None
    try:
        shell, child = map(int, wait_for_file(workdir / "pids").split())
        assert ctrl_c(terminal, 2) < QUICK, terminal.text
        assert wait_dead(shell) and wait_dead(child), "the command or its background child outlived the Ctrl-C"
    finally:
        kill_quietly(shell)
        kill_quietly(child)
    messages = stored(chapter, session_path(workdir, terminal.text))
    assert tool_results(messages)["c"].startswith(KILLED), messages
    assert messages[-1] == {"role": "assistant", "content": STOPPED_NOTE}


@each
def test_ctrl_c_at_a_question_refuses_it_and_runs_nothing_more_of_the_batch(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    batch = calls(
        ("ask", "bash", {"command": "touch ran.txt && echo ran"}),
        ("write", "write_file", {"path": "made.txt", "content": "made\n"}),
        ("list", "bash", {"command": "ls"}),
    )
    provider.script(batch)
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line("Make the files.")
    terminal.wait_for(QUESTION)
    assert ctrl_c(terminal, 2) < QUICK, terminal.text
    assert not (workdir / "ran.txt").exists() and not (workdir / "made.txt").exists()
    assert KEPT in terminal.text
    path = session_path(workdir, terminal.text)
    messages = stored(chapter, path)
    answered = tool_results(messages)
    assert answered["ask"].startswith("error:") and "ran" not in answered["ask"], answered
    assert answered["write"] == NOT_RUN and answered["list"] == NOT_RUN, answered
    assert messages[-1] == {"role": "assistant", "content": STOPPED_NOTE}
    assert len(provider.chat_requests) == 1  # the stop ended the turn: no request with the results

    # The next turn asks again at the terminal: the stop is over, a question is a question again.
    provider.script(bash_calls(again="touch ran.txt && echo ran"), text("Done now."))
    terminal.line("Try once more.")
    terminal.wait_for(QUESTION, count=2)
    terminal.line("y")
    terminal.wait_for("Done now.")
    terminal.wait_prompt(3)
    assert (workdir / "ran.txt").exists()
    request = sent(chapter, provider.chat_requests[1])
    assert tool_results(request) == answered


@each
def test_ctrl_c_during_a_fan_out_interrupts_every_child_and_the_next_fan_out_runs(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    def sub(name: str) -> tuple[str, str, dict]:
        return (name, "sub_agent", {"description": name, "prompt": f"Look into project-{name} and report."})

    provider.route("project-a", text("a done", delay=SLOW))
    provider.route("project-b", text("b done", delay=SLOW))
    provider.route("project-c", text("c done"))
    provider.route("project-d", text("d done"))
    provider.script(calls(sub("a"), sub("b")), calls(sub("c"), sub("d")), text("All four looked at."))
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line("Two subagents, please.")
    provider.wait_requests(3)  # the parent's, then both children's
    assert ctrl_c(terminal, 2) < QUICK, terminal.text
    messages = stored(chapter, session_path(workdir, terminal.text))
    assert tool_results(messages) == {"a": CHILD_INTERRUPTED, "b": CHILD_INTERRUPTED}
    assert messages[-1] == {"role": "assistant", "content": STOPPED_NOTE}

    terminal.line("Now two more.")
    terminal.wait_for("All four looked at.")
    terminal.wait_prompt(3)
    assert tool_results(sent(chapter, provider.chat_requests[-1])) == {
        "a": CHILD_INTERRUPTED,
        "b": CHILD_INTERRUPTED,
        "c": "c done",
        "d": "d done",
    }


@each
def test_an_error_ends_the_turn_not_the_agent(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    provider.script(error(500), text("Working again."))
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line("First try.")
    terminal.wait_prompt(2)
    shown = [line for line in between_prompts(terminal, 2).splitlines() if line.startswith("error: ")]
    assert len(shown) == 1 and "500" in shown[0], terminal.text
    assert terminal.process.poll() is None
    path = session_path(workdir, terminal.text)
    user, note = stored(chapter, path)
    assert user == {"role": "user", "content": "First try."}
    assert note["role"] == "assistant" and not note.get("tool_calls"), note
    assert note["content"].startswith("[this turn did not finish: ") and "500" in note["content"], note

    terminal.line("Second try.")
    terminal.wait_for("Working again.")
    terminal.wait_prompt(3)
    assert sent(chapter, provider.chat_requests[1]) == [user, note, {"role": "user", "content": "Second try."}]
    assert stored(chapter, path)[-1] == {"role": "assistant", "content": "Working again."}


@each
def test_a_second_ctrl_c_while_the_first_stop_is_unfinished_ends_the_agent_at_once(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    """The stop is held up by a process that left the command's session and keeps its output
    open: the chapter waits for that output's end. The first Ctrl-C has been handled once the
    command's group is dead. (Should a program not wait for the output, the first Ctrl-C brings
    the prompt back and the second one lands there: it ends the agent just the same.)"""
    command = "setsid sleep 60 & escaped=$!; sleep 300 & echo $escaped $! > pids; wait"
    provider.script(bash_calls(c={"command": command, "timeout": 100}))
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line("Start a daemon.")
    terminal.wait_for(QUESTION)
    terminal.line("y")
    escaped = grouped = None
    try:
        escaped, grouped = map(int, wait_for_file(workdir / "pids").split())
        terminal.type("\x03")
        assert wait_dead(grouped, timeout=QUICK), "the first Ctrl-C did not kill the command's group"
        typed = time.monotonic()
        terminal.type("\x03")
        assert terminal.wait_exit(30) == 130, terminal.text
        assert time.monotonic() - typed < QUICK
    finally:
        kill_quietly(escaped)
        kill_quietly(grouped)
    session_id = new_session_id(terminal.text)
    tail = terminal.text.rsplit("^C", 1)[1]
    assert "interrupted" in tail and tail.endswith(hint(session_id) + "\n"), tail
    assert "Traceback" not in terminal.text

    # What was complete is on disk, and the session resumes.
    path = session_path(workdir, terminal.text)
    assert stored(chapter, path)[0] == {"role": "user", "content": "Start a daemon."}
    provider.script(text("Resumed."))
    result = run_agent(chapter, "-c", session_id, "Go on.", provider=provider, cwd=workdir)
    assert_ok(result, "Resumed.\n")
    request = provider.chat_requests[-1]["messages"]
    assert sequence_error(request) is None
    assert request[1] == {"role": "user", "content": "Start a daemon."} and request[-1]["content"] == "Go on."


# ---------------------------------------------------------------- signals that end the agent


@each
@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT], ids=["TERM", "HUP", "QUIT"])
def test_a_stop_signal_ends_the_agent_after_killing_the_command_s_group(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str, number: int
) -> None:
    provider.script(bash_calls(c="sleep 300 & echo $$ $! > pids; wait"))
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line("Run it in the background.")
    terminal.wait_for(QUESTION)
    terminal.line("y")
    shell = child = None
    try:
        shell, child = map(int, wait_for_file(workdir / "pids").split())
        os.kill(terminal.process.pid, number)  # the agent itself: the shim execs it
        assert terminal.wait_exit(30) == 130, terminal.text
        assert wait_dead(shell) and wait_dead(child), "the command or its background child outlived the agent"
    finally:
        kill_quietly(shell)
        kill_quietly(child)
    tail = after_last_prompt(terminal)
    assert "interrupted" in tail and tail.endswith(hint(new_session_id(terminal.text)) + "\n"), tail
    assert "Traceback" not in terminal.text
    assert len(provider.chat_requests) == 1


@each
def test_after_a_kill_9_during_a_turn_the_session_resumes_with_a_follow_up(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    provider.script(text("never seen", delay=SLOW), text("Picked up again."))
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line("A long question.")
    provider.wait_requests(1)
    os.kill(terminal.process.pid, signal.SIGKILL)
    assert terminal.wait_exit(30) == -signal.SIGKILL
    session_id = new_session_id(terminal.text)
    assert stored(chapter, session_path(workdir, terminal.text)) == [{"role": "user", "content": "A long question."}]

    result = run_agent(chapter, "-c", session_id, "The follow-up.", provider=provider, cwd=workdir)
    assert_ok(result, "Picked up again.\n")
    assert resumed(result.stderr)[0] == session_id
    request = provider.chat_requests[-1]["messages"]
    assert sequence_error(request) is None
    users = [m["content"] for m in request if m["role"] == "user"]
    assert users == ["A long question.", "The follow-up."]
    messages = stored(chapter, session_path(workdir, terminal.text))
    assert messages[0]["content"] == "A long question." and messages[-1] == {
        "role": "assistant",
        "content": "Picked up again.",
    }


# ---------------------------------------------------------------- MCP servers


@each
def test_an_mcp_server_lives_through_a_ctrl_c_and_its_late_answer_is_not_the_next_call_s(
    provider: FakeProvider, workdir: Path, tmp_path: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    """The hostile server's `slow` tool answers after 2 s; a Ctrl-C comes first. The next call,
    of `echo`, must get echo's answer, from the same server, which got no signal."""
    files = tmp_path / "mcp"
    files.mkdir()
    schema = {"type": "object", "properties": {}}
    tools = [
        {"name": name, "description": f"The {name} tool.", "inputSchema": schema, "annotations": {"readOnlyHint": True}}
        for name in ("slow", "echo")
    ]
    plan = {key: str(files / key) for key in ("pid", "log", "signals")} | {"tools": tools, "calls": {"slow": "late"}}
    (files / "plan.json").write_text(json.dumps(plan))
    config = {"mcpServers": {"h": {"command": sys.executable, "args": [str(HOSTILE), str(files / "plan.json")]}}}
    (workdir / ".mcp.json").write_text(json.dumps(config))
    provider.script(
        calls(("slow", "mcp__h__slow", {})),
        calls(("echo", "mcp__h__echo", {"n": 2})),
        text("The server still answers."),
    )
    terminal = resident(chapter, provider=provider, cwd=workdir)
    server = None
    try:
        terminal.wait_for(QUESTION)
        terminal.line("y")
        server = int(wait_for_file(files / "pid"))
        terminal.wait_prompt(1)
        terminal.line("Call the slow tool.")
        wait_until(lambda: "tools/call" in (files / "log").read_text(), "the call reached the server")
        assert ctrl_c(terminal, 2) < QUICK, terminal.text
        messages = stored(chapter, session_path(workdir, terminal.text))
        assert tool_results(messages)["slow"].startswith("error:") and "interrupted" in tool_results(messages)["slow"]
        assert messages[-1] == {"role": "assistant", "content": STOPPED_NOTE}
        assert alive(server)

        terminal.line("Call echo.")
        terminal.wait_for("The server still answers.")
        terminal.wait_prompt(3)
        assert tool_results(sent(chapter, provider.chat_requests[-1]))["echo"] == 'echo got {"n": 2}'
        assert alive(server) and int(wait_for_file(files / "pid")) == server  # the same server, never restarted
        assert (files / "signals").read_text() == ""  # no SIGINT reached it
        terminal.line("/exit")
        assert terminal.wait_exit() == 0, terminal.text
        assert wait_dead(server), "the server outlived the agent"
    finally:
        kill_quietly(server)
