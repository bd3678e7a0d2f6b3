"""Sessions (agent.py): the file format, the CLI forms, append-only saves.

The real agent.py runs as a subprocess against the fake provider. The tests
read what the user sees (stdout, stderr, exit code), what reached the server
(the messages of every request) and the bytes in .sessions/. Two checks need
instruments a subprocess cannot offer (how many write() calls a save makes,
which descriptors are fsynced before create_session returns): they load
agent.py in-process and spy on the standard library, never on the agent.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from conftest import assert_clean_failure, hermetic_env, program, run_agent
from fake_provider import FakeProvider, Reply, text, tool_call
from helpers import (
    NEW_SESSION,
    SESSION_ID,
    SESSION_ID_SHAPE,
    assert_ok,
    call,
    complete_lines,
    decoy_sessions,
    disk_messages,
    hint,
    measure_save,
    message_line,
    put_session,
    resumed,
    session_bytes,
    snapshot,
    stderr_lines,
    watch_creation,
)

KEY = "sk-SECRET-7f3c9e1a-do-not-store-4b2d"  # distinctive: it must never reach a file
TASK = "What does notes.txt say?"
SYSTEM = {"role": "system", "content": "You are a coding agent."}


# ---------------------------------------------------------------- helpers


def new_session(provider: FakeProvider, workdir: Path, task: str, *replies: Reply) -> tuple[str, Path]:
    provider.script(*replies)
    result = run_agent("final", task, provider=provider, cwd=workdir)
    assert_ok(result)
    match = NEW_SESSION.match(result.stderr)
    assert match, result.stderr
    session_id = match.group(1)
    assert stderr_lines(result.stderr)[-1] == hint(session_id), result.stderr
    return session_id, workdir / ".sessions" / f"{session_id}.jsonl"


def resume(provider: FakeProvider, workdir: Path, wanted: str, task: str, *replies: Reply) -> tuple[str, int]:
    """-c wanted task: returns (the resumed ID, the message count it announced)."""
    provider.script(*replies)
    result = run_agent("final", "-c", wanted, task, provider=provider, cwd=workdir)
    assert_ok(result)
    session_id, count = resumed(result.stderr)
    assert stderr_lines(result.stderr)[0].startswith("[resumed session"), result.stderr
    assert stderr_lines(result.stderr)[-1] == hint(session_id), result.stderr
    return session_id, count


def hand_written(workdir: Path, session_id: str, prompt: str, answer: str = "ok") -> Path:
    user, assistant = {"role": "user", "content": prompt}, {"role": "assistant", "content": answer}
    return put_session(workdir, session_bytes(SYSTEM, user, assistant, session_id=session_id), session_id)


# ---------------------------------------------------------------- a new session


def test_new_session_file_format_modes_and_hint(provider: FakeProvider, workdir: Path) -> None:
    (workdir / "notes.txt").write_text("buy milk\n", encoding="utf-8")
    raw_args = '{"path":  "notes.txt" , "why":"caf\\u00e9 — 看看"}'  # odd spacing and escapes: stored byte for byte
    started = datetime.now().astimezone()
    provider.script(
        tool_call("read_file", raw_args, call_id="call_00_Xy7", reasoning="I should read the file first."),
        text("The notes say: buy milk.", reasoning="The file says buy milk."),
    )
    result = run_agent("final", TASK, provider=provider, cwd=workdir, OPENAI_API_KEY=KEY)
    assert_ok(result)
    assert result.stdout == "The notes say: buy milk.\n"
    match = NEW_SESSION.match(result.stderr)
    assert match, result.stderr
    session_id = match.group(1)
    assert result.stderr.endswith(hint(session_id) + "\n"), result.stderr  # the last thing said
    assert KEY not in result.stderr + result.stdout
    path = workdir / ".sessions" / f"{session_id}.jsonl"
    assert re.fullmatch(SESSION_ID_SHAPE, session_id), session_id
    assert sorted(p.name for p in path.parent.iterdir()) == [f"{session_id}.jsonl"]

    # Private, whatever the umask: directory 0700, file 0600.
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600

    data = path.read_bytes()
    first_line = data.split(b"\n", 1)[0]
    meta = json.loads(first_line)
    assert list(meta)[:2] == ["type", "id"], first_line
    assert meta["type"] == "meta" and meta["id"] == session_id
    assert meta["version"] == 1
    assert meta["model"] == "test-model"
    assert meta["base_url"] == provider.url
    created = datetime.fromisoformat(meta["created_at"])
    assert created.tzinfo is not None, meta
    assert started - timedelta(seconds=5) <= created <= datetime.now().astimezone() + timedelta(seconds=5)

    # The key appears nowhere: not in the file, not anywhere under .sessions, not in the workdir.
    for file in workdir.rglob("*"):
        if file.is_file():
            assert KEY.encode() not in file.read_bytes(), file
    assert b"sk-SECRET" not in data

    # One record per message, the assistant messages exactly as the stream delivered them.
    messages = disk_messages(path)
    system = provider.chat_requests[0]["messages"][0]
    assert system["role"] == "system" and system["content"]
    assert messages == [
        system,
        {"role": "user", "content": TASK},
        {
            "role": "assistant",
            "content": None,  # null on the tool-call turn, not ""
            "reasoning_content": "I should read the file first.",
            "tool_calls": [call("call_00_Xy7", "read_file", raw_args)],
        },
        {"role": "tool", "tool_call_id": "call_00_Xy7", "content": "buy milk\n"},
        {"role": "assistant", "content": "The notes say: buy milk.", "reasoning_content": "The file says buy milk."},
    ]
    # The arguments string survives byte for byte, even through the JSON of the record.
    assert json.loads(data.split(b"\n")[3])["message"]["tool_calls"][0]["function"]["arguments"] == raw_args

    # What went to the server is what is on disk (the second request carries the first round).
    assert provider.chat_requests[0]["messages"] == messages[:2]
    assert provider.chat_requests[1]["messages"] == messages[:4]


# ---------------------------------------------------------------- resume


def test_resume_resends_history_and_appends(provider: FakeProvider, workdir: Path) -> None:
    session_id, path = new_session(provider, workdir, "My name is Xiaoming; remember it", text("Hello, Xiaoming!"))
    before = path.read_bytes()
    old_messages = disk_messages(path)
    assert len(old_messages) == 3

    resumed, count = resume(provider, workdir, session_id, "What is my name?", text("Your name is Xiaoming."))
    assert (resumed, count) == (session_id, 3)
    request = provider.chat_requests[-1]["messages"]
    assert request == [*old_messages, {"role": "user", "content": "What is my name?"}]

    after = path.read_bytes()
    assert after.startswith(before)
    assert [json.loads(line) for line in after[len(before) :].splitlines()] == [
        {"type": "message", "message": {"role": "user", "content": "What is my name?"}},
        {"type": "message", "message": {"role": "assistant", "content": "Your name is Xiaoming."}},
    ]
    assert len(list(path.parent.iterdir())) == 1  # no second session appeared


def test_multi_round_resume_keeps_the_old_bytes(provider: FakeProvider, workdir: Path) -> None:
    """Guarantee 1 end to end: a three-round run appends; the bytes from before it never change."""
    (workdir / "a.txt").write_text("alpha\n", encoding="utf-8")
    (workdir / "b.txt").write_text("beta\n", encoding="utf-8")
    session_id, path = new_session(provider, workdir, "Hi", text("Hi! What shall we do?"))
    before = path.read_bytes()
    header = before.split(b"\n", 1)[0]

    _, count = resume(
        provider,
        workdir,
        session_id,
        "Read a.txt and b.txt",
        tool_call("read_file", {"path": "a.txt"}, call_id="call_a"),
        tool_call("read_file", {"path": "b.txt"}, call_id="call_b"),
        text("a says alpha, b says beta."),
    )
    assert count == 3
    after = path.read_bytes()
    assert after.startswith(before)
    assert after.split(b"\n", 1)[0] == header
    new = [json.loads(line)["message"] for line in after[len(before) :].splitlines()]
    assert new == [
        {"role": "user", "content": "Read a.txt and b.txt"},
        {"role": "assistant", "content": None, "tool_calls": [call("call_a", "read_file", '{"path": "a.txt"}')]},
        {"role": "tool", "tool_call_id": "call_a", "content": "alpha\n"},
        {"role": "assistant", "content": None, "tool_calls": [call("call_b", "read_file", '{"path": "b.txt"}')]},
        {"role": "tool", "tool_call_id": "call_b", "content": "beta\n"},
        {"role": "assistant", "content": "a says alpha, b says beta."},
    ]
    # Each request of the run carried the whole history so far.
    old = disk_messages(path)[:3]
    assert [len(r["messages"]) for r in provider.chat_requests[1:]] == [4, 6, 8]
    assert provider.chat_requests[-1]["messages"] == old + new[:-1]


def test_continue_last_picks_the_most_recently_modified(provider: FakeProvider, workdir: Path) -> None:
    first_id, first = new_session(provider, workdir, "first task", text("first answer"))
    second_id, second = new_session(provider, workdir, "second task", text("second answer"))
    assert first_id != second_id
    # The first session was created earlier but is the most recently active one.
    future = time.time() + 120
    os.utime(first, (future, future))
    second_before = second.read_bytes()

    resumed, count = resume(provider, workdir, "last", "and now?", text("ok"))
    assert (resumed, count) == (first_id, 3)
    assert provider.chat_requests[-1]["messages"][1] == {"role": "user", "content": "first task"}
    assert second.read_bytes() == second_before
    assert disk_messages(first)[-2:] == [
        {"role": "user", "content": "and now?"},
        {"role": "assistant", "content": "ok"},
    ]


def test_unique_prefix_continues_and_ambiguous_prefix_is_an_error(provider: FakeProvider, workdir: Path) -> None:
    one = hand_written(workdir, "20260801-090720-56492195", "prompt one")
    hand_written(workdir, "20260801-090720-56aaaaaa", "prompt two")
    hand_written(workdir, "20260802-101010-0badf00d", "prompt three")

    before = snapshot(workdir)
    result = run_agent("final", "-c", "20260801-090720-56", "which one?", provider=provider, cwd=workdir)
    assert_clean_failure(result)
    assert len(stderr_lines(result.stderr)) == 1, result.stderr
    assert "20260801-090720-56" in result.stderr and "2 sessions" in result.stderr, result.stderr
    assert snapshot(workdir) == before
    assert provider.requests == []

    resumed, count = resume(provider, workdir, "20260801-090720-564", "the first one", text("yes"))
    assert (resumed, count) == ("20260801-090720-56492195", 3)
    assert provider.chat_requests[-1]["messages"][1]["content"] == "prompt one"
    assert disk_messages(one)[-1] == {"role": "assistant", "content": "yes"}

    resumed, _ = resume(provider, workdir, "20260802", "the third one", text("yes"))
    assert resumed == "20260802-101010-0badf00d"


# ---------------------------------------------------------------- -list, -h, -restore


def list_line(stdout: str, session_id: str) -> str:
    lines = [line for line in stdout.splitlines() if line.startswith(session_id)]
    assert len(lines) == 1, stdout
    return lines[0]


def count_of(line: str) -> int:
    match = re.search(r"\b(\d+) messages\b", line)
    assert match, line
    return int(match.group(1))


def test_list_shows_every_session_with_its_details(provider: FakeProvider, workdir: Path) -> None:
    real_id, real = new_session(provider, workdir, "Read notes.txt\nand   summarise\tit", text("Nothing to read."))
    long_prompt = "Please refactor the session loader so that " + "every corner case is handled " * 5
    long_file = hand_written(workdir, "20260801-090720-56492195", long_prompt)
    torn = hand_written(workdir, "20260802-101010-0badf00d", "a torn one")
    torn.write_bytes(torn.read_bytes() + b'{"type": "message", "message": {"role": "us')
    damaged = hand_written(workdir, "20260803-111111-deadbeef", "a damaged one")
    lines = damaged.read_bytes().split(b"\n")
    lines.insert(2, b"this line is not JSON")
    damaged.write_bytes(b"\n".join(lines))
    windows = hand_written(workdir, "20260805-080808-c0ffee00", "written on Windows")
    windows.write_bytes(windows.read_bytes().replace(b"\n", b"\r\n"))
    # Not sessions: a stray file and a name that is not an ID.
    (workdir / ".sessions" / "notes.txt").write_text("x")
    (workdir / ".sessions" / "not-an-id.jsonl").write_bytes(message_line({"role": "user", "content": "x"}))
    # Known modification times: the listing shows them and orders by them.
    stamps = {
        long_file: 1_780_000_000,
        torn: 1_780_000_600,
        damaged: 1_780_001_200,
        windows: 1_780_001_500,
        real: 1_780_001_800,
    }
    for path, stamp in stamps.items():
        os.utime(path, (stamp, stamp))
    before = snapshot(workdir)

    result = run_agent("final", "-list", provider=None, cwd=workdir)
    assert_ok(result)
    out = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(out) == 5, result.stdout
    assert [line.split()[0] for line in out] == [p.stem for p in stamps], result.stdout  # oldest first
    assert snapshot(workdir) == before  # listing changes nothing

    for path, stamp in stamps.items():
        line = list_line(result.stdout, path.stem)
        assert f"modified {datetime.fromtimestamp(stamp):%Y-%m-%d %H:%M}" in line, line

    line = list_line(result.stdout, real_id)
    created = datetime.fromisoformat(complete_lines(real.read_bytes())[0][0]["created_at"])
    assert f"created {created:%Y-%m-%d %H:%M}" in line, line
    assert count_of(line) == 3
    assert "Read notes.txt and summarise it" in line, line  # whitespace and newlines collapsed
    assert "torn" not in line and "damaged" not in line, line

    line = list_line(result.stdout, "20260801-090720-56492195")
    assert "created 2026-08-01 09:07" in line, line
    assert count_of(line) == 3
    prompt = line.split(" messages", 1)[1].strip()
    assert 40 <= len(prompt) <= 50, prompt
    assert long_prompt.startswith(prompt.rstrip("…. ")), prompt
    assert "torn" not in line and "damaged" not in line, line

    line = list_line(result.stdout, torn.stem)
    assert "torn tail" in line and "damaged" not in line, line
    assert count_of(line) == 3
    assert "a torn one" in line

    line = list_line(result.stdout, windows.stem)
    assert count_of(line) == 3 and "written on Windows" in line, line
    assert "torn" not in line and "damaged" not in line, line  # CRLF endings are not damage

    line = list_line(result.stdout, damaged.stem)
    assert "damaged lines" in line and "torn" not in line, line
    assert count_of(line) == 3
    assert "a damaged one" in line


def spelled(
    separator: bytes = b"\n", end: bytes = b"", indent: bytes = b"", reorder: bool = False, compact: bool = False
) -> bytes:
    """A session of three messages, by hand, in a spelling the loader accepts: its line ending,
    what follows the last record instead of it, spaces before each record, keys in another order,
    the Go edition's compact separators."""
    messages = [SYSTEM, {"role": "user", "content": "spelled"}, {"role": "assistant", "content": "ok"}]
    meta = {"type": "meta", "id": SESSION_ID, "created_at": "2026-08-01T09:07:20+08:00", "version": 1}
    records = [meta] + [
        {"message": m, "type": "message"} if reorder else {"type": "message", "message": m} for m in messages
    ]
    lines = [indent + json.dumps(r, separators=(",", ":") if compact else None).encode() for r in records]
    return separator.join(lines) + end


# Every way the loader takes a file whose last record has no final newline, or whose records are
# spelled otherwise than ours: (the file, whether a resume cuts a torn tail off it).
SPELLINGS = {
    "no final newline": spelled(),
    "CRLF, the last line ends in \\r": spelled(b"\r\n", b"\r"),
    "CRLF, no final line ending": spelled(b"\r\n"),
    "spaces after the last record": spelled(end=b"   "),
    "a tab and spaces after the last record": spelled(end=b"\t  "),
    "blank lines, then spaces, no newline": spelled(end=b"\n\n   "),
    "CRLF blank lines, then a \\r": spelled(b"\r\n", b"\r\n\r\n\r"),
    "the Go edition's compact spelling, no final newline": spelled(compact=True),
    "records indented by spaces": spelled(indent=b"  ", end=b"\n"),
    "keys in another order": spelled(reorder=True, end=b"\n"),
    "keys in another order, no final newline": spelled(reorder=True),
}


@pytest.mark.parametrize("name", list(SPELLINGS))
def test_list_says_what_a_resume_finds_in_every_spelling_the_loader_takes(
    provider: FakeProvider, workdir: Path, name: str
) -> None:
    """-list and -c side by side on the same file: a last line that is a whole record is no torn
    tail, and it is counted; a record in another spelling is counted, not marked as damage. The
    resume sends all three messages and leaves whole lines on disk, which -list then counts too."""
    path = put_session(workdir, SPELLINGS[name])
    listed = run_agent("final", "-list", provider=None, cwd=workdir)
    assert_ok(listed)
    line = list_line(listed.stdout, SESSION_ID)
    assert count_of(line) == 3 and "spelled" in line, line
    assert "[" not in line.split(" messages", 1)[1], f"marked, though a resume finds it whole: {line}"

    provider.script(text("Still here."))
    again = run_agent("final", "-c", SESSION_ID, "next", provider=provider, cwd=workdir)
    assert_ok(again, "Still here.\n")
    assert resumed(again.stderr) == (SESSION_ID, 3)
    assert not [w for w in again.stderr.splitlines() if w.startswith("warning:")], again.stderr
    sent = provider.chat_requests[0]["messages"]
    assert [m["content"] for m in sent] == [SYSTEM["content"], "spelled", "ok", "next"]
    assert path.read_bytes().endswith(b"\n")
    relisted = list_line(run_agent("final", "-list", provider=None, cwd=workdir).stdout, SESSION_ID)
    assert count_of(relisted) == 5 and "[" not in relisted.split(" messages", 1)[1], relisted


def test_list_and_a_resume_agree_on_a_torn_last_line(provider: FakeProvider, workdir: Path) -> None:
    """The contrast: a last line cut mid-record. -list marks the torn tail and does not count it;
    the resume cuts it off, says so, and loads the messages before it."""
    put_session(workdir, spelled() + b'\n{"type": "message", "message": {"role": "us')
    line = list_line(run_agent("final", "-list", provider=None, cwd=workdir).stdout, SESSION_ID)
    assert count_of(line) == 3 and "[torn tail]" in line, line
    provider.script(text("Still here."))
    again = run_agent("final", "-c", SESSION_ID, "next", provider=provider, cwd=workdir)
    assert_ok(again, "Still here.\n")
    assert resumed(again.stderr) == (SESSION_ID, 3)
    assert "dropped an incomplete last line" in again.stderr, again.stderr


# Complete middle lines the loader skips as damaged (see test_sessions_inputs.py). -list reads
# only the first bytes of each line: a line that is no record at all is marked and not counted;
# a message line damaged inside is counted, and left to the resume, which names it.
NOT_A_RECORD = {
    "garbage": b"this line is not JSON",
    "NUL run": b"\0" * 64,
    "unknown record": b'{"type": "title", "title": "my session"}',
}
DAMAGED_INSIDE = {
    "not UTF-8": b'{"type": "message", "message": {"role": "user", "content": "caf\xe9"}}',
    "two records glued": message_line({"role": "user", "content": "glued"}).rstrip(b"\n")
    + message_line({"role": "assistant", "content": "together"}).rstrip(b"\n"),
    "message without a role": b'{"type": "message", "message": {"content": "who said this?"}}',
    "message not an object": b'{"type": "message", "message": "just a string"}',
}


def damaged_sessions(workdir: Path, lines: dict[str, bytes]) -> dict[str, str]:
    """One session per kind of damaged line, each with 3 loadable messages; kind -> ID."""
    ids = {}
    for number, (kind, bad) in enumerate(lines.items()):
        session_id = f"20260804-12000{number}-0000000{number}"
        path = hand_written(workdir, session_id, f"prompt of {kind}")
        lines_of_file = path.read_bytes().split(b"\n")
        lines_of_file.insert(3, bad)  # between the user message and the answer
        path.write_bytes(b"\n".join(lines_of_file))
        ids[kind] = session_id
    return ids


def test_list_marks_a_line_that_is_no_record_and_does_not_count_it(workdir: Path) -> None:
    ids = damaged_sessions(workdir, NOT_A_RECORD)
    result = run_agent("final", "-list", provider=None, cwd=workdir)
    assert_ok(result)
    for kind, session_id in ids.items():
        line = list_line(result.stdout, session_id)
        assert "damaged lines" in line, f"{kind}: -list shows a damaged session as healthy: {line}"
        assert count_of(line) == 3, f"{kind}: a resume loads 3 messages: {line}"
        assert f"prompt of {kind}" in line, line


def test_list_takes_blank_lines_of_any_length_as_no_damage(workdir: Path) -> None:
    """A resume skips blank lines silently; -list does not mark them, however long."""
    ids = damaged_sessions(workdir, {"short blank": b"   ", "long blank": b" \t" * 100})
    result = run_agent("final", "-list", provider=None, cwd=workdir)
    assert_ok(result)
    for kind, session_id in ids.items():
        line = list_line(result.stdout, session_id)
        assert count_of(line) == 3 and "[" not in line.split("messages", 1)[1], f"{kind}: {line}"


def test_list_into_a_pipe_closed_early_ends_quietly(workdir: Path) -> None:
    """`-list | head -n 1` with more sessions than a pipe holds: the first line, exit 0, nothing on stderr."""
    for number in range(3000):  # 300 KB of lines: more than a pipe holds
        hand_written(workdir, f"20260805-120000-{number:08x}", f"prompt {number}")
    env = hermetic_env(None, workdir.parent)
    command = f"{sys.executable} {program('final')} -list | head -n 1; exit ${{PIPESTATUS[0]}}"
    result = subprocess.run(["bash", "-c", command], cwd=workdir, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout.startswith("20260805-120000-") and result.stdout.count("\n") == 1, result.stdout


def test_list_leaves_a_line_damaged_inside_to_the_resume(provider: FakeProvider, workdir: Path) -> None:
    """-list counts it as the message line it starts as; resuming finds it and names it."""
    ids = damaged_sessions(workdir, DAMAGED_INSIDE)
    result = run_agent("final", "-list", provider=None, cwd=workdir)
    assert_ok(result)
    for kind, session_id in ids.items():
        line = list_line(result.stdout, session_id)
        assert count_of(line) == 4 and "damaged" not in line and f"prompt of {kind}" in line, f"{kind}: {line}"
    provider.script(text("ok"))
    resumed = run_agent("final", "-c", ids["not UTF-8"], "next", provider=provider, cwd=workdir)
    assert_ok(resumed)
    assert "damaged line(s) 4 of" in resumed.stderr and "3 messages]" in resumed.stderr, resumed.stderr


def test_list_with_no_sessions_says_so(workdir: Path) -> None:
    result = run_agent("final", "-list", provider=None, cwd=workdir)
    assert_ok(result)
    assert result.stdout == ""
    assert "no sessions" in result.stderr, result.stderr
    assert not (workdir / ".sessions").exists()  # listing creates nothing

    (workdir / ".sessions").mkdir()
    (workdir / ".sessions" / "README").write_text("not a session")
    result = run_agent("final", "--list", provider=None, cwd=workdir)
    assert_ok(result)
    assert result.stdout == ""
    assert "no sessions" in result.stderr, result.stderr


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_shows_every_form(workdir: Path, flag: str) -> None:
    result = run_agent("final", flag, provider=None, cwd=workdir)
    assert_ok(result)
    usage = result.stdout
    for form in ['"task"', "-c ID", "-c last", "-list", "-restore FILE", "-h"]:
        assert form in usage, (form, usage)
    assert list(workdir.iterdir()) == []


def test_help_into_a_reader_that_stops_early_is_no_traceback(workdir: Path) -> None:
    """`python agent.py -h | head -1`: the pipe closes after one line; exit 0, nothing on stderr."""
    reader, writer = os.pipe()
    agent = subprocess.Popen(
        [sys.executable, str(program("final")), "-h"],
        cwd=workdir,
        env=hermetic_env(None, workdir.parent),
        stdout=writer,
        stderr=subprocess.PIPE,
    )
    os.close(writer)
    os.close(reader)  # the reader has gone before the first byte: every write meets a closed pipe
    _out, err = agent.communicate(timeout=60)
    assert agent.returncode == 0, err
    assert err == b"", err


def test_restore_still_works(provider: FakeProvider, workdir: Path) -> None:
    notes = workdir / "notes.txt"
    notes.write_text("version one\n", encoding="utf-8")
    session_id, path = new_session(
        provider,
        workdir,
        "Rewrite notes.txt",
        tool_call("read_file", {"path": "notes.txt"}, call_id="call_r"),
        tool_call("write_file", {"path": "notes.txt", "content": "version two\n"}, call_id="call_w"),
        text("Rewritten."),
    )
    assert notes.read_text(encoding="utf-8") == "version two\n"
    session_bytes = path.read_bytes()

    result = run_agent("final", "-restore", "notes.txt", provider=None, cwd=workdir)
    assert_ok(result)
    assert notes.read_text(encoding="utf-8") == "version one\n"
    assert result.stdout.startswith("restored .trash/") and result.stdout.rstrip().endswith("-> notes.txt")
    assert path.read_bytes() == session_bytes  # -restore is not a session run
    assert len(list(path.parent.iterdir())) == 1
    # The replaced version got its own backup: restoring again brings "version two" back.
    result = run_agent("final", "--restore", "notes.txt", provider=None, cwd=workdir)
    assert_ok(result)
    assert notes.read_text(encoding="utf-8") == "version two\n"


# ---------------------------------------------------------------- guarantee 9: provider-aware replay


def test_deepseek_thinking_mode_replays_reasoning_on_tool_call_turns(provider: FakeProvider, workdir: Path) -> None:
    provider.thinking = True  # a tool-call turn without its reasoning_content gets HTTP 400
    (workdir / "notes.txt").write_text("buy milk\n", encoding="utf-8")
    session_id, path = new_session(
        provider,
        workdir,
        TASK,
        tool_call("read_file", {"path": "notes.txt"}, call_id="call_t", reasoning="I need the file."),
        text("It says buy milk.", reasoning="Answer now."),
    )
    stored = disk_messages(path)
    assert stored[2]["reasoning_content"] == "I need the file."
    assert stored[4]["reasoning_content"] == "Answer now."  # stored as received, even where it is not sent

    resume(provider, workdir, session_id, "more", text("Nothing more."))
    sent = provider.chat_requests[-1]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert sent[2] == stored[2]  # with reasoning_content: thinking mode requires it
    assert sent[4] == {"role": "assistant", "content": "It says buy milk."}  # a plain answer's reasoning is not sent
    assert "reasoning_content" not in json.dumps(sent[4])
    assert disk_messages(path)[:5] == stored


BOOK_ID = SESSION_ID


def book_file(workdir: Path) -> tuple[Path, list[dict]]:
    """A session as the book's own edition writes it: compact JSON, no version, extra keys."""
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "我叫小明，记住这个名字"},
        {"role": "assistant", "content": "好的，小明！我记住了。"},
    ]
    header = b'{"type":"meta","id":"20260801-090720-56492195","created_at":"2026-08-01T09:07:20.123456789+08:00"}\n'
    sessions = workdir / ".sessions"
    sessions.mkdir(mode=0o700)
    path = sessions / f"{BOOK_ID}.jsonl"
    body = b"".join(message_line(m, compact=True, created_at="0001-01-01T00:00:00Z") for m in messages)
    assert b", " not in body and b'"created_at":"0001' in body
    path.write_bytes(header + body)
    return path, messages


def test_a_file_written_by_the_book_loads(provider: FakeProvider, workdir: Path) -> None:
    path, messages = book_file(workdir)
    before = path.read_bytes()

    result = run_agent("final", "-list", provider=None, cwd=workdir)
    assert_ok(result)
    line = list_line(result.stdout, BOOK_ID)
    assert "created 2026-08-01 09:07" in line, line
    assert count_of(line) == 3
    assert "我叫小明，记住这个名字" in line
    assert "torn" not in line and "damaged" not in line, line

    resumed, count = resume(provider, workdir, BOOK_ID, "我叫什么名字？", text("你叫小明。"))
    assert (resumed, count) == (BOOK_ID, 3)
    assert provider.chat_requests[-1]["messages"] == [*messages, {"role": "user", "content": "我叫什么名字？"}]
    after = path.read_bytes()
    assert after.startswith(before)
    assert [json.loads(line)["message"] for line in after[len(before) :].splitlines()] == [
        {"role": "user", "content": "我叫什么名字？"},
        {"role": "assistant", "content": "你叫小明。"},
    ]

    result = run_agent("final", "-list", provider=None, cwd=workdir)
    assert count_of(list_line(result.stdout, BOOK_ID)) == 5


# ---------------------------------------------------------------- in-process instruments


@pytest.mark.skipif(not Path("/proc/thread-self/io").exists(), reason="needs Linux /proc/thread-self/io")
def test_save_writes_only_the_new_records_in_one_write(loaded, monkeypatch: pytest.MonkeyPatch) -> None:
    """Guarantee 1: one write() of exactly the new lines, then fsync; the cost does not grow with the history."""
    written_per_size = {}
    for length in (20, 3000):
        save = measure_save(loaded, length, monkeypatch)
        assert len(disk_messages(save.path)) == length + 2
        assert save.after.startswith(save.before)  # the header and every old record untouched
        tail = save.after[len(save.before) :]
        assert [json.loads(line) for line in tail.split(b"\n")[:-1]] == [
            {"type": "message", "message": m} for m in save.new
        ]
        assert tail.count(b"\n") == 2 and tail.endswith(b"\n")
        assert save.writes == 1, "a save must be exactly one write()"
        assert save.written == len(tail), "a save writes only the new records"
        assert str(save.path) in save.fsynced
        assert save.idle_writes == 0 and save.idle_after == save.after  # nothing new: nothing written
        written_per_size[length] = save.written
    assert written_per_size[20] == written_per_size[3000]


def test_creation_is_exclusive_private_and_durable_before_returning(loaded, monkeypatch: pytest.MonkeyPatch) -> None:
    """Guarantee 2: O_CREAT|O_EXCL, 0600 in 0700; the file and then its directory fsynced before the ID exists."""
    created = watch_creation(loaded, monkeypatch)
    session, path = created.session, created.path
    try:
        assert re.fullmatch(SESSION_ID_SHAPE, session.id)
        assert stat.S_IMODE(loaded.SESSIONS.stat().st_mode) == 0o700
        assert stat.S_IMODE(path.stat().st_mode) == 0o600

        assert len(created.opened) == 1, created.opened
        flags, mode = created.opened[0]
        assert flags & os.O_CREAT and flags & os.O_EXCL, "the session file must be created exclusively"
        assert mode == 0o600

        targets = [target for target, _ in created.fsynced]
        assert str(path) in targets and str(loaded.SESSIONS) in targets, created.fsynced
        assert targets.index(str(path)) < targets.index(str(loaded.SESSIONS)), "file first, then its directory"
        on_disk_at_fsync = dict(created.fsynced)[str(path)]
        assert on_disk_at_fsync == path.read_bytes()  # header and first messages complete when fsynced
        assert json.loads(on_disk_at_fsync.split(b"\n")[0])["id"] == session.id
    finally:
        os.close(session.fd)


def test_creation_never_reuses_an_existing_file(loaded, monkeypatch: pytest.MonkeyPatch) -> None:
    """O_EXCL observed: if the chosen name exists, the old file is left alone and the creation fails cleanly."""
    decoys = decoy_sessions(loaded, monkeypatch)
    with pytest.raises(loaded.Failure) as caught:
        loaded.create_session([{"role": "user", "content": "hi"}])
    assert "\n" not in str(caught.value)
    assert all(d.read_bytes() == b"precious bytes\n" for d in decoys)
    assert len(list(loaded.SESSIONS.iterdir())) == len(decoys)
