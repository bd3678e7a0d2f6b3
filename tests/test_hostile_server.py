"""Hostile input, part 2: the server is the attacker, byte by byte (agent.py).

A proxy, a small self-hosted server or a hostile endpoint can send anything
down the stream: keep-alive comments or empty events and nothing else,
lines that are not JSON, not UTF-8 or nested too deep, fields of the wrong
type, a lone surrogate or a pair cut in two, escape sequences in an error
message, kilobytes or megabytes of it. Each must end the turn with one
`error:` line and the resume hint (or be harmless), never a traceback or a
hang; every round completed before it stays saved, and the session resumes.
The agent's own stdout may fail too (a closed pipe, a full device): the answer
is still saved; and a stdout read slowly is no stalled server.

The streams are raw bytes (fake_provider.raw and sse) sent over real HTTP to
the real agent.py, run as a subprocess with a timeout, so a broken defence
fails its test instead of hanging the suite.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import json
import signal
import socket
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import conftest
from conftest import TEST_KEY, hermetic_env, run_agent
from fake_provider import FakeProvider, Reply, chunk, error, raw, sequence_error, sse, text, tool_call
from helpers import (
    Live,
    assert_no_control,
    assert_ok,
    assert_one_error_line,
    disk_messages,
    error_lines,
    hint,
    new_session_id,
    read_until,
    resumed,
    stderr_lines,
)

TASK = "Answer, please."


def piece(**fields: object) -> bytes:
    """A tool-call fragment; the fields given replace the well-formed ones."""
    fragment = {"index": 0, "id": "call_x", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    return chunk({"tool_calls": [{**fragment, **fields}]})


def assert_clean_stop(result: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 1, one `error:` line (with the needles), the resume hint last, no traceback. Returns the session ID."""
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    errors = error_lines(result.stderr)
    assert len(errors) == 1, result.stderr
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    session_id = new_session_id(result.stderr)
    assert stderr_lines(result.stderr)[-1] == hint(session_id), result.stderr
    return session_id


FIRST = tool_call("bash", {"command": "pwd"}, call_id="first")  # a complete round before the trouble
DONE = b"data: [DONE]\n\n"
END = chunk({}, "stop") + DONE


def first_round(workdir: Path) -> list[dict]:
    return [
        {"role": "system"},
        {"role": "user", "content": TASK},
        {"role": "assistant", "tool_calls": ["first"]},
        {"role": "tool", "tool_call_id": "first", "content": f"{workdir}\n"},
    ]


def assert_saved(stored: list[dict], expected: list[dict]) -> None:
    """The stored messages, in the few fields that identify them."""
    shapes = [
        {
            "role": m["role"],
            **({"content": m["content"]} if m["role"] in ("user", "tool") else {}),
            **({"tool_calls": [c["id"] for c in m["tool_calls"]]} if m.get("tool_calls") else {}),
            **({"tool_call_id": m["tool_call_id"]} if m["role"] == "tool" else {}),
        }
        for m in stored
    ]
    assert shapes == expected, stored


def resume(provider: FakeProvider, workdir: Path, session_id: str) -> list[dict]:
    """-c the session: it must load, send a valid conversation and answer. Returns what is stored."""
    provider.replies.clear()
    provider.script(text("Recovered."))
    result = run_agent("final", "-c", session_id, "again", provider=provider, cwd=workdir, timeout=60)
    assert_ok(result, "Recovered.\n")
    assert resumed(result.stderr)[0] == session_id
    sent = provider.chat_requests[-1]["messages"]
    assert sequence_error(sent) is None, sent
    stored = disk_messages(workdir / ".sessions" / f"{session_id}.jsonl")
    assert stored[-2:] == [{"role": "user", "content": "again"}, {"role": "assistant", "content": "Recovered."}]
    return stored


# ---------------------------------------------------------------- 9. keep-alive comments and nothing else


def test_a_stream_that_only_keeps_alive_ends_after_stream_timeout(provider: FakeProvider, workdir: Path) -> None:
    """One chunk of text, then ": keep-alive" comments forever: each resets the SDK's read timeout,
    so only STREAM_TIMEOUT ends it. One error line, the hint, exit 1; round 1 stays saved."""
    provider.script(FIRST, text("half an answer that never ends", pieces=4, keepalive_after=2))
    started = time.monotonic()
    result = run_agent("final", TASK, provider=provider, cwd=workdir, timeout=30, STREAM_TIMEOUT="1")
    elapsed = time.monotonic() - started
    session_id = assert_clean_stop(result, "no progress from", "for 1 s", "keep-alives and empty events do not count")
    assert result.stdout == "half an \n"
    assert elapsed < 15, elapsed
    stored = disk_messages(workdir / ".sessions" / f"{session_id}.jsonl")
    assert_saved(stored, first_round(workdir))


def test_a_server_that_never_answers_ends_after_stream_timeout(workdir: Path) -> None:
    """It takes the connection and the request, then says nothing, not even a status line: the
    timer runs from the request on, and its Stalled is no Exception the SDK would catch and retry."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)  # the kernel completes the connections; nobody accepts or answers them
        url = f"http://127.0.0.1:{server.getsockname()[1]}/v1"
        started = time.monotonic()
        result = run_agent(
            "final", TASK, provider=None, cwd=workdir, timeout=30, STREAM_TIMEOUT="1", OPENAI_BASE_URL=url
        )
        elapsed = time.monotonic() - started
    session_id = assert_clean_stop(result, f"no progress from {url} for 1 s")
    assert elapsed < 15, elapsed
    assert [m["role"] for m in disk_messages(workdir / ".sessions" / f"{session_id}.jsonl")] == ["system", "user"]


@contextlib.contextmanager
def dripping(first: list[bytes], event: bytes) -> Iterator[str]:
    """A server that answers a streamed request with the events `first`, then sends `event` every
    0.2 s until the client leaves (30 s at most): never silent, yet never getting anywhere.
    Yields its base URL."""
    stop = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            self.rfile.read(int(self.headers.get("content-length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for data in first:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                for _ in range(150):
                    if stop.wait(0.2):  # the pace of the drip, or the end of the test
                        break
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                    self.wfile.flush()
            except OSError:  # the client has gone
                pass
            self.close_connection = True

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "event", [sse({"choices": []}), sse({}), chunk({})], ids=["choices is empty", "an empty object", "an empty delta"]
)
def test_empty_events_sent_forever_end_after_stream_timeout(workdir: Path, event: bytes) -> None:
    """An event every 0.2 s that says nothing: it resets the SDK's read timeout, never STREAM_TIMEOUT's."""
    with dripping([], event) as url:
        started = time.monotonic()
        result = run_agent(
            "final", TASK, provider=None, cwd=workdir, timeout=20, STREAM_TIMEOUT="1", OPENAI_BASE_URL=url
        )
        elapsed = time.monotonic() - started
    session_id = assert_clean_stop(result, f"no progress from {url} for 1 s")
    assert elapsed < 10, elapsed
    assert [m["role"] for m in disk_messages(workdir / ".sessions" / f"{session_id}.jsonl")] == ["system", "user"]


def test_empty_events_after_the_finish_chunk_do_not_lose_the_answer(workdir: Path) -> None:
    """The answer and its finish chunk, then empty events forever: the answer stands, exit 0."""
    with dripping([chunk({"content": "The answer."}), chunk({}, "stop")], sse({"choices": []})) as url:
        result = run_agent(
            "final", TASK, provider=None, cwd=workdir, timeout=20, STREAM_TIMEOUT="1", OPENAI_BASE_URL=url
        )
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert result.stdout == "The answer.\n" and error_lines(result.stderr) == []
    stored = disk_messages(workdir / ".sessions" / f"{new_session_id(result.stderr)}.jsonl")
    assert stored[-1] == {"role": "assistant", "content": "The answer."}


LONG_ANSWER = "".join(f"{i:07d} {'w' * 91}\n" for i in range(2000))  # 200,000 bytes, lines of 100


def test_a_slow_reader_of_stdout_is_no_stalled_server(provider: FakeProvider, workdir: Path) -> None:
    """stdout is a pipe that nobody reads until it is full (64 KiB, with 200 KB of answer to come),
    and then for 1.5 s more, with STREAM_TIMEOUT=1: the agent waits in a write to stdout, not for
    the server, so the clock does not run. Read then, the whole answer comes, exit 0, no error."""
    provider.script(text(LONG_ANSWER, pieces=20))
    with Live("final", TASK, provider=provider, cwd=workdir, STREAM_TIMEOUT="1") as live:
        out = live.proc.stdout.fileno()
        capacity = fcntl.fcntl(out, fcntl.F_GETPIPE_SZ)
        deadline, waiting = time.monotonic() + 30, array.array("i", [0])
        # Until the pipe is full: within a page of its capacity, since a write that does not fit
        # in the room left in the last page starts a new one.
        while fcntl.ioctl(out, termios.FIONREAD, waiting) or waiting[0] < capacity - 4096:
            assert time.monotonic() < deadline and live.proc.poll() is None, (waiting[0], capacity)
            time.sleep(0.01)
        time.sleep(1.5)  # the agent blocked in write() for longer than STREAM_TIMEOUT: the time itself is the test
        result = live.completed(timeout=30)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert error_lines(result.stderr) == []
    assert result.stdout == LONG_ANSWER + "\n"
    stored = disk_messages(workdir / ".sessions" / f"{new_session_id(result.stderr)}.jsonl")
    assert stored[-1] == {"role": "assistant", "content": LONG_ANSWER}


def test_a_reply_past_the_turn_cap_ends_with_one_error_line(provider: FakeProvider, workdir: Path) -> None:
    """1.1 million characters of text in 11 events: more than max_tokens allows, so a server gone wrong."""
    provider.script(raw(*[chunk({"content": "a" * 100_000})] * 11, END))
    result = run_agent("final", TASK, provider=provider, cwd=workdir, timeout=60)
    session_id = assert_clean_stop(result, "the reply passed 1,000,000 characters")
    assert [m["role"] for m in disk_messages(workdir / ".sessions" / f"{session_id}.jsonl")] == ["system", "user"]


@pytest.mark.parametrize("value", ["abc", "0", "-5", "inf", "nan", "1e999", "1e10"])
def test_a_bad_stream_timeout_is_one_clean_error(provider: FakeProvider, workdir: Path, value: str) -> None:
    provider.script(text("never asked"))
    result = run_agent("final", TASK, provider=provider, cwd=workdir, timeout=30, STREAM_TIMEOUT=value)
    assert_one_error_line(result, "STREAM_TIMEOUT", repr(value))
    assert provider.requests == []
    assert not (workdir / ".sessions").exists()


# ---------------------------------------------------------------- 10. malformed chunks

TEXT = chunk({"role": "assistant", "content": "partial "})
MALFORMED = {
    # Each a stream that must end the turn with one error line. A finish chunk follows where it
    # would make sense, so the error is the bad chunk's and not that of a stream left unfinished.
    "not JSON": [TEXT, b"data: {not json\n\n", END],
    "not UTF-8": [TEXT, b'data: {"choices": [{"index": 0, "delta": {"content": "caf\xe9"}}]}\n\n', END],
    "content is 5": [TEXT, chunk({"content": 5}), END],
    "arguments is 7": [piece(function={"name": "bash", "arguments": 7}), chunk({}, "tool_calls"), DONE],
    "choices is a string": [TEXT, sse({"id": "c", "object": "chat.completion.chunk", "choices": "oops"}), END],
    "tool_calls is a string": [chunk({"tool_calls": "x"}), chunk({}, "tool_calls"), DONE],
    "index is a word": [piece(index="first"), chunk({}, "tool_calls"), DONE],
    "an event with no data": [TEXT, b"event: ping\n\n", END],
    "a chunk that is a JSON list": [TEXT, sse([1, 2, 3]), END],
    "JSON nested 100,000 deep": [TEXT, b"data: " + b"[" * 100_000 + b"]" * 100_000 + b"\n\n", END],
}
# These go through: the chunk says nothing wrong, says it in a way the SDK repairs, or
# (usage) holds only what the status line shows, where anything but a number becomes "?".
HARMLESS = {
    "delta is null": [TEXT, chunk(None), END],
    "no delta": [TEXT, sse({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0}]}), END],
    "index is the string 0": [piece(index="0"), chunk({}, "tool_calls"), DONE],
    "usage is a string": [TEXT, chunk({}, "stop", usage="lots"), DONE],
}


@pytest.mark.parametrize("case", [*MALFORMED, *HARMLESS])
def test_a_malformed_chunk_ends_the_turn_cleanly_and_the_session_resumes(
    provider: FakeProvider, workdir: Path, case: str
) -> None:
    malformed = case in MALFORMED
    provider.script(FIRST, raw(*(MALFORMED if malformed else HARMLESS)[case]), text("after a harmless oddity"))
    result = run_agent("final", TASK, provider=provider, cwd=workdir, timeout=60)
    assert "Traceback" not in result.stderr, result.stderr
    assert_no_control("stderr", result.stderr)
    if malformed:
        session_id = assert_clean_stop(result)
        assert error_lines(result.stderr)[0].startswith(
            ("error: the server sent a malformed stream", "error: the stream")
        )
        stored = disk_messages(workdir / ".sessions" / f"{session_id}.jsonl")
        assert_saved(stored, first_round(workdir))  # round 1 whole, nothing of round 2
    else:
        assert result.returncode == 0 and error_lines(result.stderr) == [], result.stderr
        session_id = new_session_id(result.stderr)
        stored = disk_messages(workdir / ".sessions" / f"{session_id}.jsonl")
        assert_saved(stored[:4], first_round(workdir))
        assert sequence_error(stored) is None, stored  # whatever round 2 made of it is a valid conversation
    after = resume(provider, workdir, session_id)
    assert after[: len(stored)] == stored


AFTER_FINISH = {"not JSON": b"data: not-json\n\n", "choices is an object": sse({"choices": {}})}


@pytest.mark.parametrize("line", AFTER_FINISH)
def test_a_malformed_line_after_the_finish_chunk_keeps_the_answer(
    provider: FakeProvider, workdir: Path, line: str
) -> None:
    provider.script(raw(chunk({"content": "The answer."}), chunk({}, "stop"), AFTER_FINISH[line], DONE))
    result = run_agent("final", TASK, provider=provider, cwd=workdir, timeout=60)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert result.stdout == "The answer.\n" and error_lines(result.stderr) == []
    stored = disk_messages(workdir / ".sessions" / f"{new_session_id(result.stderr)}.jsonl")
    assert stored[-1] == {"role": "assistant", "content": "The answer."}


# ---------------------------------------------------------------- lone surrogates

LONE = {
    # A lone surrogate escaped in the JSON of the stream (\ud800): valid JSON, but no UTF-8 can hold it.
    "in a tool call's arguments": [
        piece(id="call_s", function={"name": "bash", "arguments": '{"command": "echo \ud800"}'}),
        chunk({}, "tool_calls"),
        DONE,
    ],
    "half an emoji ending the text": [chunk({"content": "smile \ud83d"}), chunk({}, "stop"), DONE],
}


@pytest.mark.parametrize("case", list(LONE))
def test_a_lone_surrogate_from_the_stream_leaves_a_session_that_can_go_on(
    provider: FakeProvider, workdir: Path, case: str
) -> None:
    """The run ends normally, and every later request, in this run and in a -c of it, is valid
    UTF-8 JSON the server accepts."""
    provider.script(raw(*LONE[case]), text("Done."))
    result = run_agent("final", TASK, provider=provider, cwd=workdir, timeout=60)
    assert result.returncode == 0 and error_lines(result.stderr) == [], result.stderr
    resume(provider, workdir, new_session_id(result.stderr))
    for request in provider.requests:
        assert isinstance(json.loads(request["raw"].decode("utf-8")), dict)


def test_a_surrogate_pair_split_across_chunks_is_sent_joined(provider: FakeProvider, workdir: Path) -> None:
    """The two halves of 😀, escaped, in two chunks of the answer (\\ud83d, then \\ude00), as a server
    that cuts UTF-16 text between code units sends them, with a tool call after them: the next
    request of the run, and that of a -c of it, carry the emoji whole as UTF-8, and the session
    file gives it back whole."""
    call_ = piece(id="call_p", function={"name": "bash", "arguments": json.dumps({"command": "pwd"})})
    halves = [chunk({"content": "smile \ud83d"}), chunk({"content": "\ude00 done"})]
    # And in a write_file call's arguments: the file gets the emoji, as UTF-8.
    write = piece(
        index=1, id="call_w", function={"name": "write_file", "arguments": '{"path": "e.txt", "content": "\ud83d'}
    )
    rest = piece(index=1, id="call_w", function={"arguments": '\ude00"}'})
    provider.script(raw(*halves, call_, write, rest, chunk({}, "tool_calls"), DONE), text("Done."))
    result = run_agent("final", TASK, provider=provider, cwd=workdir, timeout=60)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert error_lines(result.stderr) == []
    assert result.stdout.startswith("smile 😀 done"), result.stdout  # shown whole, not as two ?
    assert (workdir / "e.txt").read_text(encoding="utf-8") == "😀"
    session_id = new_session_id(result.stderr)
    assert disk_messages(workdir / ".sessions" / f"{session_id}.jsonl")[2]["content"] == "smile 😀 done"
    resume(provider, workdir, session_id)
    assert len(provider.requests) == 3
    for request in provider.requests[1:]:
        assert json.loads(request["raw"].decode("utf-8"))["messages"][2]["content"] == "smile 😀 done"


# ---------------------------------------------------------------- a stdout that fails


ANSWER = "0123456789 and the rest of the answer"


def test_a_closed_pipe_on_stdout_keeps_the_answer(provider: FakeProvider, workdir: Path) -> None:
    """`agent.py task | head -c 5` (sh, so no pipefail): head has gone when the rest of the answer
    comes. The agent says so in one warning and goes on (exit 0), no
    traceback, and the whole answer is in the session."""
    provider.script(FIRST, text(ANSWER, pieces=4, pause_after=2))
    pipeline = '{ "$0" "$1" "$2"; echo "$?" > agent.status; } | { head -c 5; exec <&-; echo "[head is gone]" >&2; }'
    argv = ["sh", "-c", pipeline, sys.executable, str(conftest.program("final")), TASK]
    process = subprocess.Popen(
        argv,
        cwd=workdir,
        env=hermetic_env(provider, workdir.parent),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        provider.wait_paused()
        seen = read_until(process.stderr, b"[head is gone]")  # and so is the read end of the pipe
        provider.release()
        out, err = process.communicate(timeout=60)
    finally:
        provider.release()
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=30)
    stderr = (seen + err).decode()
    assert out == b"01234"
    assert "Traceback" not in stderr, stderr
    status = (workdir / "agent.status").read_text()
    assert status == "0\n" and error_lines(stderr) == [], (status, stderr)
    assert any(line.startswith("warning: stdout failed") for line in stderr_lines(stderr)), stderr
    stored = disk_messages(workdir / ".sessions" / f"{new_session_id(stderr)}.jsonl")
    assert stored[-1] == {"role": "assistant", "content": ANSWER}


@pytest.mark.parametrize("redirect", [">&-", ">/dev/full"], ids=["closed", "/dev/full"])
def test_a_closed_or_full_stdout_keeps_the_answer(provider: FakeProvider, workdir: Path, redirect: str) -> None:
    """Started with stdout closed (`>&-`: Python has no sys.stdout, and prints go nowhere), or on a
    full device (one warning): exit 0, and the session holds the round and the answer."""
    provider.script(FIRST, text(ANSWER))
    done = subprocess.run(
        ["sh", "-c", f'exec "$@" {redirect}', "sh", sys.executable, str(conftest.program("final")), TASK],
        cwd=workdir,
        env=hermetic_env(provider, workdir.parent),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith(("warning:", "error:"))]
    assert said == (
        []
        if redirect == ">&-"
        else ["warning: stdout failed (No space left on device); the answer is kept in the session"]
    ), said
    stored = disk_messages(workdir / ".sessions" / f"{new_session_id(done.stderr)}.jsonl")
    assert_saved(stored[:4], first_round(workdir))
    assert stored[4:] == [{"role": "assistant", "content": ANSWER}]


# ---------------------------------------------------------------- 2 and 17. what a server says is shown safely

OSC52 = "\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGV8c2g=\x07"


@pytest.mark.parametrize(
    "reply, needle",
    [
        (error(400, f"bad request{OSC52}\x1b[2J\x1b[3J\u202edetaeler\r\x9b2K"), r"bad request\x1b]52;c;Y3Vyb"),
        (error(400, "x" * 18_000), "x" * 300 + "… [17,700 more characters]"),
        (
            raw(chunk({"content": "partial"}), sse({"error": {"message": f"boom{OSC52}" + "y" * 18_000}})),
            r"boom\x1b]52",
        ),
    ],
    ids=["escapes", "18 KB", "an error event with escapes, 18 KB"],
)
def test_a_server_error_message_is_escaped_and_shortened(
    provider: FakeProvider, workdir: Path, reply: Reply, needle: str
) -> None:
    """An HTTP error body or an error event in the stream: one error line, no raw control character
    on stderr, and no longer than a line should be, whatever the server sent."""
    provider.script(reply)
    result = run_agent("final", TASK, provider=provider, cwd=workdir, timeout=60)
    assert_clean_stop(result, needle)
    assert_no_control("stderr", result.stderr)
    assert_no_control("stdout", result.stdout)
    assert max(len(line) for line in result.stderr.splitlines()) < 2048


def test_token_counts_that_are_not_numbers_never_reach_the_terminal(provider: FakeProvider, workdir: Path) -> None:
    """The usage a server reports is printed in the status lines: only numbers get there."""
    usage = {
        "prompt_tokens": f"{OSC52}\x1b[2J",
        "completion_tokens": 1,
        "prompt_cache_hit_tokens": "\x1b[1A\r",
        "prompt_tokens_details": {"cached_tokens": "\x1b]0;owned\x07"},
    }
    call_ = piece(id="call_u", function={"name": "bash", "arguments": json.dumps({"command": "pwd"})})
    provider.script(
        raw(call_, chunk({}, "tool_calls", usage=usage), DONE),
        raw(chunk({"content": "Done."}), chunk({}, "stop", usage=usage), DONE),
    )
    result = run_agent("final", TASK, provider=provider, cwd=workdir, timeout=60)
    assert result.returncode == 0 and result.stdout == "Done.\n", result.stderr
    assert_no_control("stderr", result.stderr)
    assert "[round 1 input ? tokens, 0 cached]" in result.stderr.splitlines()
    assert "[2 rounds · last round input ? tokens (0 cached) · finish_reason=stop]" in result.stderr.splitlines()


def test_a_server_that_echoes_the_key_does_not_get_it_printed(provider: FakeProvider, workdir: Path) -> None:
    provider.script(error(401, f"Incorrect API key provided: {TEST_KEY}. Find your key at ..."))
    result = run_agent("final", TASK, provider=provider, cwd=workdir, timeout=60)
    assert_clean_stop(result, "HTTP 401")
    assert TEST_KEY not in result.stderr + result.stdout


# ---------------------------------------------------------------- 15. stopped mid-stream


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stop_signal_mid_stream_exits_130_with_the_rounds_saved(
    provider: FakeProvider, workdir: Path, number: int
) -> None:
    """kill, or a closed terminal, while the answer streams: exit 130, the hint, round 1 on disk."""
    provider.script(FIRST, text("a long answer that is cut short", pieces=5, pause_after=3))
    try:
        with Live("final", TASK, provider=provider, cwd=workdir) as live:
            provider.wait_paused(timeout=30)
            live.wait_stdout("a long answer")
            live.signal(number)
            result = live.completed(timeout=30)
    finally:
        provider.release()
    assert result.returncode == 130, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    session_id = new_session_id(result.stderr)
    lines = stderr_lines(result.stderr)
    assert lines[-1] == hint(session_id) and lines[-2].startswith("interrupted"), result.stderr
    assert_saved(disk_messages(workdir / ".sessions" / f"{session_id}.jsonl"), first_round(workdir))
