"""Background tasks in production (agent.py): what chapter 28 leaves to the production layer.

The chapter's behaviour (the modes, the gate, the notices, the terminal tools, the limit
of 8, every way out) is tested in test_ex28.py, on agent.py too. Here is what agent.py
promises beyond it:

- a resume reads back from the last compaction (see test_sessions_crash.py), so every
  compaction carries the task records still in force: each task's last record while it
  runs, and the one with the highest id; and a note no user message took yet. A resume
  after a kill -9 names the task the compaction carried as running, and numbers on after
  the highest id; the task records the walk back passes are no damage. Behind a
  compaction that carries nothing (a chapter's program wrote it), the task records are
  looked for;
- -list counts task and note records as a conversation's state, not as damage; a torn
  task record at the end of the file is cut off like any torn line;
- at an idle prompt, where readline waits for a key, a notice starts its turn at once
  (the nudge a wake-up uses), and a line typed half-way waits at the next prompt;
- a task's status lines never tear an answer being streamed: they wait for its line's end;
- a task, and a command, starts with no signal blocked, though the thread that starts it
  blocks the stop signals: terminal_kill's SIGTERM reaches what a task exec's;
- a task killed by a signal Python has no name for (a real-time one) still ends, and says
  which: its watcher does not fail;
- what a task printed reaches the model and the file without the API key: its notice, and
  its output saved when the agent ends.

agent.py runs as a subprocess against the fake provider, at a pseudo-terminal where a
person is needed; the tests read what the terminal shows, what the provider received,
and what is on disk.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from processes import pids
from resident import Resident
from test_ex28 import FINISHED, QUIET, bg, notices, task_line  # the chapter's helpers, not repeated here

from conftest import TEST_KEY, run_agent
from fake_provider import FakeProvider, text
from helpers import (
    EARLIER,
    QUESTION,
    SESSION_ID,
    SUMMARY_TEXT,
    Live,
    calls,
    crossing_window,
    file_records,
    header_line,
    kill_quietly,
    message_line,
    put_session,
    results,
    session_bytes,
    summary_message,
    wait_until,
)

KEY_GONE = "[OPENAI_API_KEY removed]"
CROSSING_WINDOW, CROSSING_TOKENS = crossing_window("final")  # EARLIER's session and a round counted past 75%
WINDOW = {"CONTEXT_WINDOW": str(CROSSING_WINDOW)}


def lost_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "did not survive" in line]


# ---------------------------------------------------------------- across a compaction


def test_a_compaction_carries_the_tasks_and_a_resume_after_a_kill_numbers_on_and_names_the_lost_one(
    provider: FakeProvider, workdir: Path
) -> None:
    path = put_session(workdir, session_bytes(*EARLIER))
    provider.script(
        calls(bg("one", "echo $$ > one.pid; exec cat", "interactive"), bg("two", "exec cat", "interactive")),
        calls(("kill", "terminal_kill", {"id": "bg_2"}), prompt_tokens=CROSSING_TOKENS),  # the next request crosses 75%
        text(SUMMARY_TEXT),  # the compaction's summary
        text("Never shown.", pause_after=0),  # held: the agent is killed while it waits
    )
    one = None
    try:
        resume = ("-c", SESSION_ID, QUESTION["content"])
        with Live("final", *resume, provider=provider, cwd=workdir, answers="y\ny\n", **WINDOW) as run:
            (one,) = pids(workdir, "one.pid")
            wait_until(provider.paused.is_set, "the request after the compaction")
            run.kill()
            run.finish()
        records = file_records(path)
        (compaction,) = [record for record in records if record["type"] == "compaction"]
        carried = [(record["id"], record["status"]) for record in compaction["carried"] if record["type"] == "task"]
        assert carried == [("bg_1", "running"), ("bg_2", "killed by SIGTERM")]  # in force: running; the highest
        assert not [record for record in records[records.index(compaction) :] if record["type"] == "task"]
    finally:
        kill_quietly(one)
        provider.release()

    provider.script(calls(bg("again", "cat", "interactive")), text("Started again."))
    result = run_agent("final", "-c", SESSION_ID, "Are they still up?", provider=provider, cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert lost_lines(result.stderr) == [
        "[background tasks that did not survive the last run: bg_1 `echo $$ > one.pid; exec cat` (bg_1: never "
        "stopped, that run was killed; it may still be running); the model is told with the next message]"
    ]
    assert "damaged" not in result.stderr  # the task records the walk back passed are state, not damage
    first = provider.chat_requests[-2]["messages"]
    assert first[1] == summary_message(SUMMARY_TEXT)  # read back from the compaction
    assert first[-1]["content"].startswith("<system-reminder>These background tasks did not survive the end of")
    assert first[-1]["content"].endswith("</system-reminder>\n\nAre they still up?")
    assert results(provider)["again"].startswith("backgrounded: id=bg_3, mode interactive.")


def test_behind_a_compaction_that_carries_nothing_the_task_records_are_looked_for(
    provider: FakeProvider, workdir: Path
) -> None:
    put_session(
        workdir,
        header_line()
        + message_line({"role": "system", "content": "You are a coding agent."})
        + message_line({"role": "user", "content": "Build and serve."})
        + task_line("bg_1", "make", "running")
        + task_line("bg_2", "serve", "running")
        + task_line("bg_1", "make", "exited: 0")
        + message_line({"role": "assistant", "content": "Both started."})
        + message_line({"role": "user", "content": "Anything new?"})
        + message_line({"role": "assistant", "content": "No."})
        + json.dumps({"type": "compaction", "summary": "Started make and serve.", "kept": 2}).encode()  # as ex28's
        + b"\n",
    )
    provider.script(calls(bg("again", "cat", "interactive")), text("Started again."))
    result = run_agent("final", "-c", SESSION_ID, "Is serve up?", provider=provider, cwd=workdir)
    assert result.returncode == 0, result.stderr
    lost = lost_lines(result.stderr)
    assert len(lost) == 1 and lost[0].startswith(
        "[background tasks that did not survive the last run: bg_2 `serve` ("
    ), lost
    assert provider.chat_requests[0]["messages"][1] == summary_message("Started make and serve.")
    assert results(provider)["again"].startswith("backgrounded: id=bg_3,")


def test_a_compaction_carries_a_note_no_user_message_took_yet(loaded: ModuleType) -> None:
    note = "<system-reminder>A notice.</system-reminder>\n\n"
    system, question, answer = (
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "A"},
    )
    session = loaded.create_session([system, question, answer])
    session.note = note  # a notice a Ctrl-C left for the next line, say
    session.compact("Summary.", 2)
    os.close(session.fd)  # its lock: the file is opened again
    compaction = json.loads(session.path.read_bytes().splitlines()[-1])
    assert compaction["carried"] == [{"type": "note", "text": note}]
    again = loaded.open_session(session.id)
    assert again.note == note and again.history == [system, summary_message("Summary."), question, answer]
    again.add("Next.")
    again.save()
    os.close(again.fd)
    assert loaded.open_session(session.id).note == ""  # taken by the user message after it


# ---------------------------------------------------------------- -list and a torn record


def test_list_counts_task_and_note_records_as_state_not_damage(provider: FakeProvider, workdir: Path) -> None:
    reordered = json.dumps({"id": "bg_2", "type": "task", "command": "make", "mode": "async", "status": "exited: 0"})
    put_session(
        workdir,
        header_line()
        + message_line({"role": "system", "content": "You are a coding agent."})
        + message_line({"role": "user", "content": "Build it."})
        + task_line("bg_1", "make", "running")
        + task_line("bg_1", "make", "exited: 0")
        + reordered.encode()  # another spelling: the loader reads it, and so must -list
        + b"\n"
        + message_line({"role": "assistant", "content": "Built."})
        + json.dumps({"type": "note", "text": "<system-reminder>A notice.</system-reminder>\n\n"}).encode()
        + b"\n",
    )
    listed = run_agent("final", "-list", provider=None, cwd=workdir)
    assert listed.returncode == 0, listed.stderr
    (line,) = listed.stdout.splitlines()
    assert "  3 messages  Build it." in line and "[" not in line, line  # no mark at all: no damage

    provider.script(text("Noted."))
    result = run_agent("final", "-c", SESSION_ID, "And?", provider=provider, cwd=workdir)
    assert result.returncode == 0 and "damaged" not in result.stderr, result.stderr
    sent = provider.chat_requests[0]["messages"][-1]["content"]
    assert sent == "<system-reminder>A notice.</system-reminder>\n\nAnd?"


def test_a_torn_task_record_is_cut_off_like_any_torn_line(provider: FakeProvider, workdir: Path) -> None:
    torn = task_line("bg_2", "make test", "running")[:30]  # a kill during the write
    path = put_session(
        workdir,
        header_line()
        + message_line({"role": "system", "content": "You are a coding agent."})
        + message_line({"role": "user", "content": "Build it."})
        + task_line("bg_1", "make", "running")
        + task_line("bg_1", "make", "exited: 0")
        + message_line({"role": "assistant", "content": "Built."})
        + torn,
    )
    listed = run_agent("final", "-list", provider=None, cwd=workdir)
    assert listed.stdout.rstrip().endswith("[torn tail]"), listed.stdout

    provider.script(calls(bg("again", "cat", "interactive")), text("Started."))
    result = run_agent("final", "-c", SESSION_ID, "Test it.", provider=provider, cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert f"warning: dropped an incomplete last line ({len(torn)} bytes) left by an interrupted write" in result.stderr
    assert "damaged" not in result.stderr and not lost_lines(result.stderr)
    assert results(provider)["again"].startswith("backgrounded: id=bg_2,")  # the torn one never was
    tasks = [(record["id"], record["status"]) for record in file_records(path) if record["type"] == "task"]
    assert tasks == [("bg_1", "running"), ("bg_1", "exited: 0"), ("bg_2", "running"), ("bg_2", "killed by SIGTERM")]


# ---------------------------------------------------------------- at the terminal


def test_a_notice_at_an_idle_readline_prompt_starts_its_turn_at_once_and_a_half_typed_line_waits(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident]
) -> None:
    provider.script(
        calls(bg("b", "while [ ! -e go ]; do sleep 0.1; done; echo built")),
        text("It builds."),
        text("Built."),
        text("The log is clean."),
    )
    terminal = resident("final", provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line("Build it in the background.")
    terminal.wait_for("allow? (y/N) ")
    terminal.line("y")
    terminal.wait_for("It builds.")
    terminal.wait_prompt(2)
    terminal.type("and then check the lo")  # no Enter: readline holds it
    terminal.wait_for("> and then check the lo")
    (workdir / "go").touch()  # the task ends now, while the prompt waits for a key
    terminal.wait_for("[background task bg_1 finished; starting a new turn]")  # no key pressed
    terminal.wait_for("Built.")
    terminal.wait_prompt(3)
    terminal.wait_for("> and then check the lo", 2)  # at the next prompt, as typed
    terminal.line("g")
    terminal.wait_for("The log is clean.")
    assert provider.chat_requests[2]["messages"][-1]["content"].startswith(f"<system-reminder>{FINISHED} bg_1 ")
    assert provider.chat_requests[3]["messages"][-1] == {"role": "user", "content": "and then check the log"}
    terminal.line("/exit")
    assert terminal.wait_exit() == 0, terminal.text


def test_a_task_s_status_line_waits_for_the_end_of_the_answer_s_line(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident]
) -> None:
    answer = "The task runs. I will tell you when it ends."
    provider.script(
        calls(bg("b", "while [ ! -e go ]; do sleep 0.1; done; echo ok")),
        text(answer, pieces=2, pause_after=2),  # held after its first half
        text("It ended: ok."),
    )
    terminal = resident("final", provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line("Start it.")
    terminal.wait_for("allow? (y/N) ")
    terminal.line("y")
    terminal.wait_for(answer[:22])
    wait_until(provider.paused.is_set, "the answer held half-way")
    (workdir / "go").touch()
    sessions = workdir / ".sessions"
    wait_until(lambda: any("exited: 0" in p.read_text() for p in sessions.glob("*.jsonl")), "bg_1's end record")
    with pytest.raises(TimeoutError):  # the notice is in the queue: its line waits for the answer's
        terminal.wait_for("[background task bg_1 finished", timeout=QUIET)
    provider.release()
    terminal.wait_for("It ended: ok.")
    shown = terminal.text
    assert answer in shown, shown  # whole, on its line
    assert shown.index(answer) < shown.index("[background task bg_1 finished; it goes in as a steer]")
    terminal.line("/exit")
    assert terminal.wait_exit() == 0, terminal.text


# ---------------------------------------------------------------- what a task can do


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the signal mask from /proc")
def test_a_command_and_a_task_start_with_no_signal_blocked(provider: FakeProvider, workdir: Path) -> None:
    provider.script(
        calls(("mask", "bash", {"command": "exec grep SigBlk /proc/self/status"})),
        calls(bg("server", "exec sleep 300", "interactive")),  # a server, exec'ed as they often are
        calls(("kill", "terminal_kill", {"id": "bg_1"})),
        text("Both clear."),
    )
    result = run_agent("final", "Look at the masks.", provider=provider, cwd=workdir, answers="y\ny\n")
    assert result.returncode == 0, result.stderr
    found = results(provider)
    assert found["mask"] == "SigBlk:\t0000000000000000\n"  # exec'ed by sh, which keeps what it was given
    assert found["kill"].startswith("stopped bg_1: killed by SIGTERM\n"), found["kill"]  # not the SIGKILL 2 s later


def test_a_task_killed_by_a_signal_without_a_name_still_ends_and_says_which(
    provider: FakeProvider, workdir: Path
) -> None:
    number = signal.SIGRTMIN + 6  # a real-time signal: signal.Signals has no member for it
    provider.script(calls(bg("b", f"kill -{number} $$")), calls(("p", "bash", {"command": "pwd"}), pause_after=0))
    provider.script(text("It was killed."))
    with Live("final", "Kill it.", provider=provider, cwd=workdir, answers="y\n") as run:
        try:
            run.wait_stderr("[background task bg_1 finished; it goes in as a steer]")
        finally:
            provider.release()
        result = run.completed()
    assert result.returncode == 0, result.stderr
    (notice,) = notices(provider)
    assert notice.startswith(f"<system-reminder>{FINISHED} bg_1 `kill -{number} $$` killed by signal {number}\n")


def test_what_a_task_printed_reaches_the_model_and_the_file_without_the_key(
    provider: FakeProvider, workdir: Path
) -> None:
    (workdir / "key.txt").write_text(f"the key is {TEST_KEY}\n")  # cat key.txt asks nothing: it stays inside
    provider.script(
        calls(bg("a", "cat key.txt"), bg("b", "cat key.txt; exec sleep 300", "interactive")),
        calls(("p", "bash", {"command": "pwd"}), pause_after=0),  # held until bg_1's notice is in
        text("Done."),
    )
    with Live("final", "Show the key file.", provider=provider, cwd=workdir, answers="y\n") as run:
        try:
            run.wait_stderr("[background task bg_1 finished; it goes in as a steer]")
        finally:
            provider.release()
        result = run.completed()
    assert result.returncode == 0, result.stderr
    (notice,) = notices(provider)
    assert f"\nthe key is {KEY_GONE}\n" in notice
    assert not [body for body in provider.requests if TEST_KEY in body["raw"].decode()]
    (path,) = (workdir / ".sessions").glob("*.jsonl")
    assert TEST_KEY.encode() not in path.read_bytes()
    ended = [record for record in file_records(path) if record["type"] == "task" and record.get("stopped_at_exit")]
    assert [record["output"] for record in ended] == [f"the key is {KEY_GONE}\n"]
