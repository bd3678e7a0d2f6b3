"""Chapters 3 and 4: the REPL that resends the history, then two protocols.

Each test runs the real program against the fake provider, types into its
stdin, and checks what the user sees and what reached the server.
"""

from __future__ import annotations

import pytest

from conftest import assert_clean_failure, run_agent
from fake_provider import Reply, anthropic_text, error, text
from helpers import free_port, status_line

BANNER = "Type a message and press Enter; type exit to quit.\n"
SYSTEM_PROMPT = "You are a concise assistant; answer in at most three sentences."
SYSTEM = {"role": "system", "content": SYSTEM_PROMPT}


def user(content: str) -> dict:
    return {"role": "user", "content": content}


def assistant(content: str) -> dict:
    return {"role": "assistant", "content": content}


# ---------------------------------------------------------------- ex03


def test_ex03_second_turn_resends_the_first(provider, workdir):
    provider.script(
        text("Nice to meet you.", prompt_tokens=20, completion_tokens=5),
        text("Your name is Xiaoming.", prompt_tokens=40, completion_tokens=6),
    )
    result = run_agent(3, provider=provider, cwd=workdir, stdin="My name is Xiaoming\n  What is my name?  \nexit\n")

    assert result.returncode == 0, result.stderr
    assert result.stdout == "Nice to meet you.\nYour name is Xiaoming.\n"
    # Banner, prompts and status lines on stderr; no blank line before a status line.
    assert result.stderr == BANNER + "> " + status_line(20, 5) + "\n> " + status_line(40, 6) + "\n> "

    first, second = provider.chat_requests
    assert first["messages"] == [SYSTEM, user("My name is Xiaoming")]
    assert second["messages"] == [
        SYSTEM,
        user("My name is Xiaoming"),
        assistant("Nice to meet you."),
        user("What is my name?"),
    ]
    for body in (first, second):
        assert body["stream"] is True
        assert body["stream_options"] == {"include_usage": True}
        assert body["model"] == "test-model"
        assert body["max_tokens"] == 1024


@pytest.mark.parametrize(
    ("failure", "needle"),
    [
        (error(500), "error: HTTP 500: Server Error"),
        (Reply(content="half an answer", finish=None), "error: the stream ended before the answer was finished"),
    ],
    ids=["http-500", "no-finish"],
)
def test_ex03_failed_turn_is_forgotten_and_the_repl_goes_on(provider, workdir, failure, needle):
    provider.script(failure, text("Second answer."))
    result = run_agent(3, provider=provider, cwd=workdir, stdin="first question\nsecond question\nexit\n")

    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    error_lines = [line for line in lines if "error:" in line]
    assert len(error_lines) == 1 and needle in error_lines[0], result.stderr
    # After the error the REPL prompts again and the next turn succeeds.
    assert result.stderr.endswith("> " + status_line() + "\n> "), result.stderr
    assert result.stdout.rstrip("\n").endswith("Second answer.")

    first, second = provider.chat_requests
    assert first["messages"] == [SYSTEM, user("first question")]
    assert second["messages"] == [SYSTEM, user("second question")]  # the failed turn is gone


def test_ex03_empty_lines_reprompt_without_a_request(provider, workdir):
    provider.script(text("Hi."))
    result = run_agent(3, provider=provider, cwd=workdir, stdin="\n   \nhello\n\nexit\n")

    assert result.returncode == 0, result.stderr
    assert result.stdout == "Hi.\n"
    assert result.stderr == BANNER + "> > > " + status_line() + "\n> > "
    assert len(provider.requests) == 1
    assert provider.chat_requests[0]["messages"] == [SYSTEM, user("hello")]


@pytest.mark.parametrize("stdin", ["", "hello\n"], ids=["immediately", "after-a-turn"])
def test_ex03_eof_ends_with_exit_0(provider, workdir, stdin):
    if stdin:
        provider.script(text("Hi."))
    result = run_agent(3, provider=provider, cwd=workdir, stdin=stdin)

    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(BANNER)
    assert result.stderr.endswith("> \n")  # the prompt is closed with a newline on EOF
    assert len(provider.requests) == (1 if stdin else 0)
    assert result.stdout == ("Hi.\n" if stdin else "")


# ---------------------------------------------------------------- ex04

ANTHROPIC_KEY = "anthropic-test-key"


def anthropic_env(provider, **extra: str | None) -> dict[str, str | None]:
    env = {
        "PROTOCOL": "anthropic",
        "ANTHROPIC_BASE_URL": provider.anthropic_url,
        "ANTHROPIC_API_KEY": ANTHROPIC_KEY,
        "OPENAI_API_KEY": None,  # not needed for Anthropic
    }
    env.update(extra)
    return env


def test_ex04_anthropic_request_shape_reply_and_history(provider, workdir):
    provider.script(
        anthropic_text("Hi, Xiaoming."),
        anthropic_text("Xiaoming.", stop_reason="max_tokens", input_tokens=30, output_tokens=3),
    )
    result = run_agent(
        4,
        provider=provider,
        cwd=workdir,
        stdin="My name is Xiaoming\nWhat is my name?\nexit\n",
        **anthropic_env(provider),
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout == "Hi, Xiaoming.\nXiaoming.\n"
    assert result.stderr == (
        BANNER
        + "> "
        + status_line(13, 5, "end_turn", key="stop_reason")
        + "\n> "
        + status_line(30, 3, "max_tokens", key="stop_reason")
        + "\n> "
    )

    assert [r["path"] for r in provider.requests] == ["/v1/messages", "/v1/messages"]
    for request in provider.requests:
        headers = request["headers"]
        assert headers["x-api-key"] == ANTHROPIC_KEY
        assert headers["anthropic-version"] == "2023-06-01"
        assert headers["content-type"] == "application/json"
        assert "authorization" not in headers
        body = request["body"]
        assert body["system"] == SYSTEM_PROMPT
        assert body["max_tokens"] == 1024
        assert body["model"] == "test-model"
        assert {m["role"] for m in body["messages"]} <= {"user", "assistant"}
    first, second = (r["body"]["messages"] for r in provider.requests)
    assert first == [user("My name is Xiaoming")]
    assert second == [user("My name is Xiaoming"), assistant("Hi, Xiaoming."), user("What is my name?")]


@pytest.mark.parametrize("protocol", ["openai", "", None], ids=["openai", "empty", "unset"])
def test_ex04_openai_protocol(provider, workdir, protocol):
    provider.script(text("Hello."), text("Again.", finish="length"))
    result = run_agent(
        4,
        provider=provider,
        cwd=workdir,
        stdin="hi\nonce more\nexit\n",
        PROTOCOL=protocol,
        ANTHROPIC_API_KEY=None,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout == "Hello.\nAgain.\n"
    assert result.stderr == (BANNER + "> " + status_line() + "\n> " + status_line(finish="length") + "\n> ")

    assert [r["path"] for r in provider.requests] == ["/v1/chat/completions"] * 2
    assert provider.requests[0]["headers"]["authorization"] == "Bearer test-key-not-real"
    first, second = provider.chat_requests
    assert first["messages"] == [SYSTEM, user("hi")]
    assert second["messages"] == [SYSTEM, user("hi"), assistant("Hello."), user("once more")]
    assert not first.get("stream")  # non-streaming on purpose
    assert first["max_tokens"] == 1024 and first["model"] == "test-model"


def test_ex04_unknown_protocol_fails_cleanly(provider, workdir):
    result = run_agent(4, provider=provider, cwd=workdir, stdin="hi\n", PROTOCOL="gemini")

    assert_clean_failure(result, "gemini", "PROTOCOL")
    assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1, result.stderr
    assert result.stdout == ""
    assert provider.requests == []


def test_ex04_anthropic_missing_key_prints_setup_guide(provider, workdir):
    result = run_agent(
        4, provider=provider, cwd=workdir, stdin="hi\n", **anthropic_env(provider, ANTHROPIC_API_KEY=None)
    )

    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error:")
    assert "ANTHROPIC_API_KEY" in result.stderr
    assert result.stdout == ""
    assert provider.requests == []


def test_ex04_anthropic_http_error_then_the_repl_goes_on(provider, workdir):
    provider.script(error(401), anthropic_text("Second answer."))
    result = run_agent(4, provider=provider, cwd=workdir, stdin="first\nsecond\nexit\n", **anthropic_env(provider))

    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert ANTHROPIC_KEY not in result.stderr + result.stdout
    assert result.stderr == (
        BANNER
        + "> error: HTTP 401: Authentication Fails, Your api key: ****abcd is invalid\n"
        + "> "
        + status_line(13, 5, "end_turn", key="stop_reason")
        + "\n> "
    )
    assert result.stdout == "Second answer.\n"
    first, second = (r["body"]["messages"] for r in provider.requests)
    assert first == [user("first")]
    assert second == [user("second")]  # the failed turn is gone


def test_ex04_anthropic_unreachable_then_the_repl_goes_on(provider, workdir):
    url = f"http://127.0.0.1:{free_port()}"
    result = run_agent(
        4, provider=provider, cwd=workdir, stdin="hi\n", **anthropic_env(provider, ANTHROPIC_BASE_URL=url)
    )

    assert result.returncode == 0, result.stderr  # a failed turn does not end the REPL; EOF does
    assert "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and f"cannot reach {url}" in error_lines[0], result.stderr
    assert result.stderr.endswith("> \n")
    assert result.stdout == ""
    assert provider.requests == []
