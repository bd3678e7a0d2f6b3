"""Chapters 1 and 2: one API call, then the same call streamed.

Each test runs the real program against the fake provider and checks what the
user sees, what reached the server, and the exit code. What agent.py inherits
from these chapters (configuration, error lines, streaming, a cut stream is a
failure) is also run against agent.py ("final").
"""

from __future__ import annotations

import pytest

from conftest import TEST_KEY, assert_clean_failure, run_agent
from fake_provider import Reply, error, text
from helpers import (
    Live,
    assert_setup_guide,
    chapter_output,
    conversation,
    free_port,
    status_line,
    stderr_lines,
    summary,
)

KEY = TEST_KEY


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


@pytest.mark.parametrize("chapter", [1, "final"])
@pytest.mark.parametrize("missing", ["OPENAI_API_KEY", "MODEL"])
def test_ex01_missing_config_prints_setup_guide(provider, workdir, chapter, missing):
    secret = "sk-secret-0123456789abcdef"
    env = {"OPENAI_API_KEY": secret, missing: None}
    result = run_agent(chapter, "hello", provider=provider, cwd=workdir, **env)
    assert_setup_guide(result, secret)
    assert provider.requests == []


@pytest.mark.parametrize("chapter", [1, "final"])
def test_ex01_reads_dotenv_in_working_directory(provider, workdir, chapter):
    (workdir / ".env").write_text(
        f"OPENAI_API_KEY=dotenv-key\nMODEL=dotenv-model\nOPENAI_BASE_URL={provider.url}\n", encoding="utf-8"
    )
    provider.script(text("from dotenv"))
    env = {"OPENAI_API_KEY": None, "MODEL": None, "OPENAI_BASE_URL": None}
    result = run_agent(chapter, "hi", provider=provider, cwd=workdir, **env)

    assert result.returncode == 0, result.stderr
    assert result.stdout == "from dotenv\n"
    assert provider.requests[0]["headers"]["authorization"] == "Bearer dotenv-key"
    assert provider.requests[0]["body"]["model"] == "dotenv-model"


@pytest.mark.parametrize("chapter", [1, "final"])
def test_ex01_environment_wins_over_dotenv(provider, workdir, chapter):
    # The .env points at a closed port with a wrong key and model: if it won,
    # the request would never reach the provider, or carry the wrong values.
    (workdir / ".env").write_text(
        f"OPENAI_API_KEY=dotenv-key\nMODEL=dotenv-model\nOPENAI_BASE_URL=http://127.0.0.1:{free_port()}/v1\n",
        encoding="utf-8",
    )
    provider.script(text("from env"))
    result = run_agent(chapter, "hi", provider=provider, cwd=workdir, MODEL="env-model")

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


@pytest.mark.parametrize("chapter", [1, "final"])
@pytest.mark.parametrize(("status", "message", "hint"), HTTP_ERRORS, ids=[str(e[0]) for e in HTTP_ERRORS])
def test_ex01_http_errors_fail_cleanly(provider, workdir, chapter, status, message, hint):
    provider.script(error(status))
    result = chapter_output(chapter, run_agent(chapter, "hi", provider=provider, cwd=workdir))

    assert_clean_failure(result)
    lines = stderr_lines(result.stderr)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: HTTP {status}: {message}"), lines[0]
    assert hint in lines[0]
    assert result.stdout == ""
    assert KEY not in result.stderr
    assert len(provider.requests) == 1  # x-should-retry: false, so no retries


@pytest.mark.parametrize("chapter", [1, "final"])
def test_ex01_connection_refused_fails_cleanly(workdir, chapter):
    url = f"http://127.0.0.1:{free_port()}/v1"
    result = chapter_output(chapter, run_agent(chapter, "hi", provider=None, cwd=workdir, OPENAI_BASE_URL=url))
    assert_clean_failure(result, url, "OPENAI_BASE_URL")
    assert len(stderr_lines(result.stderr)) == 1, result.stderr
    assert result.stdout == ""


# ---------------------------------------------------------------- ex02


@pytest.mark.parametrize("chapter", [2, "final"])
def test_ex02_text_is_printed_before_the_stream_ends(provider, workdir, chapter):
    answer = "Hello world, streaming"  # three pieces: "Hello wo" "rld, str" "eaming"
    # Events: role chunk, piece 1, then the server holds the stream.
    provider.script(text(answer, pause_after=2))
    with Live(chapter, "Say hello", provider=provider, cwd=workdir) as live:
        provider.wait_paused()
        live.wait_stdout("Hello wo")
        # The server is still holding the rest, so this text came mid-stream.
        assert provider.paused.is_set() and not provider.gate.is_set()
        assert live.proc.poll() is None
        assert live.out == b"Hello wo"

        provider.release()
        result = chapter_output(chapter, live.completed())
    assert result.returncode == 0, result.stderr
    assert result.stdout == answer + "\n"
    if chapter == 2:
        assert result.stderr == "\n" + status_line() + "\n"
    else:  # one closing line all the same: agent.py's summary
        assert summary(chapter, result.stderr) == ("1", "11", "0", "stop"), result.stderr
        assert len(stderr_lines(result.stderr)) == 1, result.stderr


@pytest.mark.parametrize("chapter", [2, "final"])
def test_ex02_request_asks_for_a_stream_with_usage(provider, workdir, chapter):
    provider.script(text("ok"))
    result = run_agent(chapter, "Explain TCP", provider=provider, cwd=workdir)

    assert result.returncode == 0, result.stderr
    request = provider.requests[0]
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["authorization"] == f"Bearer {KEY}"
    body = request["body"]
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == (1024 if chapter == 2 else 4096)  # chapter 5 raised it for tool rounds
    assert body["model"] == "test-model"
    assert conversation(chapter, body["messages"]) == [{"role": "user", "content": "Explain TCP"}]


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


@pytest.mark.parametrize("chapter", [2, "final"])
def test_ex02_finish_reason_length_is_shown(provider, workdir, chapter):
    provider.script(text("Cut short", finish="length"))
    result = chapter_output(chapter, run_agent(chapter, "hi", provider=provider, cwd=workdir))

    assert result.returncode == 0, result.stderr
    assert result.stdout == "Cut short\n"
    if chapter == 2:
        assert result.stderr.splitlines()[-1] == status_line(finish="length")
    else:
        assert summary(chapter, result.stderr)[3] == "length"


ANSWER = "Partial answer here"  # pieces: "Partial" " answer" " here"

CUT_STREAMS = [
    # A connection that breaks mid-stream is an APIConnectionError: the line names the server.
    pytest.param(Reply(content=ANSWER, cut_after=2, cut_mode="broken"), "127.0.0.1", id="broken"),
    pytest.param(Reply(content=ANSWER, cut_after=2, cut_mode="close"), "stream ended", id="close"),
    pytest.param(Reply(content=ANSWER, finish=None), "stream ended", id="no-finish"),
    pytest.param(Reply(content=ANSWER, error_after=2), "stream interrupted by the fake provider", id="error-line"),
]


@pytest.mark.parametrize("chapter", [2, "final"])
@pytest.mark.parametrize(("reply", "needle"), CUT_STREAMS)
def test_ex02_incomplete_stream_fails_cleanly(provider, workdir, chapter, reply, needle):
    provider.script(reply)
    result = chapter_output(chapter, run_agent(chapter, "hi", provider=provider, cwd=workdir))

    assert_clean_failure(result, needle)
    assert len(stderr_lines(result.stderr)) == 1, result.stderr
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
    assert len(stderr_lines(result.stderr)) == 1, result.stderr
    assert result.stdout.strip() == ""
    assert len(provider.requests) == 1
