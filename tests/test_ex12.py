"""Chapter 12: the context budget (exercises/ex12/agent.py), and agent.py, which keeps it.

The window comes from a table of model names, or from CONTEXT_WINDOW (the
environment or .env), and a bad value is one error line. After every round a
budget line says how much of the window the conversation fills, from the usage
the API reported; an estimate, marked as one, before the first request of a
resumed session and when the server reports no usage. From 75% on it warns.

The programs run as subprocesses against the fake provider; the table and the
estimate are checked in-process too, on the programs' own functions.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_agent
from fake_provider import FakeProvider, text, tool_call
from helpers import (
    SESSION_ID,
    Budget,
    assert_ok,
    assert_one_error_line,
    budget_lines,
    put_session,
    session_bytes,
    warnings,
)

CHAPTER = 12
both = pytest.mark.parametrize("chapter", [CHAPTER, "final"])
TABLE = {
    "deepseek-chat": 128_000,
    "DeepSeek-V4-Flash": 128_000,
    "gpt-4.1-mini": 1_000_000,
    "gpt-4o": 128_000,
    "gpt-4": 8_192,
    "gpt-5-mini": 272_000,
    "claude-sonnet-4-5": 200_000,
    "kimi-k2-turbo": 128_000,
    "moonshot-v1-8k": 128_000,
    "qwen2.5-coder:7b": 8_192,
    "llama3.1:8b": 8_192,
    "gemma3": 8_192,
    "mistral-small": 8_192,
    "test-model": 32_000,  # a name the table does not know
}


@pytest.mark.parametrize("loaded", [CHAPTER, "final"], indirect=True)
def test_the_window_comes_from_the_model_name(loaded, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONTEXT_WINDOW", raising=False)
    found = {}
    for model in TABLE:
        monkeypatch.setattr(loaded, "MODEL", model)
        found[model] = loaded.context_window()
    assert found == TABLE


@pytest.mark.parametrize(
    ("model", "environment", "dotenv", "window"),
    [
        ("deepseek-chat", None, None, "128,000"),
        ("deepseek-chat", "8000", None, "8,000"),
        ("deepseek-chat", None, "CONTEXT_WINDOW=10000\n", "10,000"),
        ("test-model", " 8000 ", "CONTEXT_WINDOW=abc\n", "8,000"),  # the environment wins
    ],
    ids=["model name", "environment", ".env", "environment over .env"],
)
@both
def test_the_budget_line_is_the_api_s_count_over_the_window(
    provider: FakeProvider,
    workdir: Path,
    chapter: int | str,
    model: str,
    environment: str | None,
    dotenv: str | None,
    window: str,
) -> None:
    if dotenv:
        (workdir / ".env").write_text(dotenv)
    provider.script(text("Done.", prompt_tokens=3000, completion_tokens=214))
    result = run_agent(chapter, "hello", provider=provider, cwd=workdir, MODEL=model, CONTEXT_WINDOW=environment)
    assert_ok(result, "Done.\n")
    size = int(window.replace(",", ""))
    assert f"[budget 3,214/{window} tokens · {3214 / size:.1%}]" in result.stderr.splitlines()
    assert budget_lines(result.stderr) == [Budget(False, 3214, size, f"{3214 / size * 100:.1f}", "")]
    assert warnings(result.stderr) == []


@pytest.mark.parametrize("value", ["abc", "0", "-5", "999", "1e5"])
@both
def test_a_bad_context_window_is_one_error_line(
    provider: FakeProvider, workdir: Path, chapter: int | str, value: str
) -> None:
    result = run_agent(chapter, "hello", provider=provider, cwd=workdir, CONTEXT_WINDOW=value)
    assert_one_error_line(result, "CONTEXT_WINDOW", repr(value), "at least 1000")
    assert not (workdir / ".sessions").exists()  # said before a session is created
    assert provider.requests == []


@both
def test_a_bad_context_window_leaves_a_session_to_resume_untouched(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    path = put_session(workdir, session_bytes({"role": "system", "content": "You are a coding agent."}))
    before = path.read_bytes()
    result = run_agent(chapter, "-c", SESSION_ID, "next", provider=provider, cwd=workdir, CONTEXT_WINDOW="4k")
    assert_one_error_line(result, "CONTEXT_WINDOW", "'4k'")
    assert path.read_bytes() == before
    assert provider.requests == []


@both
def test_a_budget_line_after_every_round(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    (workdir / "notes.txt").write_text("buy milk\n")
    read = {"path": "notes.txt"}
    provider.script(
        tool_call("read_file", read, prompt_tokens=3000, completion_tokens=214),
        tool_call("read_file", read, prompt_tokens=3400, completion_tokens=20),
        text("They say: buy milk.", prompt_tokens=3600, completion_tokens=12),
    )
    result = run_agent(chapter, "Read notes.txt twice", provider=provider, cwd=workdir, MODEL="deepseek-chat")
    assert_ok(result, "They say: buy milk.\n")
    assert budget_lines(result.stderr) == [
        Budget(False, 3214, 128_000, "2.5", ""),
        Budget(False, 3420, 128_000, "2.7", ""),
        Budget(False, 3612, 128_000, "2.8", ""),
    ]
    # As soon as each reply is complete: in a tool round before its [round N input ...] line.
    lines = result.stderr.splitlines()
    assert lines[lines.index("[round 1 input 3000 tokens, 0 cached]") - 1] == "[budget 3,214/128,000 tokens · 2.5%]"
    assert lines[lines.index("[round 2 input 3400 tokens, 0 cached]") - 1] == "[budget 3,420/128,000 tokens · 2.7%]"
    last_call = lines.index('[round 2] read_file({"path": "notes.txt"})')
    assert lines.index("[budget 3,612/128,000 tokens · 2.8%]") > last_call


@pytest.mark.parametrize(
    ("prompt", "completion", "line", "warning"),
    [
        (2990, 9, "[budget 2,999/4,000 tokens · 75.0%]", None),  # shown as 75.0%, still under it
        (3000, 0, "[budget 3,000/4,000 tokens · 75.0%]", "fills 75% of the model's window; soon it will not fit"),
        (3900, 99, "[budget 3,999/4,000 tokens · 100.0%]", "fills 100% of the model's window; soon it will not fit"),
        (4000, 100, "[budget 4,100/4,000 tokens · 102.5%]", "fills 102% of the model's window; it no longer fits"),
    ],
    ids=["just under", "at 75%", "just under 100%", "over"],
)
@both
def test_the_warning_comes_from_75_percent(
    provider: FakeProvider,
    workdir: Path,
    chapter: int | str,
    prompt: int,
    completion: int,
    line: str,
    warning: str | None,
) -> None:
    provider.script(text("Done.", prompt_tokens=prompt, completion_tokens=completion))
    result = run_agent(chapter, "hello", provider=provider, cwd=workdir, CONTEXT_WINDOW="4000")
    assert_ok(result, "Done.\n")  # a warning changes nothing else
    lines = result.stderr.splitlines()
    assert line in lines
    assert warnings(result.stderr) == ([f"warning: the conversation {warning}"] if warning else [])
    if warning:
        assert lines[lines.index(line) + 1] == f"warning: the conversation {warning}"


@both
def test_a_resume_first_shows_an_estimate_marked_as_one(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    earlier = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Tell me about the notes"},
        {"role": "assistant", "content": "The notes plan a stock API for a bookshop. " * 200},
    ]
    put_session(workdir, session_bytes(*earlier))
    provider.measure = True  # the count is the request's own size, 4 bytes a token
    provider.script(text("Yes.", completion_tokens=2))
    result = run_agent(chapter, "-c", SESSION_ID, "Is that all?", provider=provider, cwd=workdir)
    assert_ok(result, "Yes.\n")
    lines = result.stderr.splitlines()
    estimate, count = budget_lines(result.stderr)
    assert lines[1].startswith("[budget ~") and lines[0].startswith("[resumed session")  # before the request
    assert estimate.estimated and estimate.note == " · estimated" and estimate.window == 32_000
    assert not count.estimated and count.used == len(provider.requests[0]["raw"]) // 4 + 2
    assert abs(estimate.used - count.used) <= 0.1 * count.used, (estimate, count)


@both
def test_a_server_that_reports_no_usage_gets_an_estimate_that_says_so(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    (workdir / "notes.txt").write_text("buy milk\n" * 400)
    provider.script(
        tool_call("read_file", {"path": "notes.txt"}, usage_style="none"),
        text("They say: buy milk.", usage_style="none"),
    )
    result = run_agent(chapter, "Read notes.txt", provider=provider, cwd=workdir)
    assert_ok(result, "They say: buy milk.\n")
    first, second = budget_lines(result.stderr)
    for line in (first, second):
        assert line.estimated and line.note == " · estimated: the server reports no usage", line
    assert second.used >= first.used + 900  # the 3,600-byte result counts in the estimate
    assert "[round 1 input ? tokens, 0 cached]" in result.stderr.splitlines()


@pytest.mark.parametrize("loaded", [CHAPTER, "final"], indirect=True)
@pytest.mark.parametrize("sample", ["a" * 4000, "小明" * 750], ids=["English", "Chinese"])
def test_the_estimate_counts_4_ascii_characters_or_1_5_others_a_token(loaded, sample: str) -> None:
    assert abs(loaded.estimate(sample) - 1000) <= 10
