"""Chapter 14: the rules file (exercises/ex14/agent.py), and agent.py, which keeps it.

A project keeps its conventions in AGENTS.md, written by a person. When a
session is created, the file's text, trimmed, is added to the base prompt under
a heading of its own, and the prompt is frozen as the session's first message:
a resume sends the text the session started with, a compaction keeps it, and
only a new session sees an edit. With no rules (no file, or only whitespace)
the prompt is the base prompt byte for byte. Only a regular file is read, at
most 32 KiB of it, decoded with replacement: a FIFO, /dev/zero, a long or a
broken file is a warning at most, never a hang or a traceback.

The programs run as subprocesses against the fake provider; the tests read the
system message of every request, the session file, and what the user sees.
agent.py keeps the later chapters too: their parts of the prompt (memory,
skills) come after the ones this chapter makes, so there these must start it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import load_program, run_agent
from fake_provider import FakeProvider, text, tool_call
from helpers import (
    PROMPT_SECTION,
    SUMMARY_TEXT,
    assert_ok,
    crossing_window,
    file_records,
    new_session_id,
    resumed,
    session_file,
    summary_message,
    system_prompts,
    turn_requests,
    warnings,
)

CHAPTER = 14
both = pytest.mark.parametrize("chapter", [CHAPTER, "final"])
TASK = "Write a Go function readConfig(path string) string"
HEADING = "# Project rules (AGENTS.md)"
# Whitespace around it, a horizontal rule and a heading inside it, UTF-8 beyond ASCII.
AGENTS_MD = """

  # Conventions

- Go: return an error, never panic.
- Indent with tabs — 缩进用制表符.

---

Run `go vet ./...` before you say that you are done.


"""
RULES = AGENTS_MD.strip()
CAP = 32 * 1024


@pytest.fixture
def base_prompt(chapter: int | str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The program's own BASE_PROMPT."""
    inproc = tmp_path / "inproc"
    inproc.mkdir()
    return load_program(chapter, inproc, monkeypatch).BASE_PROMPT


def rules_part(rules: str) -> str:
    return f"{HEADING}\n\n{rules}"


def rules_line(rules: str) -> str:
    return f"[rules: AGENTS.md, {len(rules.encode()):,} bytes]"


def assert_prompt(chapter: int | str, system: str, *parts: str) -> None:
    """The system prompt is exactly these parts, joined as the chapter joins them; in agent.py,
    which adds the later chapters' parts after them, they are its start."""
    expected = PROMPT_SECTION.join(parts)
    if chapter == CHAPTER:
        assert system == expected, (system, expected)
    else:
        assert system == expected or system.startswith(expected + PROMPT_SECTION), (system, expected)
    if len(parts) == 1:
        assert HEADING not in system, system


def one_answer(chapter: int | str, provider: FakeProvider, workdir: Path, **options):
    provider.script(text("Done."))
    result = run_agent(chapter, TASK, provider=provider, cwd=workdir, **options)
    assert_ok(result, "Done.\n")
    return result


# ---------------------------------------------------------------- the rules in a new session's prompt


@both
def test_the_rules_are_appended_to_the_base_prompt_exactly(
    provider: FakeProvider, workdir: Path, chapter: int | str, base_prompt: str
) -> None:
    (workdir / "AGENTS.md").write_text(AGENTS_MD)
    (workdir / "main.go").write_text("package main\n")
    provider.script(tool_call("read_file", {"path": "main.go"}), text("Done."))
    result = run_agent(chapter, TASK, provider=provider, cwd=workdir)
    assert_ok(result, "Done.\n")
    first, second = system_prompts(provider)
    assert_prompt(chapter, first, base_prompt, rules_part(RULES))
    assert second == first  # every request of the session: the same prefix
    # Said once, before the session's line: its size counts UTF-8 bytes, as the request carries them.
    lines = result.stderr.splitlines()
    assert lines.count(rules_line(RULES)) == 1, result.stderr
    assert rules_line(RULES) == "[rules: AGENTS.md, 152 bytes]"
    assert lines.index(rules_line(RULES)) < lines.index(f"[new session {new_session_id(result.stderr)}]")
    assert warnings(result.stderr) == []
    # The session file keeps the prompt as its first message.
    records = file_records(session_file(workdir, result.stderr))
    assert records[1] == {"type": "message", "message": {"role": "system", "content": first}}


@pytest.mark.parametrize(
    "content",
    [None, b"", b" \n\t\r\n  \n", b"\xef\xbb\xbf\n\n", "dangling link"],
    ids=["missing", "empty", "whitespace", "a BOM and blank lines", "a dangling link"],
)
@both
def test_no_rules_leave_the_base_prompt_byte_for_byte(
    provider: FakeProvider, workdir: Path, chapter: int | str, base_prompt: str, content: bytes | str | None
) -> None:
    if content == "dangling link":
        os.symlink("nowhere/AGENTS.md", workdir / "AGENTS.md")
    elif content is not None:
        (workdir / "AGENTS.md").write_bytes(content)
    result = one_answer(chapter, provider, workdir)
    (system,) = system_prompts(provider)
    assert_prompt(chapter, system, base_prompt)
    assert "[rules:" not in result.stderr
    assert warnings(result.stderr) == []


# ---------------------------------------------------------------- frozen in the session


@pytest.mark.parametrize(
    ("before", "after"),
    [("- Tabs.\n", "- Spaces, four of them.\n"), ("- Tabs.\n", None), (None, "- Spaces, four of them.\n")],
    ids=["edited", "removed", "created"],
)
@both
def test_a_resumed_session_sends_the_prompt_it_started_with_and_a_new_one_sees_the_change(
    provider: FakeProvider,
    workdir: Path,
    chapter: int | str,
    base_prompt: str,
    before: str | None,
    after: str | None,
) -> None:
    rules = workdir / "AGENTS.md"
    if before is not None:
        rules.write_text(before)
    first = one_answer(chapter, provider, workdir)
    session_id = new_session_id(first.stderr)
    (started,) = system_prompts(provider)
    if after is None:
        rules.unlink()
    else:
        rules.write_text(after)

    provider.script(text("Still done."))
    again = run_agent(chapter, "-c", session_id, "And a test for it?", provider=provider, cwd=workdir)
    assert_ok(again, "Still done.\n")
    assert resumed(again.stderr) == (session_id, 3)
    assert system_prompts(provider)[-1] == started  # byte for byte, whatever AGENTS.md says now
    assert "[rules:" not in again.stderr  # a resume reads no rules

    one_answer(chapter, provider, workdir)
    fresh = system_prompts(provider)[-1]
    if after is None:
        assert_prompt(chapter, fresh, base_prompt)
    else:
        assert_prompt(chapter, fresh, base_prompt, rules_part(after.strip()))


@both
def test_a_compaction_keeps_the_prompt_the_session_started_with(
    provider: FakeProvider, workdir: Path, chapter: int | str, base_prompt: str
) -> None:
    (workdir / "AGENTS.md").write_text(AGENTS_MD)
    first = one_answer(chapter, provider, workdir)
    session_id = new_session_id(first.stderr)
    (started,) = system_prompts(provider)
    assert_prompt(chapter, started, base_prompt, rules_part(RULES))
    (workdir / "AGENTS.md").write_text("- Everything changed since.\n")

    # The first round is counted past 75% of the window: the next request is compacted first.
    (workdir / "todo.txt").write_text("- readConfig (Lin)\n")
    provider.summary = text(SUMMARY_TEXT)
    window, tokens = crossing_window(chapter)
    provider.script(tool_call("read_file", {"path": "todo.txt"}, prompt_tokens=tokens), text("One item."))
    question = "Now read todo.txt and tell me what is still open"
    result = run_agent(chapter, "-c", session_id, question, provider=provider, cwd=workdir, CONTEXT_WINDOW=str(window))
    assert_ok(result, "One item.\n")
    assert any(line.startswith("[compacted: ") for line in result.stderr.splitlines()), result.stderr
    before, after = turn_requests(provider)[-2:]
    assert before["messages"][0]["content"] == after["messages"][0]["content"] == started
    assert after["messages"][1] == summary_message(SUMMARY_TEXT)
    records = file_records(workdir / ".sessions" / f"{session_id}.jsonl")
    assert records[1]["message"]["content"] == started
    assert "compaction" in [record["type"] for record in records]

    # A resume replays the compaction: the same first message, still.
    provider.script(text("Nothing else."))
    again = run_agent(chapter, "-c", session_id, "Anything else?", provider=provider, cwd=workdir)
    assert_ok(again, "Nothing else.\n")
    sent = provider.chat_requests[-1]["messages"]
    assert sent[0]["content"] == started and sent[1] == summary_message(SUMMARY_TEXT)


# ---------------------------------------------------------------- files that are not plain rules


@pytest.mark.parametrize("kind", ["FIFO", "link to /dev/zero", "directory"])
@both
def test_a_rules_file_that_is_not_a_regular_file_is_a_warning_never_a_wait(
    provider: FakeProvider, workdir: Path, chapter: int | str, base_prompt: str, kind: str
) -> None:
    """A FIFO with no writer would block an open() and a read() forever, /dev/zero would
    fill the prompt: neither is read. The run is bounded: a wait fails it."""
    path = workdir / "AGENTS.md"
    if kind == "FIFO":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        os.symlink("/dev/zero", path)
    result = one_answer(chapter, provider, workdir, timeout=30)
    (system,) = system_prompts(provider)
    assert_prompt(chapter, system, base_prompt)
    (warned,) = warnings(result.stderr)
    assert warned.startswith("warning: AGENTS.md ") and "not read" in warned, warned
    if chapter == CHAPTER:
        assert warned == "warning: AGENTS.md is not a regular file; it is not read"
    assert "[rules:" not in result.stderr


def long_rules(size: int) -> bytes:
    """ASCII rules of exactly `size` bytes, none of it whitespace at the end."""
    lines = b"".join(b"- rule %05d: keep functions short.\n" % number for number in range(size // 30 + 1))
    return lines[: size - 1] + b"!"


@pytest.mark.parametrize("size", [CAP, CAP + 1, 40 * 1024], ids=["32 KiB", "a byte more", "40 KiB"])
@both
def test_a_long_rules_file_is_cut_at_32_kib_with_a_marker_the_model_sees(
    provider: FakeProvider, workdir: Path, chapter: int | str, base_prompt: str, size: int
) -> None:
    data = long_rules(size)
    assert len(data) == size
    (workdir / "AGENTS.md").write_bytes(data)
    result = one_answer(chapter, provider, workdir)
    (system,) = system_prompts(provider)
    rules = data[:CAP].decode()
    if size > CAP:
        rules += "\n[... AGENTS.md was cut here: it is longer than 32,768 bytes ...]"
        assert warnings(result.stderr) == [
            "warning: AGENTS.md is longer than 32,768 bytes; only the first 32,768 are used"
        ]
    else:
        assert warnings(result.stderr) == []
    assert_prompt(chapter, system, base_prompt, rules_part(rules))
    assert rules_line(rules) in result.stderr.splitlines()


@both
def test_bytes_that_are_not_utf8_are_replaced_and_a_bom_is_dropped(
    provider: FakeProvider, workdir: Path, chapter: int | str, base_prompt: str
) -> None:
    data = b"\xef\xbb\xbf# Rules\n- caf\xe9 is Latin-1 here\n- \xff\xfe is no text at all\n- \xe4\xb8\xad\xe6\x96\x87 stays\n"
    (workdir / "AGENTS.md").write_bytes(data)
    result = one_answer(chapter, provider, workdir)
    (system,) = system_prompts(provider)
    rules = "# Rules\n- caf\ufffd is Latin-1 here\n- \ufffd\ufffd is no text at all\n- 中文 stays"
    assert_prompt(chapter, system, base_prompt, rules_part(rules))
    assert "\ufeff" not in system
    assert rules_line(rules) in result.stderr.splitlines()
    assert warnings(result.stderr) == []
