"""Sessions survive crashes: a cut at any byte (guarantee 3) and SIGKILL during a live run (guarantee 8).

The guarantees are the ten numbered in docs/sessions.md.

The session file under test is a real one: the finished agent.py writes it,
running against the fake provider (tool rounds, parallel calls, non-ASCII text,
a resume). The exhaustive check cuts a copy at every byte offset and drives the
program's own session functions in-process; a sample of the same cuts is then
resumed end to end. The kill tests SIGKILL the real program at chosen and at
random moments of a multi-round run and resume after every kill.
"""

from __future__ import annotations

import bisect
import contextlib
import io
import json
import os
import random
import re
import shutil
import signal
import tempfile
import time
from pathlib import Path
from types import ModuleType

import pytest

from conftest import load_program, run_agent, wait_for_file
from fake_provider import FakeProvider, Reply, sequence_error, text, tool_call, tool_calls
from helpers import Live, assert_batches_whole, assert_sent, complete_lines, disk_messages, new_session_id

TORN_WARNING = "warning: dropped an incomplete last line"
GREETING = "你好, world 🎉 — naïve café\n"


# ---------------------------------------------------------------- helpers


def load_agent(monkeypatch: pytest.MonkeyPatch, directory: Path) -> ModuleType:
    """The real agent.py as a module whose WORKDIR (and so .sessions) is `directory`."""
    module = load_program("final", directory, monkeypatch)
    assert module.SESSIONS == directory / ".sessions"
    return module


@pytest.fixture
def fast_dir(tmp_path: Path):
    """A directory on tmpfs when there is one: the exhaustive loop fsyncs thousands of times."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        directory = Path(tempfile.mkdtemp(prefix="agent-crash-", dir=shm))
        yield directory
        shutil.rmtree(directory, ignore_errors=True)
    else:
        yield tmp_path


# ---------------------------------------------------------------- a real multi-round session file


@pytest.fixture(scope="module")
def real_session(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, bytes]:
    """(id, bytes) of a session the real agent wrote: two runs, six rounds, parallel calls, non-ASCII."""
    work = tmp_path_factory.mktemp("real") / "work"
    work.mkdir()
    (work / "greet.txt").write_text(GREETING, encoding="utf-8")
    with FakeProvider() as fp:
        fp.script(
            tool_call("read_file", {"path": "greet.txt"}, call_id="call_r1", reasoning="先读文件 🤔"),
            tool_calls(
                [
                    ("write_file", {"path": "out.txt", "content": "再见 👋\nbye\n"}),
                    ("bash", {"command": "echo 你好 🎉"}),
                    ("read_file", {"path": "greet.txt"}),
                ],
                ids=["call_p1", "call_p2", "call_p3"],
            ),
            text("Done: 你好 🎉, and out.txt is written.", pieces=4),
        )
        first = run_agent("final", "Read greet.txt, then write out.txt 🚀", provider=fp, cwd=work)
        assert first.returncode == 0, first.stderr
        session_id = new_session_id(first.stderr)
        fp.script(
            tool_calls([("read_file", {"path": "out.txt"}), ("bash", {"command": "ls"})], ids=["call_q1", "call_q2"]),
            tool_call("write_file", {"path": "out.txt", "content": "更新 ✅\n"}, call_id="call_q3"),
            text("更新好了 ✅", pieces=3),
        )
        second = run_agent("final", "-c", session_id, "Now update out.txt — 谢谢", provider=fp, cwd=work)
        assert second.returncode == 0, second.stderr
    data = (work / ".sessions" / f"{session_id}.jsonl").read_bytes()
    # The file is what the test needs: whole records, tool batches, non-ASCII stored as UTF-8.
    messages = disk_messages(work / ".sessions" / f"{session_id}.jsonl")
    assert [m["role"] for m in messages].count("user") == 2
    assert any(len(m.get("tool_calls") or []) == 3 for m in messages)
    assert "你好".encode() in data and "🎉".encode() in data and b"reasoning_content" in data
    assert len(messages) == 16
    return session_id, data


def cut_points(data: bytes) -> dict[str, int]:
    """Named offsets for the end-to-end sample, found in the real file's bytes."""
    ends = [i + 1 for i, byte in enumerate(data) if byte == ord("\n")]  # line i ends at ends[i]
    lines = data.split(b"\n")
    roles = [json.loads(line).get("message", {}).get("role") for line in lines[:-1]]
    first_tool = roles.index("tool")  # round 1's only result
    batch = next(i for i, line in enumerate(lines) if b"call_p1" in line)  # the three parallel calls
    echo_result = next(i for i, line in enumerate(lines) if b'"tool_call_id": "call_p2"' in line)
    emoji = data.index("🎉".encode(), ends[echo_result - 1])
    assert ends[echo_result - 1] < emoji < ends[echo_result]
    return {
        "empty": 0,
        "mid-header": ends[0] // 2,
        "mid-record": ends[0] + (ends[1] - ends[0]) // 2,  # inside the system prompt
        "before-newline": ends[first_tool] - 1,  # round 1's result whole, but its newline missing: kept
        "after-newline": ends[first_tool],  # right after round 1's batch: nothing torn
        "inside-batch": ends[batch + 1],  # the three parallel calls and only one of their results
        "inside-batch-utf8": emoji + 2,  # torn inside a 4-byte character of the second result
    }


# Cuts whose copy is resumed a second time: a torn tail was cut off, or a whole last record
# got back its newline (the next append must not be glued onto either), or a tool batch with
# missing results now sits mid-history.
SECOND_RESUME = {"mid-record", "before-newline", "inside-batch", "inside-batch-utf8"}


def boundary_of(data: bytes, ends: list[int], offset: int) -> int:
    """Where the file cut at `offset` ends once a resume has repaired it: at its last newline,
    the torn tail cut off; or, when the cut fell just before a newline, one byte further: the
    last record is whole, only its newline is missing, so it is kept and the newline added."""
    boundary = ends[bisect.bisect_right(ends, offset) - 1]
    return offset + 1 if offset > boundary and data[offset : offset + 1] == b"\n" else boundary


def test_real_file_cut_at_every_byte_offset(
    real_session: tuple[str, bytes], fast_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session_id, data = real_session
    agent = load_agent(monkeypatch, fast_dir)
    (fast_dir / ".sessions").mkdir(mode=0o700)
    path = fast_dir / ".sessions" / f"{session_id}.jsonl"

    # The expectation, from the original bytes: what each newline-terminated prefix holds.
    ends = [0] + [i + 1 for i, byte in enumerate(data) if byte == ord("\n")]
    held: list[list[dict]] = []
    for end in ends:
        records, _ = complete_lines(data[:end])
        held.append([r["message"] for r in records if r["type"] == "message"])

    failures: list[str] = []
    for offset in range(len(data) + 1):
        boundary = boundary_of(data, ends, offset)
        expected = held[ends.index(boundary)]
        torn = offset > boundary  # else the cut fell on a newline, or just before one
        added = {"role": "user", "content": f"after a cut at byte {offset}: 继续 ✓"}
        path.write_bytes(data[:offset])
        try:
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                session = agent.open_session(session_id)
            try:
                assert session.history == expected, "messages differ from the complete records before the cut"
                assert path.read_bytes() == data[:boundary], (
                    "not cut back to the last newline, or the newline not added"
                )
                warnings = [line for line in err.getvalue().splitlines() if line.strip()]
                assert len(warnings) == (1 if torn else 0), warnings
                assert not torn or warnings[0].startswith(TORN_WARNING), warnings
                assert sequence_error(agent.sendable(session.history)) is None
                session.history.append(added)
                session.save()
            finally:
                os.close(session.fd)

            raw = path.read_bytes()
            assert raw.startswith(data[:boundary]), "bytes before the cut changed"
            records, tail = complete_lines(raw[boundary:])
            assert tail == b""
            if boundary == 0:  # the header never reached the disk: the save writes one
                assert records[0]["type"] == "meta" and records[0]["id"] == session_id, records
                records = records[1:]
            assert records == [{"type": "message", "message": added}]

            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                again = agent.open_session(session_id)
            try:
                assert again.history == [*expected, added], "the appended message or older ones were lost"
                assert err.getvalue() == "", err.getvalue()
                sent = agent.sendable(again.history)
                assert sequence_error(sent) is None, sequence_error(sent)
                assert sent[-1] == added
            finally:
                os.close(again.fd)
        except Exception as error:  # noqa: BLE001 — report the offset, keep going for a few more
            message = " ".join(str(error).split())
            failures.append(f"offset {offset} of {len(data)}: {type(error).__name__}: {message[:400]}")
            if len(failures) >= 5:
                break
    assert not failures, "\n".join(failures)


def test_sample_of_cuts_resumes_end_to_end(real_session: tuple[str, bytes], tmp_path: Path) -> None:
    session_id, data = real_session
    points = cut_points(data)
    ends = [0] + [i + 1 for i, byte in enumerate(data) if byte == ord("\n")]
    cases = {}
    for name, offset in points.items():
        work = tmp_path / name / "work"
        (work / ".sessions").mkdir(parents=True, mode=0o700)
        (work / ".sessions" / f"{session_id}.jsonl").write_bytes(data[:offset])
        boundary = boundary_of(data, ends, offset)
        records, _ = complete_lines(data[:boundary])
        cases[name] = (work, offset, boundary, [r["message"] for r in records if r["type"] == "message"])
    # Torn cuts, clean cuts, and one just before a newline.
    assert {(c[1] > c[2]) - (c[1] < c[2]) for c in cases.values()} == {1, 0, -1}

    def run_all(task: str, answer: str, names: set[str]) -> dict[str, tuple]:
        """Resume the cut copies at once (each against its own provider)."""
        with contextlib.ExitStack() as stack:
            runs = {}
            for name in names:
                work = cases[name][0]
                fp = stack.enter_context(FakeProvider())
                fp.script(text(answer))
                runs[name] = (fp, Live("final", "-c", session_id, task, provider=fp, cwd=work))
            return {name: (*live.finish(), fp.chat_requests) for name, (fp, live) in runs.items()}

    first = run_all("more", "ok 👍", set(cases))
    for name, (code, out, err, requests) in first.items():
        work, offset, boundary, expected = cases[name]
        context = f"cut {name} at byte {offset}: {err}"
        assert code == 0 and "Traceback" not in err, context
        assert out == "ok 👍\n", context
        assert f"[resumed session {session_id}, {len(expected)} messages]" in err, context
        warnings = [line for line in err.splitlines() if line.startswith("warning")]
        if offset > boundary:
            assert len(warnings) == 1 and warnings[0].startswith(TORN_WARNING), context
            assert f"({offset - boundary} bytes)" in warnings[0], context
        else:
            assert warnings == [], context
        assert len(requests) == 1, context
        assert_sent(requests[0]["messages"], [*expected, {"role": "user", "content": "more"}])
        path = work / ".sessions" / f"{session_id}.jsonl"
        assert path.read_bytes().startswith(data[:boundary]), context
        assert disk_messages(path) == [
            *expected,
            {"role": "user", "content": "more"},
            {"role": "assistant", "content": "ok 👍"},
        ], context

    second = run_all("and again", "still ok", SECOND_RESUME)
    for name, (code, out, err, requests) in second.items():
        work, offset, boundary, expected = cases[name]
        context = f"second resume after cut {name} at byte {offset}: {err}"
        history = [*expected, {"role": "user", "content": "more"}, {"role": "assistant", "content": "ok 👍"}]
        assert code == 0 and "Traceback" not in err and "warning" not in err, context
        assert out == "still ok\n", context
        assert f"[resumed session {session_id}, {len(history)} messages]" in err, context
        assert_sent(requests[0]["messages"], [*history, {"role": "user", "content": "and again"}])
        assert (work / ".sessions" / f"{session_id}.jsonl").read_bytes().startswith(data[:boundary]), context


# ---------------------------------------------------------------- SIGKILL during a live run

ROUNDS = 7  # six tool rounds, then the answer


def live_replies(run: int, kill: tuple) -> list[Reply]:
    """One run's script: read, echo, write, a parallel batch, ls, read, then the answer.
    Call ids carry the run and round, so the disk shows which rounds completed."""

    def ids(round_number: int, count: int = 1) -> list[str]:
        return [f"call_k{run}r{round_number}c{i}" for i in range(count)]

    replies = [
        tool_calls([("read_file", {"path": "notes.txt"})], ids=ids(1)),
        tool_calls([("bash", {"command": f"echo run {run} 你好"})], ids=ids(2)),
        tool_calls([("write_file", {"path": f"out-{run}.txt", "content": f"内容 {run} 🎉\n"})], ids=ids(3)),
        tool_calls(
            [
                ("bash", {"command": "echo parallel"}),
                ("read_file", {"path": f"out-{run}.txt"}),
                ("write_file", {"path": f"new-{run}.txt", "content": "新 ✅"}),
            ],
            ids=ids(4, 3),
        ),
        tool_calls([("bash", {"command": "ls"})], ids=ids(5)),
        tool_calls([("read_file", {"path": "notes.txt"})], ids=ids(6)),
        text(f"run {run} done ✅", pieces=4),
    ]
    kind, value = kill
    if kind == "pause":  # hold round `round_number` after `events` SSE events
        round_number, events = value
        replies[round_number - 1].pause_after = events
    elif kind == "approval":  # a command the gate asks about; nobody answers
        replies[value - 1] = tool_calls([("bash", {"command": "sleep 0 && echo 等待"})], ids=ids(value))
    elif kind == "running":  # an approved command that runs until killed
        command = f"echo $$ > pid-{run}.txt && exec sleep 30"
        replies[value - 1] = tool_calls([("bash", {"command": command})], ids=ids(value))
    return replies


def kill_plan() -> list[tuple]:
    """Where each run of the chain dies: chosen points, then random ones (fixed seed)."""
    rng = random.Random(20260801)
    chosen = [
        ("pause", (1, 2)),  # round 1, mid tool-call stream
        ("resumed", None),  # right after the resume line, before any request
        ("approval", 2),  # mid-tool: blocked on the approval prompt
        ("pause", (7, 2)),  # the final answer, mid-text
        ("running", 4),  # mid-tool: a command is running (it outlives the agent)
        ("pause", (4, 5)),  # mid-stream inside the arguments of a parallel batch
    ]
    randomized = [("random", (rng.randint(1, ROUNDS), rng.uniform(0, 0.05))) for _ in range(4)]
    return chosen[:3] + randomized[:2] + chosen[3:] + randomized[2:]


def fp_system(requests: list[dict]) -> str:
    """The system prompt the first request carried (a new session stores it first)."""
    assert requests, "the first run was killed before its first request"
    return requests[0]["messages"][0]["content"]


@pytest.fixture
def sleepers():
    """PIDs of `sleep` commands a killed agent left behind; whatever still runs is stopped at teardown."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(OSError):
            if b"sleep" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)


def test_sigkill_at_many_points_of_live_runs(workdir: Path, sleepers: list[int]) -> None:
    (workdir / "notes.txt").write_text("笔记: buy milk 🥛\n", encoding="utf-8")
    session_id = None
    before: list[dict] = []
    orphan = None  # a command a killed agent left running, until the next run has resumed
    plan = kill_plan()
    for run, kill in enumerate([*plan, ("none", None)], start=1):
        kind, value = kill
        sleeper = None
        task = "start the work" if session_id is None else f"continue, run {run}"
        args = (task,) if session_id is None else ("-c", session_id, task)
        replies = live_replies(run, kill)
        with FakeProvider() as fp:
            fp.script(*replies)
            # At a terminal where the approval waits unanswered, or where the running command was approved.
            typed = {"approval": "", "running": "y\n"}.get(kind)
            with Live("final", *args, provider=fp, cwd=workdir, answers=typed, hang_up=kind != "approval") as live:
                try:
                    if kind == "pause":
                        fp.wait_paused()
                    elif kind == "resumed":
                        live.wait_stderr("[resumed session")
                    elif kind == "approval":
                        live.terminal.wait_for("allow? (y/N)")
                    elif kind == "running":
                        sleeper = int(wait_for_file(workdir / f"pid-{run}.txt"))
                        sleepers.append(sleeper)
                    elif kind == "random":
                        fp.wait_requests(value[0])
                        time.sleep(value[1])  # the random moment itself: after round k's request, somewhere
                    arrived = len(fp.chat_requests)  # requests sent before the kill: their earlier rounds are complete
                    if kind != "none":
                        live.kill()
                    code, out, err = live.finish()
                finally:
                    if orphan:  # it ran through this whole run, which still resumed: it holds no lock
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(orphan, signal.SIGKILL)
                    orphan = sleeper if kind == "running" else None  # a SIGKILLed agent cannot stop it
            # A request cut off by the kill while it was being sent arrives as a partial, non-JSON body.
            requests = [body for body in fp.chat_requests if isinstance(body, dict)]

        context = f"run {run}, kill {kill}, {arrived} requests before the kill:\n{err}"
        assert "Traceback" not in err, context
        if kind == "none":
            assert code == 0, context
        else:
            assert code in (-signal.SIGKILL, 0), context  # a random kill may come after a quick run ended
        if session_id is None:
            session_id = new_session_id(err)
            before = [{"role": "system", "content": fp_system(requests)}]  # a new session starts with it
        else:
            assert f"[resumed session {session_id}, {len(before)} messages]" in err, context
        assert "warning" not in err, context  # SIGKILL never leaves a torn or damaged line behind

        user = {"role": "user", "content": task}
        if requests:  # the resume sent the whole history, and the provider accepted it
            assert_sent(requests[0]["messages"], [*before, user])
            for request in requests:
                assert sequence_error(request["messages"]) is None, context

        after = disk_messages(workdir / ".sessions" / f"{session_id}.jsonl")  # whole lines, header intact
        assert after[: len(before)] == before, f"earlier history lost or changed; {context}"
        assert_batches_whole(after, saved_first=True)  # a call killed while it ran is on disk, its results not
        added = after[len(before) :]
        if kind == "resumed" and not added:
            pass  # killed before the follow-up was saved: nothing of this run was complete
        else:
            assert added and added[0] == user, context
        assistants = [m for m in added if m["role"] == "assistant"]
        for round_number, message in enumerate(assistants, start=1):
            reply = replies[round_number - 1]
            assert [c["id"] for c in message.get("tool_calls") or []] == [c[0] for c in reply.tool_calls], context
        if kind in ("pause", "approval", "running"):  # exactly the rounds before the one that was cut
            stopped_in = value[0] if kind == "pause" else value
            # and a call killed at its question or while it ran, saved before it ran, without results
            assert len(assistants) == stopped_in - (kind == "pause"), context
        else:
            assert max(arrived - 1, 0) <= len(assistants) <= len(requests), context
        if code == 0:
            assert len(assistants) == ROUNDS and out.endswith(f"run {run} done ✅\n"), context
        before = after
    assert len(before) > 40  # the chain really accumulated many rounds


def test_sigkill_at_startup_never_announces_a_session_that_is_not_on_disk(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guarantee 2 under SIGKILL: once an ID is printed, its header and first messages are durable."""
    rng = random.Random(1108)
    delays = [rng.uniform(0, 0.3) for _ in range(6)] + [None]  # None: kill right after the ID appears
    announced = []
    for attempt, delay in enumerate(delays):
        work = workdir / f"attempt-{attempt}"
        work.mkdir()
        with FakeProvider() as fp:
            fp.script(text("never read"))
            live = Live("final", "a task 🚀", provider=fp, cwd=work)
            if delay is None:
                live.wait_stderr("[new session")
            else:
                time.sleep(delay)  # the random moment itself
            live.kill()
            code, _out, err = live.finish()
        assert "Traceback" not in err
        assert code in (-signal.SIGKILL, 0), err
        files = sorted((work / ".sessions").glob("*.jsonl")) if (work / ".sessions").is_dir() else []
        match = re.search(r"\[new session (\S+)\]", err)
        if match:
            path = work / ".sessions" / f"{match.group(1)}.jsonl"
            assert files == [path]
            messages = disk_messages(path)  # a complete header line and whole records
            assert [m["role"] for m in messages[:2]] == ["system", "user"] and messages[1]["content"] == "a task 🚀"
            announced.append((work, match.group(1)))
        for path in files:  # whatever the kill left behind, announced or not: never torn, and it opens
            data = path.read_bytes()
            assert data == b"" or data.endswith(b"\n"), data[-80:]
            agent = load_agent(monkeypatch, work)
            with contextlib.redirect_stderr(io.StringIO()):
                session = agent.open_session(path.stem)
            os.close(session.fd)
            assert sequence_error(agent.sendable(session.history)) is None
    assert announced and announced[-1][0].name == f"attempt-{len(delays) - 1}"

    work, session_id = announced[-1]  # killed right after the ID appeared: it resumes
    with FakeProvider() as fp:
        fp.script(text("resumed fine"))
        result = run_agent("final", "-c", session_id, "go on", provider=fp, cwd=work)
        assert result.returncode == 0, result.stderr
        assert result.stdout == "resumed fine\n"
        messages = fp.chat_requests[0]["messages"]
    assert sequence_error(messages) is None
    assert [(m["role"], m["content"]) for m in messages[1:]] == [("user", "a task 🚀"), ("user", "go on")]


# ---------------------------------------------------------------- a conversation's file: every kind of record


def record(value: dict) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode() + b"\n"


def message(role: str, content: str, **extra: object) -> dict:
    return {"role": role, "content": content, **extra}


def conversation_file(session_id: str) -> bytes:
    """A resident conversation's file as agent.py writes one: messages with an origin beside
    them, wake-up and goal records, and two compactions, the second keeping messages that
    reach back across the first (so that a resume must walk back over it)."""
    goal = {"objective": "Ship 版本 2 ✓", "status": "active", "token_budget": 0, "tokens_used": 120}
    armed = {"type": "wakeup", "armed": True, "prompt": "check the build", "reason": "poll"}
    goal_record = {"type": "goal", "goal": goal}
    later_goal = {"type": "goal", "goal": {**goal, "tokens_used": 480}}
    lines = [
        record({"type": "meta", "id": session_id, "created_at": "2026-12-01T09:00:00+00:00", "version": 1}),
        record({"type": "message", "message": message("system", "You are a coding agent.")}),
        record({"type": "message", "message": message("user", "Make it a goal: ship 版本 2")}),
        record(goal_record),
        record({"type": "message", "message": message("assistant", "Goal set 🎯")}),
        record({"type": "message", "message": message("user", "<goal_context>go on</goal_context>"), "origin": "goal"}),
        record(armed),
        record({"type": "message", "message": message("assistant", "Polling.")}),
        record(
            {"type": "compaction", "summary": "一: set a goal, polling", "kept": 2, "carried": [goal_record, armed]}
        ),
        record({"type": "message", "message": message("user", "also 测试"), "origin": "steer"}),
        record(later_goal),
        record({"type": "message", "message": message("assistant", "Tests too.")}),
        # Keeps the last 4 of [system, summary one, goal_context, Polling., also 测试, Tests too.]:
        # two of them from before the compaction above.
        record({"type": "compaction", "summary": "二: tests", "kept": 4, "carried": [later_goal, armed]}),
        record(
            {
                "type": "message",
                "message": message("user", "<system-reminder>due</system-reminder>"),
                "origin": "wakeup",
            }
        ),
        record({"type": "wakeup", "armed": False, "prompt": "", "reason": "cancelled"}),
        record({"type": "message", "message": message("assistant", "Done ✅")}),
    ]
    return b"".join(lines)


def replayed_state(data: bytes) -> tuple[list[dict], dict]:
    """What the complete lines of data hold, replayed independently of the agent: the history
    (a compaction folds it) and the last wake-up and goal records (a compaction carries the
    ones in force when it was written)."""
    history: list[dict] = []
    state: dict = {}
    for line in data.split(b"\n")[:-1]:
        value = json.loads(line)
        if value["type"] == "message":
            history.append(value["message"])
        elif value["type"] == "compaction":
            summary = {"role": "user", "content": f"[summary of the earlier conversation]\n{value['summary']}"}
            history = [history[0], summary, *history[len(history) - value["kept"] :]]
            state = {carried["type"]: carried for carried in value["carried"]}  # the state in force then
        elif value["type"] in ("wakeup", "goal"):
            state[value["type"]] = value
    return history, state


def test_a_conversations_file_cut_at_every_byte_offset_resumes_its_live_part(
    fast_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every new kind of record has the guarantees of the others: cut at any byte, the file
    resumes with every complete record before the cut; the resume, which reads back from the
    last compaction, finds the same history and the same state records as a replay of the
    whole file; the origins never reach the request."""
    agent = load_agent(monkeypatch, fast_dir)
    (fast_dir / ".sessions").mkdir(mode=0o700)
    session_id = "20261201-090000-0123abcd"
    data = conversation_file(session_id)
    path = fast_dir / ".sessions" / f"{session_id}.jsonl"
    ends = [0] + [i + 1 for i, byte in enumerate(data) if byte == ord("\n")]
    failures: list[str] = []
    for offset in range(len(data) + 1):
        boundary = boundary_of(data, ends, offset)
        history, state = replayed_state(data[:boundary])
        path.write_bytes(data[:offset])
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                session = agent.open_session(session_id)
            try:
                assert session.history == history, "the history differs from a replay of the complete records"
                for kind in ("wakeup", "goal"):
                    found = session.state.get(kind)
                    want = state.get(kind)
                    assert found == want, (kind, found, want)
                sent = agent.sendable(session.history)
                assert sequence_error(sent) is None
                assert all(set(m) <= {"role", "content", "tool_calls", "tool_call_id"} for m in sent), sent
            finally:
                os.close(session.fd)
        except Exception as error:  # noqa: BLE001 — report the offset, keep going for a few more
            failures.append(
                f"offset {offset} of {len(data)}: {type(error).__name__}: {' '.join(str(error).split())[:300]}"
            )
            if len(failures) >= 5:
                break
    assert not failures, "\n".join(failures)


def test_list_counts_a_conversations_messages_and_names_no_state_record_damaged(workdir: Path) -> None:
    """-list reads the first bytes of each line: wake-up and goal records are records, not
    damage; the messages it counts are the file's (folded ones too); the compactions, twice."""
    session_id = "20261201-090000-0123abcd"
    (workdir / ".sessions").mkdir(mode=0o700)
    data = conversation_file(session_id)
    (workdir / ".sessions" / f"{session_id}.jsonl").write_bytes(data)
    result = run_agent("final", "-list", provider=None, cwd=workdir)
    assert result.returncode == 0, result.stderr
    messages = sum(1 for line in data.split(b"\n") if line.startswith(b'{"type": "message"'))
    assert f" {messages} messages " in result.stdout, result.stdout
    assert result.stdout.rstrip().endswith("[compacted ×2]"), result.stdout
