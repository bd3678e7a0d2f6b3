"""Sessions through failures: API errors and broken streams at every point of a round,
Ctrl-C, two runs on one session, and a crash inside a tool batch.

Guarantees 5, 6 and 8 of the ten numbered in docs/sessions.md. The
real agent.py runs as a subprocess against the fake provider. Each failure is
followed by a `-c ID` run, so every step also proves that the previous failure
left a session that resumes with a history the provider accepts.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

from conftest import run_agent, wait_for_file
from fake_provider import FakeProvider, Reply, error, sequence_error, text, tool_call
from helpers import (
    SESSION_ID,
    Live,
    assert_sent,
    disk_messages,
    hint,
    kill_quietly,
    message_line,
    put_session,
    round_shapes,
    session_bytes,
    shape,
    stderr_lines,
    wait_dead,
)

# ---------------------------------------------------------------- helpers


def assert_failed(result: subprocess.CompletedProcess, session_id: str, needle: str) -> None:
    """Exit 1, one error line that says what happened, then the resume hint; no traceback."""
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = stderr_lines(result.stderr)
    assert lines[-1] == hint(session_id), result.stderr
    errors = [line for line in lines if line.startswith("error:")]
    assert errors == [lines[-2]], result.stderr
    assert needle in errors[0], (needle, result.stderr)


class Chain:
    """Runs on one session, one after another; each checks what it resumed from and what it left."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.id: str | None = None
        self.history: list[dict] = []  # the messages on disk after the last run

    @property
    def path(self) -> Path:
        return self.work / ".sessions" / f"{self.id}.jsonl"

    def args(self, task: str) -> tuple[str, ...]:
        return (task,) if self.id is None else ("-c", self.id, task)

    def check(self, task: str, stderr: str, requests: list[dict]) -> list[dict]:
        """After a run: it resumed what was on disk, sent it validly, and appended to it. Returns what it added."""
        assert "Traceback" not in stderr, stderr
        if self.id is None:
            match = re.search(r"\[new session (\S+)\]", stderr)
            assert match, stderr
            self.id = match.group(1)
            before = disk_messages(self.path)[:1]
            assert before[0]["role"] == "system"
        else:
            before = self.history
            assert f"[resumed session {self.id}, {len(before)} messages]" in stderr, stderr
        user = {"role": "user", "content": task}
        if requests:
            assert_sent(requests[0]["messages"], [*before, user])
            for request in requests:
                assert sequence_error(request["messages"]) is None
        after = disk_messages(self.path)
        assert after[: len(before)] == before, "history before this run was lost or changed"
        assert after[len(before)] == user, "the follow-up was not saved before the model was asked"
        self.history = after
        return after[len(before) + 1 :]

    def run(self, task: str, *replies: Reply) -> tuple[subprocess.CompletedProcess, list[dict], list[dict]]:
        with FakeProvider() as fp:
            fp.script(*replies)
            result = run_agent("final", *self.args(task), provider=fp, cwd=self.work)
            requests = fp.chat_requests
        return result, requests, self.check(task, result.stderr, requests)


def write_session(work: Path, messages: list[dict], tail: bytes = b"") -> Path:
    """A session file in the documented format, written by hand: header, one line per message."""
    return put_session(work, session_bytes(*messages) + tail)


# ---------------------------------------------------------------- API failures (guarantee 8)


def test_http_errors_before_the_first_token(workdir: Path) -> None:
    """401, 429 and 500 on round 1 — of a new session, then of two resumes — lose nothing."""
    chain = Chain(workdir)
    for status, needle in [(401, "HTTP 401"), (429, "HTTP 429"), (500, "HTTP 500")]:
        result, requests, added = chain.run(f"task after a {status}?", error(status))
        assert_failed(result, chain.id, needle)
        assert result.stdout == ""
        assert len(requests) == 1 and added == []
    result, requests, added = chain.run("once more", text("recovered ✅"))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "recovered ✅\n"
    assert [m["content"] for m in chain.history if m["role"] == "user"] == [
        "task after a 401?",
        "task after a 429?",
        "task after a 500?",
        "once more",
    ]
    assert added == [{"role": "assistant", "content": "recovered ✅"}]


def test_stream_failures_at_every_point_of_a_round(workdir: Path) -> None:
    (workdir / "notes.txt").write_text("笔记: buy milk 🥛\n", encoding="utf-8")
    chain = Chain(workdir)

    # Round 2 fails after round 1's tools ran: round 1's batch is on disk.
    read = tool_call("read_file", {"path": "notes.txt"}, call_id="call_b1")
    result, _, added = chain.run("read the notes", read, error(500))
    assert_failed(result, chain.id, "HTTP 500")
    assert [shape(m) for m in added] == round_shapes(read)
    assert added[1]["content"] == "笔记: buy milk 🥛\n"

    # A text stream cut halfway, the connection broken: the half answer is shown, not saved.
    answer = "half of an answer that never ends"
    result, _, added = chain.run("summarise", text(answer, pieces=6, cut_after=3))
    assert_failed(result, chain.id, "error:")
    assert result.stdout.strip() and answer.startswith(result.stdout.strip()) and result.stdout.strip() != answer
    assert added == []

    # Two tool rounds, then the final answer's stream ends cleanly but early: both batches saved.
    echo = tool_call("bash", {"command": "echo 你好"}, call_id="call_b3a")
    write = tool_call("write_file", {"path": "fresh.txt", "content": "新 🎉"}, call_id="call_b3b")
    final = text("the final answer, cut", pieces=4, cut_after=2, cut_mode="close")
    result, _, added = chain.run("echo and write", echo, write, final)
    assert_failed(result, chain.id, "stream ended")
    assert [shape(m) for m in added] == round_shapes(echo, write)
    assert added[1]["content"] == "你好\n"
    assert (workdir / "fresh.txt").read_text(encoding="utf-8") == "新 🎉"

    # A cut inside a tool call's arguments: the half call is neither run nor saved.
    half = tool_call("write_file", {"path": "never.txt", "content": "x" * 40}, call_id="call_b4", cut_after=3)
    result, _, added = chain.run("write never.txt", half)
    assert_failed(result, chain.id, "error:")
    assert "[round" not in result.stderr and not (workdir / "never.txt").exists()
    assert added == []

    # An error event mid-stream after a tool round.
    read_again = tool_call("read_file", {"path": "fresh.txt"}, call_id="call_b5")
    result, _, added = chain.run("read fresh.txt", read_again, text("interrupted answer", error_after=2))
    assert_failed(result, chain.id, "stream interrupted by the fake provider")
    assert [shape(m) for m in added] == round_shapes(read_again)

    # A stream that stops without a finish_reason: not an answer.
    result, _, added = chain.run("are you done?", Reply(content="no finish reason", finish=None))
    assert_failed(result, chain.id, "stream ended before the answer was finished")
    assert added == []

    result, requests, added = chain.run("all good?", text("all good ✅"))
    assert result.returncode == 0, result.stderr
    assert added == [{"role": "assistant", "content": "all good ✅"}]
    assert len([m for m in requests[0]["messages"] if m["role"] == "user"]) == 7


def test_connection_broken_after_the_finish_chunk_keeps_the_answer(workdir: Path) -> None:
    """The answer arrived whole — every piece, then finish_reason=stop — and was shown; then the
    connection broke off before `data: [DONE]`. That round is complete, so it must be on disk, as
    it is when the same connection closes cleanly instead (cut_mode="close")."""
    chain = Chain(workdir)
    answer = "the complete answer, 你好"
    # Events: role, two text pieces, the finish chunk; the cut comes after all four, before [DONE].
    result, _, added = chain.run("hello", text(answer, pieces=2, cut_after=4))
    assert result.stdout == answer + "\n"
    assert added == [{"role": "assistant", "content": answer}], (
        f"a complete answer was shown but not saved (exit {result.returncode}):\n{result.stderr}"
    )


# ---------------------------------------------------------------- Ctrl-C (guarantee 8)


def interrupted(code: int, err: str, session_id: str) -> None:
    assert code == 130, (code, err)
    assert "Traceback" not in err, err
    lines = stderr_lines(err)
    assert lines[-1] == hint(session_id), err
    assert lines[-2].startswith("interrupted"), err


def test_ctrl_c_mid_stream_and_mid_tool(workdir: Path) -> None:
    """Every wait here is bounded (Live waits at most 30 s for output and 30 s for the exit, then kills),
    so a run that never stops fails this test instead of stalling the suite."""
    (workdir / "notes.txt").write_text("notes ✏️\n", encoding="utf-8")
    chain = Chain(workdir)

    # Mid-stream, in round 2 after a complete tool round.
    read = tool_call("read_file", {"path": "notes.txt"}, call_id="call_c1")
    with FakeProvider() as fp:
        fp.script(read, text("a long answer about the notes", pieces=5, pause_after=3))
        with Live("final", *chain.args("read the notes"), provider=fp, cwd=workdir) as live:
            fp.wait_paused(timeout=30)
            live.wait_stdout("a long answe")  # the two pieces sent before the pause are on the screen
            live.signal(signal.SIGINT)
            code, out, err = live.finish(timeout=30)
        requests = fp.chat_requests
    added = chain.check("read the notes", err, requests)
    interrupted(code, err, chain.id)
    assert out.strip() and "a long answer about the notes".startswith(out.strip())
    assert [shape(m) for m in added] == round_shapes(read)

    # Mid-tool: waiting at the approval prompt.
    with FakeProvider() as fp:
        fp.script(tool_call("bash", {"command": "sleep 0 && echo 等待"}, call_id="call_c2"))
        with Live("final", *chain.args("run it"), provider=fp, cwd=workdir, answers="", hang_up=False) as live:
            live.terminal.wait_for("allow? (y/N)")
            live.signal(signal.SIGINT)
            code, out, err = live.finish(timeout=30)
        requests = fp.chat_requests
    # The call is on disk, saved before it could run, and its result: the stop answered the question no.
    assert [shape(m) for m in chain.check("run it", err, requests)] == [
        ("assistant", None, None, ("call_c2",)),
        ("tool", "<result>", "call_c2", ()),
    ]
    interrupted(code, err, chain.id)

    # Mid-tool: an approved command is running; Ctrl-C also stops the command.
    sleeper = None
    with FakeProvider() as fp:
        fp.script(tool_call("bash", {"command": "echo $$ > pid.txt && exec sleep 30"}, call_id="call_c3"))
        with Live("final", *chain.args("run the long one"), provider=fp, cwd=workdir, answers="y\n") as live:
            try:
                sleeper = int(wait_for_file(workdir / "pid.txt", timeout=30))
                live.signal(signal.SIGINT)
                code, out, err = live.finish(timeout=30)
                assert wait_dead(sleeper), "the running command survived Ctrl-C"
            finally:
                kill_quietly(sleeper)
        requests = fp.chat_requests
    assert [shape(m) for m in chain.check("run the long one", err, requests)] == [
        ("assistant", None, None, ("call_c3",)),
        ("tool", "<result>", "call_c3", ()),  # killed by the stop: "interrupted by the user"
    ]
    interrupted(code, err, chain.id)

    result, requests, added = chain.run("back?", text("back again"))
    assert result.returncode == 0, result.stderr
    assert added == [{"role": "assistant", "content": "back again"}]


# ---------------------------------------------------------------- one writer (guarantee 6)

ORIGINAL = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "My name is Xiaoming; remember it"},
    {"role": "assistant", "content": "Hello Xiaoming, 你好!"},
]


def test_a_second_run_on_a_session_in_use_stops_at_once(workdir: Path) -> None:
    path = write_session(workdir, ORIGINAL)
    with FakeProvider() as fp:
        fp.script(text("answer from A 你好", pieces=4, pause_after=2))
        run_a = Live("final", "-c", SESSION_ID, "follow-up from A", provider=fp, cwd=workdir)
        try:
            fp.wait_paused()  # A holds the session and is mid-stream
            held = path.read_bytes()
            for wanted in [SESSION_ID, "last", SESSION_ID[:17]]:
                started = time.monotonic()
                run_b = run_agent("final", "-c", wanted, "follow-up from B", provider=fp, cwd=workdir)
                elapsed = time.monotonic() - started
                context = f"-c {wanted}: {run_b.stderr}"
                assert run_b.returncode == 1, context
                assert elapsed < 5, context
                assert "Traceback" not in run_b.stderr and run_b.stdout == "", context
                lines = stderr_lines(run_b.stderr)
                assert len(lines) == 1 and lines[0].startswith("error:") and "in use" in lines[0], context
                assert SESSION_ID in lines[0], context
                assert len(fp.chat_requests) == 1, f"B reached the provider; {context}"
                assert path.read_bytes() == held, f"B changed the file; {context}"
        finally:
            fp.release()
        code, out, err = run_a.finish()
    assert code == 0, err
    assert out == "answer from A 你好\n"
    assert b"from B" not in path.read_bytes()
    assert disk_messages(path) == [
        *ORIGINAL,
        {"role": "user", "content": "follow-up from A"},
        {"role": "assistant", "content": "answer from A 你好"},
    ]


# ---------------------------------------------------------------- a crash inside a tool batch (guarantee 5)


def test_crash_inside_a_tool_batch_resumes_with_synthetic_results(workdir: Path) -> None:
    calls = [
        {"id": "call_t1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}},
        {"id": "call_t2", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'}},
        {"id": "call_t3", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "b.txt"}'}},
    ]
    stored = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "list, then read both files"},
        {"role": "assistant", "content": None, "reasoning_content": "先列出文件", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_t1", "content": "a.txt\nb.txt\n"},
    ]
    # The batch's write was cut short inside the second result: a hand-made crash.
    torn = message_line({"role": "tool", "tool_call_id": "call_t2", "content": "内容"})
    torn = torn[: len(torn) // 2]
    path = write_session(workdir, stored, tail=torn)
    complete = path.read_bytes()[: -len(torn)]

    with FakeProvider() as fp:
        fp.thinking = True  # DeepSeek thinking mode: the tool-call turn must carry its reasoning back
        fp.script(text("ok, reading again"))
        result = run_agent("final", "-c", SESSION_ID, "go on", provider=fp, cwd=workdir)
        requests = fp.chat_requests
    assert result.returncode == 0, result.stderr
    assert f"[resumed session {SESSION_ID}, 4 messages]" in result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning")]
    assert len(warnings) == 1 and "incomplete last line" in warnings[0], result.stderr

    sent = requests[0]["messages"]
    assert sequence_error(sent, thinking=True) is None
    assert sent[:4] == stored
    synthetic = sent[4:6]
    assert [m["tool_call_id"] for m in synthetic] == ["call_t2", "call_t3"]
    assert all(m["role"] == "tool" and m["content"].startswith("error:") for m in synthetic), synthetic
    assert sent[6:] == [{"role": "user", "content": "go on"}]

    # The repair happened in memory: the file keeps what it had, minus the torn bytes, plus the new run.
    data = path.read_bytes()
    assert data.startswith(complete)
    assert disk_messages(path) == [
        *stored,
        {"role": "user", "content": "go on"},
        {"role": "assistant", "content": "ok, reading again"},
    ]
