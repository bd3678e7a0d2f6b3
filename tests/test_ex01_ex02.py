"""Chapters 1 and 2: one API call, then the same call streamed.

Each test runs the real program against the fake provider and checks what the
user sees, what reached the server, and the exit code.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import time

import pytest

from conftest import assert_clean_failure, run_agent, start_agent
from fake_provider import Reply, error, text

KEY = "test-key-not-real"


def status_line(prompt: int = 11, completion: int = 7, finish: str = "stop") -> str:
    return f"[input {prompt} tokens · output {completion} tokens · finish_reason={finish}]"


def free_port() -> int:
    """A port nothing listens on: bind to get one, then close it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_setup_guide(result: subprocess.CompletedProcess, secret: str | None = None) -> None:
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: OPENAI_API_KEY and MODEL must be set"), result.stderr
    for needle in ("DeepSeek", "api.deepseek.com", "Ollama", "localhost:11434"):
        assert needle in result.stderr, (needle, result.stderr)
    if secret:
        assert secret not in result.stderr + result.stdout


# ---------------------------------------------------------------- ex01


def test_ex01_answer_status_line_and_request(provider, workdir):
    provider.script(text("A JSONL file holds one JSON value per line.", prompt_tokens=21, completion_tokens=9))
    result = run_agent(1, "What is a JSONL file?", provider=provider, cwd=workdir)

    assert result.returncode == 0, result.stderr
    assert result.stdout == "A JSONL file holds one JSON value per line.\n"
    assert result.stderr == "\n" + status_line(21, 9) + "\n"

    assert len(provider.requests) == 1
    request = provider.requests[0]
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["authorization"] == f"Bearer {KEY}"
    body = request["body"]
    assert body["model"] == "test-model"
    assert body["max_tokens"] == 1024
    assert body["messages"] == [{"role": "user", "content": "What is a JSONL file?"}]
    assert not body.get("stream")


def test_ex01_finish_reason_length_is_shown(provider, workdir):
    provider.script(text("A JSONL file is", finish="length", completion_tokens=10))
    result = run_agent(1, "What is a JSONL file?", provider=provider, cwd=workdir)

    assert result.returncode == 0, result.stderr
    assert result.stdout == "A JSONL file is\n"
    assert result.stderr.splitlines()[-1] == status_line(11, 10, "length")


@pytest.mark.parametrize("args", [(), ("   ",)], ids=["none", "blank"])
def test_ex01_bad_arguments_print_usage(provider, workdir, args):
    result = run_agent(1, *args, provider=provider, cwd=workdir)
    assert_clean_failure(result, "usage:", "agent.py")
    assert result.stdout == ""
    assert provider.requests == []


@pytest.mark.parametrize("missing", ["OPENAI_API_KEY", "MODEL"])
def test_ex01_missing_config_prints_setup_guide(provider, workdir, missing):
    secret = "sk-secret-0123456789abcdef"
    env = {"OPENAI_API_KEY": secret, missing: None}
    result = run_agent(1, "hello", provider=provider, cwd=workdir, **env)
    assert_setup_guide(result, secret)
    assert provider.requests == []


def test_ex01_reads_dotenv_in_working_directory(provider, workdir):
    (workdir / ".env").write_text(
        f"OPENAI_API_KEY=dotenv-key\nMODEL=dotenv-model\nOPENAI_BASE_URL={provider.url}\n", encoding="utf-8"
    )
    provider.script(text("from dotenv"))
    result = run_agent(1, "hi", provider=provider, cwd=workdir, OPENAI_API_KEY=None, MODEL=None, OPENAI_BASE_URL=None)

    assert result.returncode == 0, result.stderr
    assert result.stdout == "from dotenv\n"
    assert provider.requests[0]["headers"]["authorization"] == "Bearer dotenv-key"
    assert provider.requests[0]["body"]["model"] == "dotenv-model"


def test_ex01_environment_wins_over_dotenv(provider, workdir):
    # The .env points at a closed port with a wrong key and model: if it won,
    # the request would never reach the provider, or carry the wrong values.
    (workdir / ".env").write_text(
        f"OPENAI_API_KEY=dotenv-key\nMODEL=dotenv-model\nOPENAI_BASE_URL=http://127.0.0.1:{free_port()}/v1\n",
        encoding="utf-8",
    )
    provider.script(text("from env"))
    result = run_agent(1, "hi", provider=provider, cwd=workdir, MODEL="env-model")

    assert result.returncode == 0, result.stderr
    assert result.stdout == "from env\n"
    assert provider.requests[0]["headers"]["authorization"] == f"Bearer {KEY}"
    assert provider.requests[0]["body"]["model"] == "env-model"


HTTP_ERRORS = [
    (401, "Authentication Fails", "check OPENAI_API_KEY"),
    (402, "Insufficient Balance", "balance"),
    (404, "model 'nope' not found", "check MODEL and OPENAI_BASE_URL"),
    (429, "Rate Limit Reached", "rate limited"),
    (500, "Server Error", "try again later"),
]


@pytest.mark.parametrize(("status", "message", "hint"), HTTP_ERRORS, ids=[str(e[0]) for e in HTTP_ERRORS])
def test_ex01_http_errors_fail_cleanly(provider, workdir, status, message, hint):
    provider.script(error(status))
    result = run_agent(1, "hi", provider=provider, cwd=workdir)

    assert_clean_failure(result)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: HTTP {status}: {message}"), lines[0]
    assert hint in lines[0]
    assert result.stdout == ""
    assert KEY not in result.stderr
    assert len(provider.requests) == 1  # x-should-retry: false, so no retries


def test_ex01_connection_refused_fails_cleanly(workdir):
    url = f"http://127.0.0.1:{free_port()}/v1"
    result = run_agent(1, "hi", provider=None, cwd=workdir, OPENAI_BASE_URL=url)
    assert_clean_failure(result, url, "OPENAI_BASE_URL")
    assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1, result.stderr
    assert result.stdout == ""


# ---------------------------------------------------------------- ex02


def read_until(proc: subprocess.Popen, needle: bytes, timeout: float = 30) -> bytes:
    """Read proc's stdout (raw fd, no line buffering) until needle appears."""
    fd = proc.stdout.fileno()
    data = b""
    deadline = time.monotonic() + timeout
    while needle not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{needle!r} never appeared; got {data!r}")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            piece = os.read(fd, 4096)
            if not piece:
                raise AssertionError(f"stdout closed before {needle!r} appeared; got {data!r}")
            data += piece
    return data


def test_ex02_text_is_printed_before_the_stream_ends(provider, workdir):
    answer = "Hello world, streaming"  # three pieces: "Hello wo" "rld, str" "eaming"
    # Events: role chunk, piece 1, then the server holds the stream.
    provider.script(text(answer, pause_after=2))
    proc = start_agent(2, "Say hello", provider=provider, cwd=workdir)
    try:
        provider.wait_paused()
        early = read_until(proc, b"Hello wo")
        # The server is still holding the rest, so this text came mid-stream.
        assert provider.paused.is_set() and not provider.gate.is_set()
        assert proc.poll() is None
        assert early == b"Hello wo"

        provider.release()
        rest, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert (early + rest).decode() == answer + "\n"
    assert err.decode() == "\n" + status_line() + "\n"


def test_ex02_request_asks_for_a_stream_with_usage(provider, workdir):
    provider.script(text("ok"))
    result = run_agent(2, "Explain TCP", provider=provider, cwd=workdir)

    assert result.returncode == 0, result.stderr
    request = provider.requests[0]
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["authorization"] == f"Bearer {KEY}"
    body = request["body"]
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 1024
    assert body["model"] == "test-model"
    assert body["messages"] == [{"role": "user", "content": "Explain TCP"}]


@pytest.mark.parametrize(
    ("style", "expected"),
    [
        ("deepseek", status_line(123, 45)),
        ("openai", status_line(123, 45)),
        ("none", "[input ? tokens · output ? tokens · finish_reason=stop]"),
    ],
)
def test_ex02_usage_in_status_line(provider, workdir, style, expected):
    provider.script(text("Streamed answer.", usage_style=style, prompt_tokens=123, completion_tokens=45))
    result = run_agent(2, "hi", provider=provider, cwd=workdir)

    assert result.returncode == 0, result.stderr
    assert result.stdout == "Streamed answer.\n"
    assert result.stderr == "\n" + expected + "\n"


def test_ex02_keepalive_comments_are_harmless(provider, workdir):
    provider.script(text("Still here.", keepalive=3))
    result = run_agent(2, "hi", provider=provider, cwd=workdir)

    assert result.returncode == 0, result.stderr
    assert result.stdout == "Still here.\n"
    assert result.stderr == "\n" + status_line() + "\n"


def test_ex02_finish_reason_length_is_shown(provider, workdir):
    provider.script(text("Cut short", finish="length"))
    result = run_agent(2, "hi", provider=provider, cwd=workdir)

    assert result.returncode == 0, result.stderr
    assert result.stdout == "Cut short\n"
    assert result.stderr.splitlines()[-1] == status_line(finish="length")


ANSWER = "Partial answer here"  # pieces: "Partial" " answer" " here"

CUT_STREAMS = [
    # A connection that breaks mid-stream is an APIConnectionError: the line names the server.
    pytest.param(Reply(content=ANSWER, cut_after=2, cut_mode="broken"), "127.0.0.1", id="broken"),
    pytest.param(Reply(content=ANSWER, cut_after=2, cut_mode="close"), "stream ended", id="close"),
    pytest.param(Reply(content=ANSWER, finish=None), "stream ended", id="no-finish"),
    pytest.param(Reply(content=ANSWER, error_after=2), "stream interrupted by the fake provider", id="error-line"),
]


@pytest.mark.parametrize(("reply", "needle"), CUT_STREAMS)
def test_ex02_incomplete_stream_fails_cleanly(provider, workdir, reply, needle):
    provider.script(reply)
    result = run_agent(2, "hi", provider=provider, cwd=workdir)

    assert_clean_failure(result, needle)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "finish_reason" not in result.stderr  # no success summary
    # Whatever arrived before the cut may be on stdout, and nothing else.
    assert ANSWER.startswith(result.stdout.strip()), result.stdout
    if reply.finish is not None:
        assert result.stdout.strip() == "Partial"  # role chunk + first piece arrived
    else:
        assert result.stdout.strip() == ANSWER


@pytest.mark.parametrize(("status", "message", "hint"), [HTTP_ERRORS[0], HTTP_ERRORS[4]], ids=["401", "500"])
def test_ex02_http_errors_fail_cleanly(provider, workdir, status, message, hint):
    provider.script(error(status))
    result = run_agent(2, "hi", provider=provider, cwd=workdir)

    assert_clean_failure(result, f"HTTP {status}: {message}", hint)
    assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1, result.stderr
    assert result.stdout.strip() == ""
    assert len(provider.requests) == 1
