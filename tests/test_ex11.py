"""Chapter 11: session persistence, as the chapter's own program has it (exercises/ex11/agent.py).

agent.py builds a production layer on top of this chapter (test_sessions_*.py);
these tests hold chapter 11 to what its README promises: a save appends only
what is new, in one write plus fsync; a new file is created exclusively and
privately; a tool call is saved together with all its results; a torn last line
is cut off on disk and a damaged one is reported and kept; only exact IDs reach
the filesystem; -c resends the history; -list counts each session's messages.
The chapter's fixes for hostile files (a whole last record without its
newline, a line nested too deep to parse, -list beside a FIFO or a dangling
link) also run against agent.py, which must keep them.

The program runs as a subprocess against the fake provider. Two checks need
instruments a subprocess cannot offer (write() calls per save, the flags of the
open that creates the file): they load the chapter in-process and spy on the
standard library, never on the program.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import re
import signal
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import load_program, run_agent, wait_for_file
from fake_provider import FakeProvider, Reply, sequence_error, text, tool_call, tool_calls
from helpers import (
    SESSION_ID,
    SESSION_ID_SHAPE,
    Live,
    appended,
    assert_batches_whole,
    assert_ok,
    assert_one_error_line,
    assert_sent,
    call,
    complete_lines,
    decoy_sessions,
    disk_messages,
    header_line,
    hint,
    kill_quietly,
    measure_save,
    message_line,
    new_session_id,
    put_session,
    resumed,
    session_bytes,
    session_file,
    snapshot,
    warnings,
    watch_creation,
)

CHAPTER = 11
both = pytest.mark.parametrize("chapter", [CHAPTER, "final"])  # the chapter's fixes, kept by agent.py
SYSTEM = {"role": "system", "content": "You are a coding agent."}
USER = {"role": "user", "content": "My name is Xiaoming; remember it"}
ANSWER = {"role": "assistant", "content": "Hello, Xiaoming! 你好"}


def record_bytes(*messages: dict) -> bytes:
    """The lines chapter 11 writes for these messages: json.dumps of each record, as it is."""
    return b"".join(json.dumps({"type": "message", "message": m}).encode() + b"\n" for m in messages)


def new_session(provider: FakeProvider, workdir: Path, task: str, *replies: Reply, stdin: str = "") -> Path:
    """A session the chapter's program writes itself; its file."""
    provider.script(*replies)
    result = run_agent(CHAPTER, task, provider=provider, cwd=workdir, stdin=stdin)
    assert_ok(result)
    session_id = new_session_id(result.stderr)
    assert result.stderr.splitlines()[-1] == hint(session_id), result.stderr
    return workdir / ".sessions" / f"{session_id}.jsonl"


def resume(provider: FakeProvider, workdir: Path, session_id: str, task: str, *replies: Reply, chapter=CHAPTER):
    provider.script(*replies)
    result = run_agent(chapter, "-c", session_id, task, provider=provider, cwd=workdir)
    assert_ok(result)
    assert result.stderr.splitlines()[-1] == hint(session_id), result.stderr
    return result


# ---------------------------------------------------------------- a save appends only what is new


def test_a_resume_appends_exactly_the_new_records(provider: FakeProvider, workdir: Path) -> None:
    (workdir / "notes.txt").write_text("名字: 小明\n", encoding="utf-8")
    path = new_session(provider, workdir, "Hi there", text("Hi! 你好"))
    before = path.read_bytes()
    assert disk_messages(path)[1:] == [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hi! 你好"},
    ]

    resume(
        provider,
        workdir,
        path.stem,
        "What is in notes.txt?",
        tool_call("read_file", {"path": "notes.txt"}, call_id="call_n1"),
        text("It says 小明."),
    )
    new = [
        {"role": "user", "content": "What is in notes.txt?"},
        {"role": "assistant", "content": None, "tool_calls": [call("call_n1", "read_file", '{"path": "notes.txt"}')]},
        {"role": "tool", "tool_call_id": "call_n1", "content": "名字: 小明\n"},
        {"role": "assistant", "content": "It says 小明."},
    ]
    # Byte for byte: the old file untouched, then the new records and nothing else.
    assert path.read_bytes() == before + record_bytes(*new)


@pytest.mark.skipif(not Path("/proc/thread-self/io").exists(), reason="needs Linux /proc/thread-self/io")
@pytest.mark.parametrize("length", [20, 3000])
def test_a_save_is_one_write_of_the_new_records_then_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, length: int
) -> None:
    save = measure_save(load_program(CHAPTER, tmp_path, monkeypatch), length, monkeypatch)
    assert len(disk_messages(save.path)) == length + 2
    assert save.after == save.before + record_bytes(*save.new)
    assert save.writes == 1, "a save must be exactly one write()"
    assert save.written == len(record_bytes(*save.new)), "a save writes only the new records"
    assert save.fsynced == [str(save.path)], save.fsynced
    assert save.idle_writes == 0 and save.idle_after == save.after  # nothing new: nothing written


# ---------------------------------------------------------------- a new file: exclusive and private


def test_a_new_session_is_private_whatever_the_umask(provider: FakeProvider, workdir: Path) -> None:
    path = new_session(provider, workdir, "hello", text("hi"))  # run with umask 022
    assert re.fullmatch(SESSION_ID_SHAPE, path.stem), path.stem
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    meta = complete_lines(path.read_bytes())[0][0]
    assert meta["type"] == "meta" and meta["id"] == path.stem and meta["version"] == 1
    assert "test-key-not-real" not in path.read_text()


def test_the_file_is_created_with_o_excl_and_mode_0600(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = load_program(CHAPTER, tmp_path, monkeypatch)
    created = watch_creation(agent, monkeypatch)  # under umask 0: the modes must come from the program
    assert len(created.opened) == 1, created.opened
    flags, mode = created.opened[0]
    assert flags & os.O_CREAT and flags & os.O_EXCL, "the session file must be created exclusively"
    assert mode == 0o600
    assert stat.S_IMODE(agent.SESSIONS.stat().st_mode) == 0o700
    assert stat.S_IMODE(created.path.stat().st_mode) == 0o600


def test_creation_never_reuses_an_existing_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """O_EXCL observed: when the chosen name exists, that file is left alone and the creation fails."""
    agent = load_program(CHAPTER, tmp_path, monkeypatch)
    decoys = decoy_sessions(agent, monkeypatch)
    with pytest.raises(FileExistsError):
        agent.create_session([SYSTEM, {"role": "user", "content": "hi"}])
    assert all(d.read_bytes() == b"precious bytes\n" for d in decoys)
    assert len(list(agent.SESSIONS.iterdir())) == len(decoys)


# ---------------------------------------------------------------- a tool call is saved with all its results


def test_kill_9_mid_tool_leaves_no_call_without_its_results(provider: FakeProvider, workdir: Path) -> None:
    (workdir / "notes.txt").write_text("buy milk\n", encoding="utf-8")
    batch = tool_calls(
        [("bash", {"command": "echo first"}), ("bash", {"command": "echo $$ > pid.txt && exec sleep 30"})],
        ids=["call_b1", "call_b2"],
    )
    provider.script(tool_call("read_file", {"path": "notes.txt"}, call_id="call_r1"), batch)
    sleeper = None
    with Live(CHAPTER, "Read, then run two commands", provider=provider, cwd=workdir, answers="y\n") as live:
        try:
            sleeper = int(wait_for_file(workdir / "pid.txt"))  # the batch's first command has run
            live.kill()
            code, _out, err = live.finish(timeout=30)
        finally:
            kill_quietly(sleeper)
    assert code == -signal.SIGKILL, err
    path = workdir / ".sessions" / f"{new_session_id(err)}.jsonl"
    stored = disk_messages(path)
    # Round 1 whole; of round 2 nothing, not the call message, not the result of `echo first`.
    assert [m["role"] for m in stored] == ["system", "user", "assistant", "tool"], stored
    assert stored[2]["tool_calls"] == [call("call_r1", "read_file", '{"path": "notes.txt"}')]
    assert stored[3] == {"role": "tool", "tool_call_id": "call_r1", "content": "buy milk\n"}
    assert b"call_b1" not in path.read_bytes()
    assert_batches_whole(stored)

    # So the history resumes as a valid conversation (the fake provider refuses any other).
    before = path.read_bytes()
    result = resume(provider, workdir, path.stem, "go on", text("Going on."))
    assert result.stdout == "Going on.\n"
    assert provider.chat_requests[-1]["messages"] == [*stored, {"role": "user", "content": "go on"}]
    assert sequence_error(provider.chat_requests[-1]["messages"]) is None
    assert appended(before, path.read_bytes()) == [
        {"type": "message", "message": {"role": "user", "content": "go on"}},
        {"type": "message", "message": {"role": "assistant", "content": "Going on."}},
    ]


# ---------------------------------------------------------------- a batch cut between a call and its results

# Chapter 13 replays compactions, chapter 19 saves the calls before they run, chapter 30 is the
# last chapter, and agent.py repairs the request: each must resume whatever the cut left.
TORN_BATCH_PROGRAMS = [CHAPTER, 12, 13, 19, 30, "final"]


def batch_session(provider: FakeProvider, workdir: Path, chapter: int | str) -> tuple[Path, bytes, list[int]]:
    """A session the program writes itself, with a round of two tool calls: its file, the
    file's bytes, and where each line of the batch starts, the end of the last result last."""
    (workdir / "a.txt").write_text("alpha 你好\n", encoding="utf-8")
    (workdir / "b.txt").write_text("beta 🎉\n", encoding="utf-8")
    provider.script(
        tool_calls([("read_file", {"path": "a.txt"}), ("read_file", {"path": "b.txt"})], ids=["call_a", "call_b"]),
        text("Both read."),
    )
    result = run_agent(chapter, "Read a.txt and b.txt", provider=provider, cwd=workdir)
    assert_ok(result)
    path = session_file(workdir, result.stderr)
    data = path.read_bytes()
    starts = [0] + [i + 1 for i, byte in enumerate(data) if byte == ord("\n")]
    records = complete_lines(data)[0]
    batch = next(i for i, r in enumerate(records) if (r.get("message") or {}).get("tool_calls"))
    assert [r["message"].get("tool_call_id") for r in records[batch + 1 : batch + 3]] == ["call_a", "call_b"]
    return path, data, starts[batch : batch + 4]


def held_after_cut(data: bytes, offset: int) -> list[dict]:
    """The messages of a file cut at offset that survive the cut whole: every line with its
    newline, and a last record that lacks only its newline (the loader keeps it)."""
    end = offset + 1 if data[offset : offset + 1] == b"\n" else data[:offset].rfind(b"\n") + 1
    return [r["message"] for r in complete_lines(data[:end])[0] if r["type"] == "message"]


@pytest.mark.parametrize("chapter", TORN_BATCH_PROGRAMS)
def test_a_batch_cut_between_a_call_and_its_results_still_resumes(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    """A save is one write of whole lines, but a write can stop anywhere: a file-size limit or a
    full disk exactly between two lines, a crash, a power cut. Cut inside the batch, the file
    holds a call without its result, and a resume must still send a valid history: every
    complete message, a stand-in result for each call the cut left unanswered, and the
    follow-up. A second resume finds the same. Here each record of the batch is cut at its
    start, in its middle and just before its newline; chapter 11 is cut at every byte below."""
    path, data, starts = batch_session(provider, workdir, chapter)
    offsets = sorted({*starts, *(o for s, e in itertools.pairwise(starts) for o in ((s + e) // 2, e - 1))})
    again = {starts[1], starts[2]}  # the call alone; the call and one of its two results
    for offset in offsets:
        path.write_bytes(data[:offset])
        held = held_after_cut(data, offset)
        for follow_up in ("next", "and again") if offset in again else ("next",):
            provider.replies.clear()  # a refused request leaves its reply unused
            provider.script(text("ok"))
            before = len(provider.chat_requests)
            result = run_agent(chapter, "-c", path.stem, follow_up, provider=provider, cwd=workdir)
            sent = provider.chat_requests[before:]
            context = f"cut at byte {offset} ({offset - starts[0]} into the batch), {follow_up!r}: {result.stderr}"
            assert result.returncode == 0 and result.stdout == "ok\n", context
            assert len(sent) == 1, context
            held.append({"role": "user", "content": follow_up})
            assert_sent(sent[0]["messages"], held)
            held.append({"role": "assistant", "content": "ok"})


def test_chapter_11_resumes_a_batch_cut_at_every_byte(
    provider: FakeProvider, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same as above at every byte of the batch. A start costs the program some 0.7 s of
    CPU (import openai) and the batch is some 600 bytes, so the resumes run in-process: the
    chapter's main() with -c, loaded once, over real HTTP to the fake provider."""
    path, data, starts = batch_session(provider, workdir, CHAPTER)
    agent = load_program(CHAPTER, workdir, monkeypatch)
    monkeypatch.setattr(agent, "BASE_URL", provider.url)  # it read the address at import
    failures: list[str] = []
    for offset in range(starts[0], starts[-1] + 1):
        path.write_bytes(data[:offset])
        provider.replies.clear()
        provider.script(text("ok"))
        before = len(provider.chat_requests)
        monkeypatch.setattr("sys.argv", ["agent.py", "-c", path.stem, "next"])
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                agent.main()
            sent = provider.chat_requests[before:]
            assert out.getvalue() == "ok\n" and len(sent) == 1, (out.getvalue(), len(sent))
            assert_sent(sent[0]["messages"], [*held_after_cut(data, offset), {"role": "user", "content": "next"}])
        except (AssertionError, SystemExit) as error:
            message = " ".join(f"{error!r} {err.getvalue()}".split())
            failures.append(f"cut at byte {offset} ({offset - starts[0]} into the batch): {message[:400]}")
            if len(failures) >= 5:
                break
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------- a torn last line; a damaged line


def test_a_torn_last_line_is_cut_off_on_disk_before_appending(provider: FakeProvider, workdir: Path) -> None:
    (workdir / "notes.txt").write_text("buy milk\n", encoding="utf-8")
    path = new_session(
        provider,
        workdir,
        "What do the notes say?",
        tool_call("read_file", {"path": "notes.txt"}, call_id="call_t1"),
        text("They say: buy milk."),
    )
    data = path.read_bytes()
    torn = data[:-12]  # a write cut short inside the last record
    boundary = torn.rfind(b"\n") + 1
    path.write_bytes(torn)
    complete = complete_lines(torn)[0]

    result = resume(provider, workdir, path.stem, "and then?", text("Nothing else."))
    assert warnings(result.stderr) == [
        f"warning: dropped an incomplete last line ({len(torn) - boundary} bytes) left by an interrupted write"
    ]
    first = [{"role": "user", "content": "and then?"}, {"role": "assistant", "content": "Nothing else."}]
    assert path.read_bytes() == data[:boundary] + record_bytes(*first), "the torn bytes were not cut off first"
    held = [r["message"] for r in complete[1:]]
    assert resumed(result.stderr) == (path.stem, len(held))

    # The second resume finds every line whole: no warning, nothing glued to the torn bytes.
    result = resume(provider, workdir, path.stem, "anything more?", text("No."))
    assert warnings(result.stderr) == []
    assert resumed(result.stderr) == (path.stem, len(held) + 2)
    assert provider.chat_requests[-1]["messages"] == [*held, *first, {"role": "user", "content": "anything more?"}]
    assert disk_messages(path) == [*held, *first, {"role": "user", "content": "anything more?"}] + [
        {"role": "assistant", "content": "No."}
    ]


def test_a_damaged_line_is_reported_by_number_and_kept(provider: FakeProvider, workdir: Path) -> None:
    lines = session_bytes(SYSTEM, USER, ANSWER).split(b"\n")
    lines.insert(2, b"this line is not JSON")  # line 3, between the system prompt and the question
    lines.insert(4, b"\0\0\0 caf\xe9")  # line 5: NULs and bytes that are not UTF-8
    data = b"\n".join(lines)
    path = put_session(workdir, data)

    result = resume(provider, workdir, SESSION_ID, "What is my name?", text("Xiaoming."))
    assert warnings(result.stderr) == [
        f"warning: skipped damaged line(s) 3, 5 of {SESSION_ID}.jsonl; they stay in the file"
    ]
    assert resumed(result.stderr) == (SESSION_ID, 3)
    assert provider.chat_requests[0]["messages"] == [
        SYSTEM,
        USER,
        ANSWER,
        {"role": "user", "content": "What is my name?"},
    ]
    after = path.read_bytes()
    assert after.split(b"\n")[2] == b"this line is not JSON" and after.split(b"\n")[4] == b"\0\0\0 caf\xe9"
    assert appended(data, after) == [
        {"type": "message", "message": {"role": "user", "content": "What is my name?"}},
        {"type": "message", "message": {"role": "assistant", "content": "Xiaoming."}},
    ]


@both
def test_a_last_record_without_its_newline_is_kept(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    """A whole last record whose newline is missing (a hand edit, an editor that strips it) is not
    a torn write: it is kept, and its newline added before anything is appended after it."""
    data = session_bytes(SYSTEM, USER, ANSWER)[:-1]
    path = put_session(workdir, data)
    result = resume(provider, workdir, SESSION_ID, "What is my name?", text("Xiaoming."), chapter=chapter)
    assert warnings(result.stderr) == []
    assert resumed(result.stderr) == (SESSION_ID, 3)
    question = {"role": "user", "content": "What is my name?"}
    assert provider.chat_requests[0]["messages"] == [SYSTEM, USER, ANSWER, question]
    assert appended(data + b"\n", path.read_bytes()) == [
        {"type": "message", "message": question},
        {"type": "message", "message": {"role": "assistant", "content": "Xiaoming."}},
    ]


@both
def test_a_deeply_nested_line_is_damaged_not_a_crash(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    """JSON nested deeper than the parser's recursion limit raises RecursionError, not ValueError:
    such a line, bare or shaped like a record, is one more damaged line, reported and kept."""
    depth = 50_000
    bare = b"[" * depth + b"]" * depth
    shaped = b'{"type": "message", "message": {"role": "user", "content": ' + bare + b"}}"
    lines = session_bytes(SYSTEM, USER, ANSWER).split(b"\n")
    lines.insert(3, bare)  # line 4
    lines.insert(5, shaped)  # line 6
    data = b"\n".join(lines)
    path = put_session(workdir, data)
    result = resume(provider, workdir, SESSION_ID, "What is my name?", text("Xiaoming."), chapter=chapter)
    assert warnings(result.stderr) == [
        f"warning: skipped damaged line(s) 4, 6 of {SESSION_ID}.jsonl; they stay in the file"
    ]
    assert resumed(result.stderr) == (SESSION_ID, 3)
    question = {"role": "user", "content": "What is my name?"}
    assert provider.chat_requests[0]["messages"] == [SYSTEM, USER, ANSWER, question]
    assert appended(data, path.read_bytes()) == [
        {"type": "message", "message": question},
        {"type": "message", "message": {"role": "assistant", "content": "Xiaoming."}},
    ]


# ---------------------------------------------------------------- only exact IDs


NOT_IDS = {
    "dot-dot": "../x",
    "a path to a real session": f"../.sessions/{SESSION_ID}",
    "absolute path": "/etc/passwd",
    "prefix": SESSION_ID[:15],
    "last": "last",
    "with .jsonl": f"{SESSION_ID}.jsonl",
    "uppercase hex": SESSION_ID.replace("56492195", "5649219A"),
    "empty": "",
    "300 characters": "7" * 300,
}


@pytest.mark.parametrize("wanted", list(NOT_IDS.values()), ids=list(NOT_IDS))
def test_only_an_exact_id_is_accepted(provider: FakeProvider, workdir: Path, wanted: str) -> None:
    put_session(workdir, session_bytes(SYSTEM, USER, ANSWER))
    before = snapshot(workdir.parent)
    result = run_agent(CHAPTER, "-c", wanted, "hi", provider=provider, cwd=workdir)
    assert_one_error_line(result, "is not a session ID")
    assert len(result.stderr) < 400, result.stderr  # one readable line, not the input echoed back at length
    assert snapshot(workdir.parent) == before
    assert provider.requests == []


def test_a_well_formed_unknown_id_is_an_error(provider: FakeProvider, workdir: Path) -> None:
    put_session(workdir, session_bytes(SYSTEM, USER, ANSWER))
    before = snapshot(workdir)
    result = run_agent(CHAPTER, "-c", "20261231-235959-00000000", "hi", provider=provider, cwd=workdir)
    assert_one_error_line(result, "no session 20261231-235959-00000000")
    assert snapshot(workdir) == before  # no new, empty session in its place
    assert provider.requests == []


# ---------------------------------------------------------------- -c resends the history; -list counts


def test_continue_resends_the_whole_history(provider: FakeProvider, workdir: Path) -> None:
    (workdir / "a.txt").write_text("alpha\n", encoding="utf-8")
    path = new_session(
        provider,
        workdir,
        "Read a.txt",
        tool_call("read_file", {"path": "a.txt"}, call_id="call_a", reasoning="I should look."),
        text("It says alpha."),
    )
    stored = disk_messages(path)
    assert [m["role"] for m in stored] == ["system", "user", "assistant", "tool", "assistant"]

    result = resume(provider, workdir, path.stem, "And in capitals?", text("ALPHA."))
    assert resumed(result.stderr) == (path.stem, 5)
    assert result.stdout == "ALPHA.\n"
    assert provider.chat_requests[-1]["messages"] == [*stored, {"role": "user", "content": "And in capitals?"}]


def test_list_prints_each_session_with_its_message_count(provider: FakeProvider, workdir: Path) -> None:
    result = run_agent(CHAPTER, "-list", provider=None, cwd=workdir)
    assert_ok(result, stdout="")  # no sessions yet: nothing to list

    real = new_session(provider, workdir, "hello", text("hi"))  # system, user, assistant
    book_id = "20200101-000000-00000000"  # sorts first
    put_session(
        workdir, header_line(book_id) + b"".join(message_line(m, compact=True) for m in [SYSTEM, USER]), book_id
    )
    damaged = "29991231-235959-ffffffff"  # sorts last
    data = session_bytes(SYSTEM, USER, ANSWER, {"role": "user", "content": "more"}, session_id=damaged)
    put_session(workdir, data + b"not a record\n", damaged)
    (workdir / ".sessions" / "README.txt").write_text("not a session\n")
    before = snapshot(workdir)

    result = run_agent(CHAPTER, "-list", provider=None, cwd=workdir, OPENAI_API_KEY=None, MODEL=None)
    assert_ok(result)
    assert result.stdout == f"{book_id}  2 messages\n{real.stem}  3 messages\n{damaged}  4 messages\n"
    assert snapshot(workdir) == before


@both
def test_list_skips_a_fifo_and_a_dangling_link_named_like_sessions(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    """Reading a FIFO waits for a writer that never comes, and a dangling link cannot be read:
    -list lists the regular files and finishes. Only the program opens the FIFO, and the run is
    killed if it has not finished in 30 s."""
    provider.script(text("hi"))
    result = run_agent(chapter, "hello", provider=provider, cwd=workdir)
    assert_ok(result)
    real = new_session_id(result.stderr)
    # Each before and after the real session, whichever order -list takes them in.
    for name in ("20200101-000000-0000ffff", "29991231-235959-ffff0000"):
        os.mkfifo(workdir / ".sessions" / f"{name}.jsonl")
    for name in ("20200101-000000-0000eeee", "29991231-235959-eeee0000"):
        os.symlink("gone.jsonl", workdir / ".sessions" / f"{name}.jsonl")
    try:
        result = run_agent(chapter, "-list", provider=None, cwd=workdir, timeout=30, OPENAI_API_KEY=None, MODEL=None)
    except subprocess.TimeoutExpired:
        pytest.fail("-list never finished: it is waiting on the FIFO")
    assert_ok(result)
    assert result.stderr == ""
    if chapter == CHAPTER:
        assert result.stdout == f"{real}  3 messages\n"
    else:
        assert [line.split()[0] for line in result.stdout.splitlines()] == [real], result.stdout
