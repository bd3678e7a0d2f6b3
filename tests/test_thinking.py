"""What a person sees while the model thinks (agent.py).

DeepSeek's thinking mode streams reasoning_content for seconds or minutes before
the answer's first word. agent.py shows it as it streams, on stderr (dimmed on a
terminal unless NO_COLOR is set), and never on stdout, which stays the answer.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TEST_KEY, Terminal, hermetic_env, program, run_agent
from fake_provider import FakeProvider, text, tool_call
from helpers import assert_ok, disk_messages

DIM, UNDIM = "\x1b[2m", "\x1b[0m"


def test_reasoning_streams_to_stderr_before_the_answer_and_stdout_stays_the_answer(
    provider: FakeProvider, workdir: Path
) -> None:
    (workdir / "notes.txt").write_text("buy milk\n")
    provider.script(
        tool_call("read_file", {"path": "notes.txt"}, reasoning="First I should read the notes.", pieces=4),
        text("The notes say: buy milk.", reasoning="They say buy milk; now I can answer.", pieces=4),
    )
    result = run_agent("final", "What do my notes say?", provider=provider, cwd=workdir)
    assert_ok(result)
    assert result.stdout == "The notes say: buy milk.\n"  # the answer alone
    lines = result.stderr.splitlines()
    # Each turn's reasoning on a line of its own, whole, before what follows it.
    first = lines.index("First I should read the notes.")
    assert lines[first + 1].startswith("[budget "), lines
    second = lines.index("They say buy milk; now I can answer.")
    assert first < second, lines
    assert DIM not in result.stderr  # stderr is a pipe here: no escapes
    # Shown, and kept as before: DeepSeek wants it back on tool-call turns.
    (path,) = (workdir / ".sessions").iterdir()
    stored = disk_messages(path)
    assert stored[2]["reasoning_content"] == "First I should read the notes."


@pytest.mark.parametrize("no_color", [None, "", "1"])
def test_reasoning_is_dimmed_on_a_terminal_unless_no_color(
    provider: FakeProvider, workdir: Path, no_color: str | None
) -> None:
    provider.script(text("Hello.", reasoning="Thinking it over.", pieces=3))
    terminal = Terminal("")
    try:
        result = subprocess.run(
            [sys.executable, str(program("final")), "hi"],
            cwd=workdir,
            env=hermetic_env(provider, workdir.parent, NO_COLOR=no_color),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=terminal.slave,
            timeout=60,
        )
    finally:
        terminal.close()
    shown = terminal.shown.decode()
    assert result.returncode == 0, shown
    assert result.stdout == b"Hello.\n"
    assert "Thinking it over.\r\n" in shown.replace(DIM, "").replace(UNDIM, ""), shown  # each piece dimmed
    if no_color:  # set and not empty: https://no-color.org
        assert "\x1b" not in shown, shown
    else:
        assert f"{DIM}Thinki" in shown and UNDIM in shown, shown


def test_reasoning_is_escaped_and_the_key_in_it_is_removed_even_split(provider: FakeProvider, workdir: Path) -> None:
    """A server can put anything in the reasoning: escapes that would redraw the screen, and the key,
    split across chunks so that no single chunk holds it."""
    reasoning = f"Clipboard \x1b]52;c;cHduZWQ=\x07 and the key {TEST_KEY} end."
    provider.script(text("Done.", reasoning=reasoning, pieces=len(reasoning) // 3))
    result = run_agent("final", "hi", provider=provider, cwd=workdir)
    assert_ok(result)
    assert "\x1b" not in result.stderr and "\\x1b]52" in result.stderr, result.stderr
    assert TEST_KEY not in result.stderr and "[OPENAI_API_KEY removed] end." in result.stderr, result.stderr
    assert result.stdout == "Done.\n"
