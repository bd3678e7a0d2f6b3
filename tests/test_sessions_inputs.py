"""Sessions: a table of bad and odd inputs (agent.py).

Bad inputs are errors: one `error:` line on stderr, exit 1, no traceback,
nothing changed on disk, no request to the provider. Odd files must load
(guarantees 4, 5, 7 and 10): the resume succeeds, the history sent passes the
fake provider's DeepSeek sequence validation (on by default: a 400 would fail
the run), and the file only grows by the new records.

The real agent.py runs as a subprocess against the fake provider; one
exhaustive check of the in-memory repair loads agent.py in-process, with
end-to-end samples of the same cases below it.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import run_agent
from fake_provider import FakeProvider, sequence_error, text, tool_call
from helpers import (
    SESSION_ID,
    appended,
    assert_ok,
    assert_one_error_line,
    call,
    error_lines,
    header_line,
    message_line,
    put_session,
    resumed,
    session_bytes,
    snapshot,
    warnings,
)

ID = SESSION_ID
OTHER_ID = "20260802-101010-0badf00d"
NOBODY = 65534

SYSTEM = {"role": "system", "content": "You are a coding agent."}
USER = {"role": "user", "content": "My name is Xiaoming; remember it"}
ANSWER = {"role": "assistant", "content": "Hello, Xiaoming!"}
FOLLOW_UP = "What is my name?"


# ---------------------------------------------------------------- helpers


def new_records(task: str, answer: str) -> list[dict]:
    return [
        {"type": "message", "message": {"role": "user", "content": task}},
        {"type": "message", "message": {"role": "assistant", "content": answer}},
    ]


# ---------------------------------------------------------------- bad input: clean errors


def two_sessions(workdir: Path) -> None:
    put_session(workdir, session_bytes(SYSTEM, USER, ANSWER))
    put_session(workdir, session_bytes(SYSTEM, USER, ANSWER, session_id=OTHER_ID), session_id=OTHER_ID)


def jsonl_is_a_directory(workdir: Path) -> None:
    two_sessions(workdir)
    (workdir / ".sessions" / "20260803-111111-deadbeef.jsonl").mkdir()


def sessions_is_a_file(workdir: Path) -> None:
    (workdir / ".sessions").write_text("I am not a directory\n")


def sessions_is_a_dangling_link(workdir: Path) -> None:
    (workdir / ".sessions").symlink_to(workdir / "gone" / "away")


def no_sessions(workdir: Path) -> None:
    (workdir / ".sessions").mkdir(mode=0o700)


# (name, setup, arguments, words the error line must contain)
ERRORS = [
    ("unknown ID", two_sessions, ["-c", "20261231-235959-00000000", "hi"], ["20261231-235959-00000000"]),
    ("unknown prefix", two_sessions, ["-c", "2027", "hi"], ["2027"]),
    ("last without sessions", no_sessions, ["-c", "last", "hi"], []),
    ("last without .sessions", lambda w: None, ["-c", "last", "hi"], []),
    ("dot-dot", two_sessions, ["-c", "../x", "hi"], []),
    ("dot-dot to a real file", two_sessions, ["-c", f"../.sessions/{ID}", "hi"], []),
    ("slash", two_sessions, ["-c", "a/b", "hi"], []),
    ("absolute path", two_sessions, ["-c", "/etc/passwd", "hi"], []),
    ("ID with .jsonl", two_sessions, ["-c", f"{ID}.jsonl", "hi"], []),
    ("ID with a newline", two_sessions, ["-c", f"{ID}\n", "hi"], []),
    ("uppercase hex", two_sessions, ["-c", ID.upper().replace("56492195", "5649219A"), "hi"], []),
    ("empty ID", two_sessions, ["-c", "", "hi"], []),
    ("300-character ID", two_sessions, ["-c", "7" * 300, "hi"], []),
    ("jsonl is a directory", jsonl_is_a_directory, ["-c", "20260803-111111-deadbeef", "hi"], ["20260803-111111"]),
    (".sessions is a file, -c", sessions_is_a_file, ["-c", ID, "hi"], [".sessions"]),
    (".sessions is a file, -list", sessions_is_a_file, ["-list"], [".sessions"]),
    (".sessions is a file, new session", sessions_is_a_file, ["a new task"], [".sessions"]),
    (".sessions is a dangling link, new session", sessions_is_a_dangling_link, ["a new task"], [".sessions"]),
]


@pytest.mark.parametrize(("setup", "args", "needles"), [case[1:] for case in ERRORS], ids=[c[0] for c in ERRORS])
def test_bad_input_is_one_clean_error(
    provider: FakeProvider, workdir: Path, setup: Callable[[Path], None], args: list[str], needles: list[str]
) -> None:
    setup(workdir)
    (workdir / "notes.txt").write_text("a file of the project\n")
    before = snapshot(workdir)
    result = run_agent("final", *args, provider=provider, cwd=workdir)
    assert_one_error_line(result, *needles)
    assert len(result.stderr) < 300, result.stderr  # one readable line, not the input echoed back
    assert result.stdout == ""
    assert snapshot(workdir) == before
    assert provider.requests == []
    assert not (workdir.parent / "x").exists() and not (workdir / "a").exists()


# -c ID without a follow-up is no error: it resumes the session as a conversation (tests/test_ex24.py).
USAGE_ERRORS = [
    ("-c without an ID", ["-c"]),
    ("-c ID with a blank follow-up", ["-c", ID, "   "]),
    ("--continue without an ID", ["--continue"]),
]


@pytest.mark.parametrize("args", [case[1] for case in USAGE_ERRORS], ids=[c[0] for c in USAGE_ERRORS])
def test_incomplete_command_line_prints_usage(provider: FakeProvider, workdir: Path, args: list[str]) -> None:
    two_sessions(workdir)
    before = snapshot(workdir)
    result = run_agent("final", *args, provider=provider, cwd=workdir)
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    # One `error: usage: ...` line, or (the allowed exception) a usage block.
    lines = result.stderr.splitlines()
    one_line = len(lines) == 1 and lines[0].startswith("error:") and "usage" in lines[0]
    assert one_line or result.stderr.startswith("usage:"), result.stderr
    assert "-c ID" in result.stderr, result.stderr
    assert result.stdout == ""
    assert snapshot(workdir) == before
    assert provider.requests == []


# ---------------------------------------------------------------- permissions: run as an unprivileged user


def venv_site_packages() -> str:
    import dotenv

    return str(Path(dotenv.__file__).resolve().parent.parent)


def unprivileged_python() -> str | None:
    """An interpreter uid 65534 can run that finds this environment's packages, or None."""
    candidates = [
        sys.executable,
        shutil.which("python3"),
        f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}",
    ]
    check = f"import sys, dotenv; assert sys.version_info[:2] == {tuple(sys.version_info[:2])}"
    for python in dict.fromkeys(c for c in candidates if c):
        try:
            probe = subprocess.run(
                [python, "-c", check],
                cwd="/",
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": venv_site_packages()},
                user=NOBODY,
                group=NOBODY,
                extra_groups=[],
                capture_output=True,
                timeout=60,
            )
        except OSError:
            continue
        if probe.returncode == 0:
            return python
    return None


@pytest.fixture
def restricted():
    """(workdir, run): a working directory and a runner for which permissions really apply.

    As an ordinary user, chmod is enough. As root (CI), chmod 000 does not stop
    reads, so the agent runs as uid 65534 in a workdir that user can reach.
    """
    if os.geteuid() != 0:
        base = Path(tempfile.mkdtemp(prefix="agent-perm-"))
        work = base / "work"
        work.mkdir()

        def run(provider, *args):
            return run_agent("final", *args, provider=provider, cwd=work)

        try:
            yield work, run, None
        finally:
            for path in [base, *base.rglob("*")]:
                if not path.is_symlink():
                    path.chmod(0o700)
            shutil.rmtree(base)
        return
    python = unprivileged_python()
    if python is None:
        pytest.skip(
            "running as root, where chmod 000 does not stop reads, and uid 65534 cannot run a Python "
            "that imports this environment's packages"
        )
    base = Path(tempfile.mkdtemp(prefix="agent-perm-"))
    base.chmod(0o755)
    work = base / "work"
    work.mkdir()
    os.chown(work, NOBODY, NOBODY)

    def run(provider, *args):
        return run_agent(
            "final",
            *args,
            provider=provider,
            cwd=work,
            python=python,
            options={"user": NOBODY, "group": NOBODY, "extra_groups": []},
            PYTHONPATH=venv_site_packages(),
        )

    try:
        yield work, run, NOBODY
    finally:
        shutil.rmtree(base)


def give(path: Path, owner: int | None) -> None:
    if owner is not None:
        os.chown(path, owner, owner)


def test_unreadable_session_file(provider: FakeProvider, restricted) -> None:
    workdir, run, owner = restricted
    sessions = workdir / ".sessions"
    sessions.mkdir(mode=0o700)
    give(sessions, owner)
    locked = put_session(workdir, session_bytes(SYSTEM, USER, ANSWER))
    readable = put_session(workdir, session_bytes(SYSTEM, USER, ANSWER, session_id=OTHER_ID), session_id=OTHER_ID)
    for path in (locked, readable):
        give(path, owner)
    locked.chmod(0o000)
    before = snapshot(workdir)

    result = run(provider, "-c", ID, FOLLOW_UP)
    assert_one_error_line(result, ID)
    assert snapshot(workdir) == before
    assert provider.requests == []

    # -list still lists both: the unreadable one says so instead of failing.
    result = run(None, "-list")
    assert_ok(result)
    listed = result.stdout.splitlines()
    assert len(listed) == 2, result.stdout
    assert any(text_.startswith(ID) and "unreadable" in text_ for text_ in listed), result.stdout
    assert any(text_.startswith(OTHER_ID) and " 3 messages" in text_ for text_ in listed), result.stdout
    assert snapshot(workdir) == before


def test_sessions_directory_cannot_be_created(provider: FakeProvider, restricted) -> None:
    workdir, run, owner = restricted
    if owner is not None:
        os.chown(workdir, 0, 0)  # the unprivileged user may not create anything here
    workdir.chmod(0o555)
    before = snapshot(workdir)
    result = run(provider, "a new task")
    assert_one_error_line(result, ".sessions")
    assert snapshot(workdir) == before
    assert provider.requests == []


# ---------------------------------------------------------------- full disk on save


def file_size_limit(limit: int) -> Callable[[], None]:
    """preexec_fn: a file may not grow past `limit` bytes. Python ignores SIGXFSZ, so write() fails with EFBIG."""

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_full_disk_when_saving_the_follow_up(provider: FakeProvider, workdir: Path) -> None:
    path = put_session(workdir, session_bytes(SYSTEM, USER, ANSWER))
    before = path.read_bytes()
    provider.script(text("never asked"))
    result = run_agent(
        "final",
        "-c",
        ID,
        FOLLOW_UP,
        provider=provider,
        cwd=workdir,
        options={"preexec_fn": file_size_limit(len(before) + 20)},
    )
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert len(error_lines(result.stderr)) == 1, result.stderr
    assert error_lines(result.stderr)[0].startswith("error: cannot save session"), result.stderr
    assert provider.requests == []  # nothing is asked before the question is on disk
    assert path.read_bytes() == before  # the partial record was taken back

    provider.replies.clear()
    provider.script(text("Your name is Xiaoming."))
    result = run_agent("final", "-c", ID, FOLLOW_UP, provider=provider, cwd=workdir)
    assert_ok(result)
    assert resumed(result.stderr) == (ID, 3)
    assert warnings(result.stderr) == []
    assert appended(before, path.read_bytes()) == new_records(FOLLOW_UP, "Your name is Xiaoming.")


def test_full_disk_in_the_middle_of_a_run(provider: FakeProvider, workdir: Path) -> None:
    (workdir / "big.txt").write_text("x" * 10_000)
    path = put_session(workdir, session_bytes(SYSTEM, USER, ANSWER))
    before = path.read_bytes()
    user_record = message_line({"role": "user", "content": "Read big.txt"})
    provider.script(tool_call("read_file", {"path": "big.txt"}, call_id="call_big"), text("never asked"))
    # Room for the question, not for the round with the 10 KB tool result.
    limit = file_size_limit(len(before) + len(user_record) + 2000)
    result = run_agent("final", "-c", ID, "Read big.txt", provider=provider, cwd=workdir, options={"preexec_fn": limit})
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert len(error_lines(result.stderr)) == 1, result.stderr
    assert "cannot save session" in error_lines(result.stderr)[0], result.stderr
    hint = f"[session {ID} — continue with: -c {ID}]"
    assert result.stderr.splitlines()[-1] == hint, result.stderr  # the rounds before it are safe: say how to go on
    assert len(provider.chat_requests) == 1
    # The question is on disk, and the call, saved before it ran; the results that could not be
    # written are not, not even in part.
    call_record = message_line(
        {"role": "assistant", "content": None, "tool_calls": [call("call_big", "read_file", '{"path": "big.txt"}')]}
    )
    assert path.read_bytes() == before + user_record + call_record

    provider.replies.clear()
    provider.script(text("It is ten thousand x."))
    result = run_agent("final", "-c", ID, "Try again", provider=provider, cwd=workdir)
    assert_ok(result)
    assert resumed(result.stderr) == (ID, 5)
    assert warnings(result.stderr) == []
    assert provider.chat_requests[-1]["messages"][1:] == [
        USER,
        ANSWER,
        {"role": "user", "content": "Read big.txt"},
        {"role": "assistant", "content": None, "tool_calls": [call("call_big", "read_file", '{"path": "big.txt"}')]},
        {"role": "tool", "tool_call_id": "call_big", "content": "error: no result (the run was interrupted)"},
        {"role": "user", "content": "Try again"},
    ]


def test_full_disk_for_a_new_session(provider: FakeProvider, workdir: Path) -> None:
    provider.script(text("never asked"))
    result = run_agent(
        "final", "a new task", provider=provider, cwd=workdir, options={"preexec_fn": file_size_limit(100)}
    )
    assert_one_error_line(result)
    assert provider.requests == []
    assert list((workdir / ".sessions").glob("*")) == []  # no empty or half-written session left behind


# ---------------------------------------------------------------- odd files that must load


def crlf(data: bytes) -> bytes:
    return data.replace(b"\n", b"\r\n")


BIG = "0123456789abcdef" * (20 * 1024 * 1024 // 16)  # a 20 MB tool result is legal
SEPARATORS = {"role": "user", "content": "line\u2028separator and\u2029paragraph, still one message"}
NON_UTF8 = b'{"type": "message", "message": {"role": "user", "content": "caf\xe9"}}'
GLUED = message_line({"role": "user", "content": "glued"}).rstrip(b"\n") + message_line(
    {"role": "assistant", "content": "x"}
)

# name -> (file bytes, messages the loader must keep, damaged line numbers it must name)
ODD = {
    "empty file": (b"", [], []),
    "header only": (header_line(), [], []),
    "no header": (b"".join(message_line(m) for m in (SYSTEM, USER, ANSWER)), [SYSTEM, USER, ANSWER], []),
    "bad JSON in the middle": (
        session_bytes(SYSTEM, USER)
        + b'{"type": "message", "message": {"role": "assistant", "cont\n'
        + message_line(ANSWER),
        [SYSTEM, USER, ANSWER],
        [4],
    ),
    "non-UTF-8 line": (
        session_bytes(SYSTEM, USER) + NON_UTF8 + b"\n" + message_line(ANSWER),
        [SYSTEM, USER, ANSWER],
        [4],
    ),
    "NUL run line": (
        session_bytes(SYSTEM) + b"\0" * 4096 + b"\n" + message_line(USER) + message_line(ANSWER),
        [SYSTEM, USER, ANSWER],
        [3],
    ),
    "unknown record type": (
        session_bytes(SYSTEM, USER) + b'{"type": "title", "title": "names"}\n' + message_line(ANSWER),
        [SYSTEM, USER, ANSWER],
        [4],
    ),
    "two records glued": (session_bytes(SYSTEM, USER) + GLUED + message_line(ANSWER), [SYSTEM, USER, ANSWER], [4]),
    "two damaged lines": (
        session_bytes(SYSTEM) + b"garbage\n" + message_line(USER) + b"\0\0\0\n" + message_line(ANSWER),
        [SYSTEM, USER, ANSWER],
        [3, 5],
    ),
    "CRLF line endings": (crlf(session_bytes(SYSTEM, USER, ANSWER)), [SYSTEM, USER, ANSWER], []),
    "U+2028 and U+2029 in content": (session_bytes(SYSTEM, SEPARATORS, ANSWER), [SYSTEM, SEPARATORS, ANSWER], []),
    "20 MB message": (
        session_bytes(SYSTEM, USER, {"role": "assistant", "content": BIG}),
        [SYSTEM, USER, {"role": "assistant", "content": BIG}],
        [],
    ),
}


BIG_WINDOW = {"CONTEXT_WINDOW": "100000000"}
KEEPS_WORKING = {"empty file", "header only", "no header", "two damaged lines", "CRLF line endings"}


@pytest.mark.parametrize("case", list(ODD))
def test_odd_file_loads(provider: FakeProvider, workdir: Path, case: str) -> None:
    data, kept, damaged = ODD[case]
    if case == "U+2028 and U+2029 in content":
        assert "\u2028".encode() in data and b"\\u2028" not in data  # raw in the file, where splitlines() would split
    path = put_session(workdir, data)
    provider.script(text("Your name is Xiaoming."))
    # The window is not what this test is about: one the 20 MB message fits, so nothing is compacted.
    result = run_agent("final", "-c", ID, FOLLOW_UP, provider=provider, cwd=workdir, timeout=180, **BIG_WINDOW)
    assert_ok(result)
    assert resumed(result.stderr) == (ID, len(kept))

    # Damage is reported by line number, once; undamaged files get no warning at all.
    if damaged:
        assert len(warnings(result.stderr)) == 1, result.stderr
        numbers = [int(n) for n in re.findall(r"\b(\d+)\b", warnings(result.stderr)[0].split(ID)[0])]
        assert numbers == damaged, result.stderr
    else:
        assert warnings(result.stderr) == [], result.stderr

    # The valid history went out, intact, followed by the new question.
    sent = provider.chat_requests[0]["messages"]
    if kept:
        assert sent == [*kept, {"role": "user", "content": FOLLOW_UP}]
    else:
        assert [m["role"] for m in sent] == ["system", "user"] and sent[1]["content"] == FOLLOW_UP

    # On disk: the old bytes untouched (damaged lines included), then the new records.
    after = path.read_bytes()
    if not data:
        meta = json.loads(after.split(b"\n", 1)[0])
        assert meta["type"] == "meta" and meta["id"] == ID, after[:300]
        data = after.split(b"\n", 1)[0] + b"\n"
    assert appended(data, after) == new_records(FOLLOW_UP, "Your name is Xiaoming.")

    # And it keeps working where the first append had something to get right: the next resume
    # sees the new messages too, with the same warning.
    if case not in KEEPS_WORKING:
        return
    provider.script(text("Still Xiaoming."))
    result = run_agent("final", "-c", ID, "Again?", provider=provider, cwd=workdir, timeout=180, **BIG_WINDOW)
    assert_ok(result)
    assert resumed(result.stderr) == (ID, len(kept) + 2)
    assert len(warnings(result.stderr)) == (1 if damaged else 0), result.stderr


def test_u2028_round_trip_through_a_new_session(provider: FakeProvider, workdir: Path) -> None:
    task = "first\u2028second\u2029third\r\nfourth \\u2028 literal"
    provider.script(text("a\u2028b"), text("done"))
    result = run_agent("final", task, provider=provider, cwd=workdir)
    assert_ok(result)
    session_id = re.match(r"\[new session (\S+)\]", result.stderr).group(1)
    result = run_agent("final", "-c", session_id, "next", provider=provider, cwd=workdir)
    assert_ok(result)
    assert resumed(result.stderr) == (session_id, 3)
    assert warnings(result.stderr) == []
    sent = provider.chat_requests[-1]["messages"]
    assert sent[1:] == [
        {"role": "user", "content": task},
        {"role": "assistant", "content": "a\u2028b"},
        {"role": "user", "content": "next"},
    ]


# ---------------------------------------------------------------- guarantee 5: always a valid conversation


def calling(*ids: str) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [call(i) for i in ids]}


def result_of(call_id: str, content: str = "alpha") -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


LATER = {"role": "user", "content": "never mind, something else"}
LATER_ANSWER = {"role": "assistant", "content": "Sure."}

# name -> (messages in the file, what must be sent; SYNTHETIC marks a made-up result for that call)
SYNTHETIC = "synthetic"
REPAIRS = {
    "call without results, then a user message": (
        [SYSTEM, USER, calling("c1"), LATER, LATER_ANSWER],
        [SYSTEM, USER, calling("c1"), (SYNTHETIC, "c1"), LATER, LATER_ANSWER],
    ),
    "call without results at the end": (
        [SYSTEM, USER, calling("c1")],
        [SYSTEM, USER, calling("c1"), (SYNTHETIC, "c1")],
    ),
    "one of two parallel calls answered": (
        [SYSTEM, USER, calling("c1", "c2"), result_of("c2"), LATER, LATER_ANSWER],
        [SYSTEM, USER, calling("c1", "c2"), result_of("c2"), (SYNTHETIC, "c1"), LATER, LATER_ANSWER],
    ),
    "orphan tool message": (
        [SYSTEM, USER, result_of("ghost"), ANSWER],
        [SYSTEM, USER, ANSWER],
    ),
    "duplicate tool result": (
        [SYSTEM, USER, calling("c1"), result_of("c1"), result_of("c1", "again"), ANSWER],
        [SYSTEM, USER, calling("c1"), result_of("c1"), ANSWER],
    ),
    "result after an intervening user message": (
        [SYSTEM, USER, calling("c1"), LATER, result_of("c1"), LATER_ANSWER],
        [SYSTEM, USER, calling("c1"), (SYNTHETIC, "c1"), LATER, LATER_ANSWER],
    ),
}


def assert_repaired(sent: list[dict], expected: list) -> None:
    assert len(sent) == len(expected), json.dumps(sent, indent=1)
    for got, want in zip(sent, expected, strict=True):
        if isinstance(want, tuple):
            assert got["role"] == "tool" and got["tool_call_id"] == want[1], got
            assert isinstance(got["content"], str) and got["content"].startswith("error:"), got
        else:
            assert got == want


@pytest.mark.parametrize("case", list(REPAIRS))
def test_broken_tool_sequences_are_repaired_in_memory(provider: FakeProvider, workdir: Path, case: str) -> None:
    stored, expected = REPAIRS[case]
    path = put_session(workdir, session_bytes(*stored))
    before = path.read_bytes()
    provider.script(text("Done."))
    result = run_agent("final", "-c", ID, FOLLOW_UP, provider=provider, cwd=workdir)
    assert_ok(result)  # the fake provider answers 400 to an invalid sequence
    assert resumed(result.stderr) == (ID, len(stored))
    sent = provider.chat_requests[0]["messages"]
    assert sequence_error(sent) is None
    assert sent[-1] == {"role": "user", "content": FOLLOW_UP}
    assert_repaired(sent[:-1], expected)
    # The repair lives in the request only: the file just gained the new records.
    assert appended(before, path.read_bytes()) == new_records(FOLLOW_UP, "Done.")


def test_every_short_history_becomes_a_valid_request(loaded) -> None:
    """Exhaustive over every history of up to 5 messages from an alphabet of normal and broken pieces:
    the request always passes DeepSeek's checks (thinking mode too), keeps every non-tool message in
    order, keeps each first real answer to a pending call, and invents a result only for unanswered calls.
    A call id used twice in the request is renamed, its results with it: every id is unique."""
    thought = {"reasoning_content": "thinking..."}
    alphabet = [
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "plain", **thought},
        {"role": "assistant", "content": None, "tool_calls": [call("a")], **thought},
        {"role": "assistant", "content": None, "tool_calls": [call("a"), call("b")], **thought},
        {"role": "assistant", "content": "", "tool_calls": []},
        result_of("a"),
        result_of("b"),
        result_of("zzz"),
    ]

    def stripped(message: dict) -> dict:
        if message["role"] != "assistant":
            return message
        out = dict(message)
        if not out.get("tool_calls"):
            out.pop("tool_calls", None)
            out.pop("reasoning_content", None)
        return out

    checked = renamed = 0
    for length in range(6):
        for combination in itertools.product(alphabet, repeat=length):
            history = [SYSTEM, *(dict(m) for m in combination)]
            sent = loaded.sendable(history)
            problem = sequence_error(sent, thinking=True)
            assert problem is None, (problem, history, sent)
            ids = [c["id"] for m in sent for c in m.get("tool_calls") or []]
            assert len(set(ids)) == len(ids) and all(isinstance(i, str) and i for i in ids), (history, sent)

            # The reference, walking the history and the request's non-tool messages side by side:
            # each call keeps its id unless an earlier call in the request has it (then the request
            # gives it a fresh one); which tool messages answer a call still pending, under the id
            # sent; how many calls go unanswered.
            others = iter(m for m in sent if m["role"] != "tool")
            used: set[str] = set()
            kept_tools, unanswered, pending = [], 0, []  # pending: (stored id, sent id)
            for message in history:
                if message["role"] == "tool":
                    match = next((p for p in pending if p[0] == message["tool_call_id"]), None)
                    if match:
                        pending.remove(match)
                        kept_tools.append({**message, "tool_call_id": match[1]})
                    continue
                unanswered += len(pending)
                pending = []
                out = next(others)
                stored_calls = message.get("tool_calls") or []
                sent_calls = out.get("tool_calls") or []
                assert len(sent_calls) == len(stored_calls), (history, sent)
                for stored_call, sent_call in zip(stored_calls, sent_calls, strict=True):
                    if stored_call["id"] in used:
                        assert sent_call["id"] not in used, (history, sent)
                        renamed += 1
                    else:
                        assert sent_call["id"] == stored_call["id"], (history, sent)
                    assert sent_call == {**stored_call, "id": sent_call["id"]}, (history, sent)
                    used.add(sent_call["id"])
                    pending.append((stored_call["id"], sent_call["id"]))
                with_sent_ids = {**message, "tool_calls": sent_calls} if stored_calls else message
                assert out == stripped(with_sent_ids), (history, sent)
            unanswered += len(pending)
            assert next(others, None) is None, (history, sent)

            real = [m for m in sent if m["role"] == "tool" and m in kept_tools]
            made_up = [m for m in sent if m["role"] == "tool" and m not in kept_tools]
            assert real == kept_tools, (history, sent)
            assert len(made_up) == unanswered, (history, sent)
            assert all(m["content"].startswith("error:") for m in made_up), sent
            assert history == [SYSTEM, *combination]  # the repair does not touch the loaded history
            checked += 1
    assert checked == sum(len(alphabet) ** n for n in range(6))
    assert renamed > 0  # histories that call "a" twice are among them


def test_parse_keeps_valid_records_around_every_kind_of_damage(loaded) -> None:
    """In-process, every damaged-line kind at every position of a 5-message file (end to end samples above)."""
    messages = [SYSTEM, USER, ANSWER, {"role": "user", "content": "more"}, {"role": "assistant", "content": "ok"}]
    bad_lines = [
        b"garbage",
        b"\0" * 100,
        NON_UTF8,
        b'{"type": "title", "title": "t"}',
        GLUED.rstrip(b"\n"),
        b'{"type": "message", "message": {"content": "no role"}}',
        b'{"type": "message", "message": "a string"}',
        b'{"type": "message", "message": {"role": "wizard", "content": "x"}}',
        b'{"type": "message", "message": {"role": "assistant", "tool_calls": [{"no": "id"}]}}',
        b"[1, 2, 3]",
        b'"just a string"',
        b'{"type": "meta", "id": "late header"}',
    ]
    for bad in bad_lines:
        for position in range(1, len(messages) + 1):
            lines = [message_line(m) for m in messages]
            lines.insert(position, bad + b"\n")
            data = header_line() + b"".join(lines)
            for variant in (data, crlf(data)):
                parsed, damaged = loaded.parse_session(variant)
                assert parsed == messages, (bad, position)
                assert damaged == [position + 2], (bad, position, damaged)


AUDIT: list[tuple[str, tuple]] | None = None  # filesystem events while a check is running


def _audit(event: str, args: tuple) -> None:
    if AUDIT is not None and (event == "open" or event.startswith(("os.", "shutil."))):
        AUDIT.append((event, args))


sys.addaudithook(_audit)  # audit hooks cannot be removed: this one records only while AUDIT is a list

MALFORMED_IDS = [
    "",
    ".",
    "..",
    "../x",
    "a/b",
    "/etc/passwd",
    f"../.sessions/{ID}",
    f"{ID}.jsonl",
    f"{ID}\n",
    f" {ID}",
    f"{ID}/",
    ID.upper().replace("56492195", "5649219A"),
    f"{ID}0",  # 25 characters: longer than any ID
    "7" * 300,
    "LAST",
    "last/..",
    "~",
    "*",
    "2026080?",
    "\0",
    f"{ID}\0",
    "20260801_090720_56492195",
    "２０２６",  # full-width digits: \d would accept them, an ID must not
]


@pytest.mark.parametrize("wanted", MALFORMED_IDS, ids=[repr(w)[:40] for w in MALFORMED_IDS])
def test_a_malformed_id_never_reaches_the_filesystem(loaded, wanted: str) -> None:
    """Guarantee 7, instrumented: a malformed ID is refused before any open, listing or stat-by-name."""
    global AUDIT
    put_session(loaded.WORKDIR, session_bytes(SYSTEM, USER, ANSWER))
    AUDIT = []
    try:
        with pytest.raises(loaded.Failure) as caught:
            loaded.open_session(wanted)
        events = AUDIT
    finally:
        AUDIT = None
    assert events == [], events
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 200, str(caught.value)


def test_a_well_formed_unknown_id_only_lists_the_directory(loaded) -> None:
    global AUDIT
    put_session(loaded.WORKDIR, session_bytes(SYSTEM, USER, ANSWER))
    AUDIT = []
    try:
        with pytest.raises(loaded.Failure):
            loaded.open_session("20261231-235959-00000000")
        events = AUDIT
    finally:
        AUDIT = None
    # One listing of .sessions, nothing else: Path.iterdir() lists with os.listdir before
    # Python 3.13 and with os.scandir from 3.13 on. No open, no stat, nothing by name.
    assert len(events) == 1, events
    event, args = events[0]
    assert event in ("os.listdir", "os.scandir"), events
    assert os.fspath(args[0]) == str(loaded.SESSIONS), events
