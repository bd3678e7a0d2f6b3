"""Chapter 15: cross-session memory (exercises/ex15/agent.py), and agent.py, which keeps it.

MEMORY.md is the model's own notes. Every new session's prompt carries them
after the memory guidance, under "## What you have recorded so far", or a
placeholder when there are none; at most 200 lines and 25 KiB of them, cut
with a marker the model sees and a warning the user sees. A resumed session
keeps the prompt it started with. The model keeps its notes with write_file
and edit_file, and every change to MEMORY.md is said on stderr.

Read-before-write becomes "unchanged since you read it": a file this run has
never read cannot be overwritten, and one that changed on disk since this run
last read or wrote it (another terminal, a person) is refused until the model
reads it again, so the other writer's change is never lost.

The programs run as subprocesses against the fake provider; the tests read the
system message of every request, the tool results, the files, and stderr.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import load_program, run_agent
from fake_provider import FakeProvider, Reply, text
from helpers import (
    PROMPT_SECTION,
    Live,
    assert_ok,
    calls,
    new_session_id,
    prompt_section,
    results,
    system_prompts,
    warnings,
)

CHAPTER = 15
both = pytest.mark.parametrize("chapter", [CHAPTER, "final"])
MEMORY_HEADING = "# Your memory (MEMORY.md)"
RECORDED = "## What you have recorded so far"
PLACEHOLDER = "(nothing yet: this is the first session with a memory in this project)"
ANNOUNCED = "[memory: {tool} changed MEMORY.md; new sessions will have it in their prompt]"
NOT_READ = "error: {path} already exists and has not been read in this run; read it first with read_file"
CHANGED = "error: {path} has changed since you last read it; read it again with read_file, then make your change"
TRUNK = "- The default branch is trunk, not main.\n"


@pytest.fixture
def agent(chapter: int | str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The program, loaded in-process: its BASE_PROMPT and MEMORY_GUIDANCE."""
    inproc = tmp_path / "inproc"
    inproc.mkdir()
    return load_program(chapter, inproc, monkeypatch)


def notes_in(system: str) -> str:
    """What a system prompt shows of MEMORY.md: the text of its memory part after the heading."""
    part = prompt_section(system, MEMORY_HEADING)
    assert part is not None, system
    guidance, heading, notes = part.partition(f"\n\n{RECORDED}\n\n")
    assert heading and "write_file" in guidance and "edit_file" in guidance, part
    return notes


def assert_memory(chapter: int | str, agent, system: str, notes: str) -> None:
    """A new session's prompt: the base prompt, then the memory guidance with these notes.
    (agent.py puts the later chapters' parts between them.)"""
    assert notes_in(system) == notes
    if chapter == CHAPTER:
        memory = f"{agent.MEMORY_GUIDANCE}\n\n{RECORDED}\n\n{notes}"
        assert system == PROMPT_SECTION.join([agent.BASE_PROMPT, memory]), system
    else:
        assert system.startswith(agent.BASE_PROMPT + PROMPT_SECTION), system


def run(chapter: int | str, provider: FakeProvider, workdir: Path, task: str, *replies: Reply, answer: str = "Done."):
    """One new session to its answer."""
    provider.script(*replies, text(answer))
    result = run_agent(chapter, task, provider=provider, cwd=workdir)
    assert_ok(result, f"{answer}\n")
    return result


def memory_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("[memory:")]


# ---------------------------------------------------------------- the notes in a new session's prompt


@pytest.mark.parametrize("content", [None, b"", b"\n \t\n", "FIFO"], ids=["missing", "empty", "blank", "FIFO"])
@both
def test_with_no_notes_the_prompt_has_the_guidance_and_a_placeholder(
    provider: FakeProvider, workdir: Path, chapter: int | str, agent, content: bytes | str | None
) -> None:
    if content == "FIFO":
        os.mkfifo(workdir / "MEMORY.md")  # never waited on
    elif content is not None:
        (workdir / "MEMORY.md").write_bytes(content)
    result = run(chapter, provider, workdir, "hello")
    (system,) = system_prompts(provider)
    assert_memory(chapter, agent, system, PLACEHOLDER)
    if content == "FIFO":
        (warned,) = warnings(result.stderr)
        assert warned.startswith("warning: MEMORY.md ") and "not read" in warned, warned
        if chapter == CHAPTER:
            assert warned == "warning: MEMORY.md is not a regular file; it is not read"
    else:
        assert warnings(result.stderr) == []
    assert memory_lines(result.stderr) == []


@both
def test_the_memory_comes_after_the_rules(provider: FakeProvider, workdir: Path, chapter: int | str, agent) -> None:
    (workdir / "AGENTS.md").write_text("- Tabs.\n")
    (workdir / "MEMORY.md").write_text(TRUNK)
    run(chapter, provider, workdir, "hello")
    (system,) = system_prompts(provider)
    parts = system.split(PROMPT_SECTION)
    assert parts[:2] == [agent.BASE_PROMPT, "# Project rules (AGENTS.md)\n\n- Tabs."]
    assert parts.index(prompt_section(system, MEMORY_HEADING)) > 1
    assert notes_in(system) == TRUNK.strip()
    if chapter == CHAPTER:
        assert len(parts) == 3


@both
def test_notes_one_session_writes_reach_the_next_new_session_but_not_a_resumed_one(
    provider: FakeProvider, workdir: Path, chapter: int | str, agent
) -> None:
    note = "# Notes\n\n" + TRUNK
    write = calls(("w", "write_file", {"path": "MEMORY.md", "content": note}))
    first = run(chapter, provider, workdir, "Our default branch is trunk, not main. Remember this.", write)
    assert results(provider)["w"] == f"wrote {len(note)} bytes to MEMORY.md"
    assert (workdir / "MEMORY.md").read_text() == note
    lines = first.stderr.splitlines()
    announced = ANNOUNCED.format(tool="write_file")
    assert memory_lines(first.stderr) == [announced]
    assert lines[lines.index(announced) - 1].startswith("[round 1] write_file(")
    # The session that wrote the note keeps the prompt it started with, in every request.
    started, after_the_write = system_prompts(provider)
    assert after_the_write == started
    assert_memory(chapter, agent, started, PLACEHOLDER)

    run(chapter, provider, workdir, "Print the gh pr create command for a PR to the default branch")
    assert_memory(chapter, agent, system_prompts(provider)[-1], note.strip())

    provider.script(text("Yes."))
    again = run_agent(chapter, "-c", new_session_id(first.stderr), "Anything else?", provider=provider, cwd=workdir)
    assert_ok(again, "Yes.\n")
    assert system_prompts(provider)[-1] == started


@both
def test_every_change_to_memory_is_said_and_nothing_else_is(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    (workdir / "MEMORY.md").write_text("- Tests: pytest -q\n")
    (workdir / "sub").mkdir()
    absolute = str(workdir / "MEMORY.md")
    first = calls(
        ("r", "read_file", {"path": "MEMORY.md"}),
        ("e1", "edit_file", {"path": "MEMORY.md", "old_string": "pytest -q", "new_string": "pytest -q -x"}),
        ("miss", "edit_file", {"path": "./MEMORY.md", "old_string": "not there", "new_string": "x"}),
        ("other", "write_file", {"path": "notes.txt", "content": "not the memory\n"}),
        ("sub", "write_file", {"path": "sub/MEMORY.md", "content": "another directory's\n"}),
        ("e2", "edit_file", {"path": absolute, "old_string": "-x", "new_string": "-x --ff"}),
    )
    second = calls(("w", "write_file", {"path": "./MEMORY.md", "content": "- Tests: make test\n"}))
    result = run(chapter, provider, workdir, "Keep your notes current", first, second)
    got = results(provider)
    assert got["miss"].startswith("error: old_string was not found"), got["miss"]
    assert got["w"].startswith("wrote 19 bytes to ./MEMORY.md"), got["w"]
    assert (workdir / "MEMORY.md").read_text() == "- Tests: make test\n"
    # One line for each change to MEMORY.md, after the call that made it: the read, the failed
    # edit and the files of other names say nothing.
    shown = [line for line in result.stderr.splitlines() if line.startswith(("[memory:", "[round 1] ", "[round 2] "))]
    tags = ["[memory" if line.startswith("[memory:") else line.split("(")[0] for line in shown]
    assert tags == [
        "[round 1] read_file",
        "[round 1] edit_file",
        "[memory",
        "[round 1] edit_file",
        "[round 1] write_file",
        "[round 1] write_file",
        "[round 1] edit_file",
        "[memory",
        "[round 2] write_file",
        "[memory",
    ], shown
    assert memory_lines(result.stderr) == [ANNOUNCED.format(tool=tool) for tool in ("edit_file",) * 2 + ("write_file",)]


# ---------------------------------------------------------------- unchanged since you read it


@both
def test_a_memory_the_model_has_not_read_is_refused_and_after_a_read_it_is_changed(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    (workdir / "MEMORY.md").write_text("- Deploy with make deploy\n")
    edit = {"path": "MEMORY.md", "old_string": "make deploy", "new_string": "make release"}
    result = run(
        chapter,
        provider,
        workdir,
        "We deploy with make release now; update your memory",
        calls(("e1", "edit_file", edit), ("w1", "write_file", {"path": "MEMORY.md", "content": "- lost?\n"})),
        calls(("r", "read_file", {"path": "MEMORY.md"})),
        calls(("e2", "edit_file", edit)),
    )
    got = results(provider)
    assert got["e1"] == got["w1"] == NOT_READ.format(path="MEMORY.md")
    assert got["r"] == "- Deploy with make deploy\n"
    assert got["e2"].startswith("edited MEMORY.md: replaced 1 occurrence"), got["e2"]
    assert (workdir / "MEMORY.md").read_text() == "- Deploy with make release\n"
    assert memory_lines(result.stderr) == [ANNOUNCED.format(tool="edit_file")]


@pytest.mark.parametrize("tool", ["write_file", "edit_file"])
@both
def test_a_memory_changed_on_disk_since_the_read_is_refused_until_it_is_read_again(
    provider: FakeProvider, workdir: Path, chapter: int | str, tool: str
) -> None:
    """Another session writes MEMORY.md between this one's read and its write: the write is
    refused and the other writer's note stays; after a new read the model can change it."""
    memory = workdir / "MEMORY.md"
    memory.write_text(TRUNK)
    mine = {
        "write_file": {"path": "MEMORY.md", "content": TRUNK + "- Releases are tagged vX.Y.Z.\n"},
        "edit_file": {"path": "MEMORY.md", "old_string": "trunk", "new_string": "develop"},
    }[tool]
    # The request that brings the write is held until the other writer is done.
    provider.script(
        calls(("r1", "read_file", {"path": "MEMORY.md"})),
        calls(("w1", tool, mine), pause_after=0),
        calls(("r2", "read_file", {"path": "MEMORY.md"})),
        calls(("w2", "edit_file", {"path": "MEMORY.md", "old_string": "trunk", "new_string": "develop"})),
        text("Done."),
    )
    theirs = TRUNK + "- CI runs on every push.\n"
    with Live(chapter, "Record our release convention", provider=provider, cwd=workdir) as agent:
        provider.wait_paused()
        memory.write_text(theirs)
        provider.release()
        result = agent.completed()
    assert_ok(result, "Done.\n")
    got = results(provider)
    assert got["w1"] == CHANGED.format(path="MEMORY.md")
    assert got["r2"] == theirs
    assert got["w2"].startswith("edited MEMORY.md: replaced 1 occurrence"), got["w2"]
    assert memory.read_text() == theirs.replace("trunk", "develop")  # their line survived
    # Only the successful edit changed it: one backup, of their version.
    assert [path.read_text() for path in (workdir / ".trash").iterdir()] == [theirs]
    assert memory_lines(result.stderr) == [ANNOUNCED.format(tool="edit_file")]


@both
def test_the_same_bytes_written_again_since_the_read_do_not_stop_the_write(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    """Unchanged means the same bytes: a file rewritten as it was (an editor saving it,
    a touch) is still the text the model read."""
    memory = workdir / "MEMORY.md"
    memory.write_text(TRUNK)
    provider.script(
        calls(("r", "read_file", {"path": "MEMORY.md"})),
        calls(("e", "edit_file", {"path": "MEMORY.md", "old_string": "trunk", "new_string": "develop"}), pause_after=0),
        text("Done."),
    )
    with Live(chapter, "We renamed trunk to develop", provider=provider, cwd=workdir) as agent:
        provider.wait_paused()
        memory.write_text(TRUNK)
        os.utime(memory, (1_700_000_000, 1_700_000_000))
        provider.release()
        result = agent.completed()
    assert_ok(result, "Done.\n")
    assert results(provider)["e"].startswith("edited MEMORY.md: replaced 1 occurrence"), results(provider)
    assert memory.read_text() == TRUNK.replace("trunk", "develop")


# ---------------------------------------------------------------- what a prompt takes of MEMORY.md

LINE_CUT = "[... MEMORY.md was cut here: it has more than 200 lines ...]"
BYTE_CUT = "[... MEMORY.md was cut here: it is longer than 25,600 bytes ...]"
LINE_WARNING = "warning: MEMORY.md has more than 200 lines; only the first 200 are used"
BYTE_WARNING = "warning: MEMORY.md is longer than 25,600 bytes; only the first 25,600 are used"


def notes(lines: int, width: int) -> str:
    """`lines` notes of `width` bytes each, the newline included."""
    return "".join(f"- note {number:04d}: ".ljust(width - 2, "x") + ".\n" for number in range(1, lines + 1))


@pytest.mark.parametrize(
    ("content", "shown", "warned"),
    [
        (notes(200, 20), notes(200, 20).strip(), []),
        (notes(201, 20), notes(200, 20) + LINE_CUT, [LINE_WARNING]),
        (notes(128, 200), notes(128, 200).strip(), []),  # 25,600 bytes exactly
        (notes(128, 200) + "-\n", notes(128, 200) + BYTE_CUT, [BYTE_WARNING]),
        (notes(300, 100), notes(200, 100) + LINE_CUT, [BYTE_WARNING, LINE_WARNING]),  # cut twice
    ],
    ids=["200 lines", "201 lines", "25 KiB", "a byte more", "30 KB in 300 lines"],
)
@both
def test_a_prompt_takes_at_most_200_lines_and_25_kib_of_memory(
    provider: FakeProvider, workdir: Path, chapter: int | str, agent, content: str, shown: str, warned: list[str]
) -> None:
    (workdir / "MEMORY.md").write_text(content)
    result = run(chapter, provider, workdir, "hello")
    (system,) = system_prompts(provider)
    assert_memory(chapter, agent, system, shown)
    assert warnings(result.stderr) == warned
    assert memory_lines(result.stderr) == []


# ---------------------------------------------------------------- the book's experiment


@both
def test_a_corrected_note_is_what_the_fourth_session_sees(
    provider: FakeProvider, workdir: Path, chapter: int | str, agent
) -> None:
    """Session 1 is told the default branch, and writes it down; session 2 uses it; session 3
    is told it changed, and corrects the note; session 4 starts from the corrected text."""
    write = calls(("w", "write_file", {"path": "MEMORY.md", "content": TRUNK}))
    run(chapter, provider, workdir, "Our default branch is trunk, not main. Remember this.", write, answer="Noted.")
    assert_memory(chapter, agent, system_prompts(provider)[-1], PLACEHOLDER)

    second = run(chapter, provider, workdir, "Print the gh pr create command", answer="gh pr create --base trunk")
    assert_memory(chapter, agent, system_prompts(provider)[-1], TRUNK.strip())

    fix = {"path": "MEMORY.md", "old_string": "trunk", "new_string": "develop"}
    read = calls(("r", "read_file", {"path": "MEMORY.md"}))
    third = run(chapter, provider, workdir, "We renamed trunk to develop.", read, calls(("e", "edit_file", fix)))
    assert_memory(chapter, agent, system_prompts(provider)[-1], TRUNK.strip())
    assert memory_lines(third.stderr) == [ANNOUNCED.format(tool="edit_file")]

    run(chapter, provider, workdir, "Print the gh pr create command", answer="gh pr create --base develop")
    fourth = system_prompts(provider)[-1]
    assert_memory(chapter, agent, fourth, "- The default branch is develop, not main.")
    assert "trunk" not in fourth

    # Session 2, resumed, still has the note it started with.
    provider.script(text("Yes."))
    again = run_agent(chapter, "-c", new_session_id(second.stderr), "Sure?", provider=provider, cwd=workdir)
    assert_ok(again, "Yes.\n")
    assert notes_in(system_prompts(provider)[-1]) == TRUNK.strip()
