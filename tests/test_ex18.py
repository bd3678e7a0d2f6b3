"""Chapter 18: the agent drafts skills, a person keeps them (exercises/ex18/agent.py),
and agent.py, which keeps this.

Writing a skill and making it count are two steps. Every new prompt tells the
model how to draft one: into .agents/skills-proposed/<name>/SKILL.md, which
nothing reads, written without a question. What steers every new session,
AGENTS.md and .agents/skills/, a person keeps: a write or an edit of it asks at
the terminal (y/N), however the path is spelled (./, absolute, sub/.., a link,
another case), and with no terminal it is refused; the read-before-write error
comes first, with no question. A bash command whose words name such a path, as
a path or as a pattern that matches one, is never silent, not even a read.
Once a person moves a draft into .agents/skills/, a new session lists it.

The programs run as subprocesses against the fake provider, at a
pseudo-terminal (conftest.Terminal) where the test answers the questions, or
with no terminal at all. agent.py may word its question differently: the tests
check that the terminal asked ("allow? (y/N)") about the path or the command,
and that the result starts with "error: permission denied".
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import load_program, run_agent
from fake_provider import FakeProvider, Reply, text
from helpers import (
    PROMPT_SECTION,
    assert_ok,
    bash_calls,
    calls,
    file_records,
    prompt_section,
    put_skill,
    results,
    session_file,
    snapshot,
    system_prompts,
    tool_names,
)

CHAPTER = 18
both = pytest.mark.parametrize("chapter", [CHAPTER, "final"])
TASK = "Add a line about session renaming to CHANGELOG.md; if it is worth it, save a skill for it"
KEPT = ".agents/skills/changelog/SKILL.md"
DRAFT = ".agents/skills-proposed/changelog/SKILL.md"
QUESTION = "allow? (y/N)"
NOBODY = "(no answer from a terminal: refused)"
DENIED = "error: permission denied"
WRITE_REFUSED = "error: permission denied — the user did not approve this write; a person keeps that file"
RUN_REFUSED = "error: permission denied — the user did not approve this command"
NOT_READ = "error: {path} already exists and has not been read in this run; read it first with read_file"
GUIDANCE = "# Drafting skills"
SKILL = """\
---
name: changelog
description: Adds an entry to CHANGELOG.md under Unreleased. Use it when a change has shipped.
---

Add one line under `## Unreleased`, in the past tense.
"""


def run(chapter: int | str, provider: FakeProvider, workdir: Path, *replies: Reply, answers: str | None = None):
    """A new session to its "Done.", at a terminal answering `answers`, or with none (None)."""
    provider.script(*replies, text("Done."))
    result = run_agent(chapter, TASK, provider=provider, cwd=workdir, answers=answers)
    assert_ok(result, "Done.\n")
    return result


def questions(terminal: str) -> list[str]:
    """What the terminal showed up to each question: one text a question, its subject in it."""
    return terminal.split(QUESTION)[:-1]


def asks_about(chapter: int | str, shown: str, workdir: Path, spelled: str) -> bool:
    """Did a question show this path? The chapter shows it as the model spelled it; agent.py
    may show it resolved."""
    if spelled in shown:
        return True
    real = os.path.realpath(workdir / spelled)
    return chapter != CHAPTER and (real in shown or os.path.relpath(real, workdir) in shown)


def refused(chapter: int | str, result: str, exact: str = WRITE_REFUSED) -> bool:
    return result == exact if chapter == CHAPTER else result.startswith(DENIED)


def files(workdir: Path) -> dict:
    """Everything in the working directory but the sessions."""
    return {name: entry for name, entry in snapshot(workdir).items() if not name.startswith(".sessions")}


def write(call_id: str, path: str, content: str = SKILL) -> tuple[str, str, dict]:
    return (call_id, "write_file", {"path": path, "content": content})


# ---------------------------------------------------------------- the guidance, and drafts


@pytest.mark.parametrize("skills", [0, 1])
@both
def test_every_new_prompt_tells_the_model_to_draft_skills_in_skills_proposed(
    provider: FakeProvider,
    workdir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    chapter: int | str,
    skills: int,
) -> None:
    if skills:
        put_skill(workdir, "changelog", SKILL)
    run(chapter, provider, workdir)
    (system,) = system_prompts(provider)
    guidance = prompt_section(system, GUIDANCE)
    assert guidance is not None, system
    assert ".agents/skills-proposed/<name>/SKILL.md" in guidance and ".agents/skills/" in guidance
    parts = system.split(PROMPT_SECTION)
    memory = parts.index(prompt_section(system, "# Your memory (MEMORY.md)"))
    assert parts.index(guidance) < memory
    if skills:
        assert parts.index(prompt_section(system, "# Skills")) < parts.index(guidance)
    if chapter == CHAPTER:
        (tmp_path / "inproc").mkdir()
        agent = load_program(chapter, tmp_path / "inproc", monkeypatch)
        assert guidance == agent.AUTHORING_GUIDANCE
        assert parts.index(guidance) == 1 + skills and len(parts) == 3 + skills


@both
def test_a_draft_is_written_without_a_question_and_counts_once_a_person_moves_it(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    first = run(chapter, provider, workdir, calls(write("d", DRAFT)), answers="")
    assert QUESTION not in first.terminal and NOBODY not in first.stderr
    assert results(provider)["d"] == f"wrote {len(SKILL)} bytes to {DRAFT}"
    assert (workdir / DRAFT).read_text() == SKILL  # its directories made on the way

    # Nothing reads a draft: a new session lists no skill.
    run(chapter, provider, workdir)
    request = provider.chat_requests[-1]
    assert prompt_section(request["messages"][0]["content"], "# Skills") is None
    assert "skill" not in tool_names(request)

    # A person moves it: the next new session lists it and offers the tool.
    (workdir / ".agents" / "skills").mkdir()
    (workdir / DRAFT).parent.rename(workdir / KEPT.rsplit("/", 1)[0])
    third = run(chapter, provider, workdir)
    request = provider.chat_requests[-1]
    listing = prompt_section(request["messages"][0]["content"], "# Skills")
    assert listing is not None and listing.endswith(
        "\n- changelog: Adds an entry to CHANGELOG.md under Unreleased. Use it when a change has shipped."
    )
    assert "skill" in tool_names(request)
    assert file_records(session_file(workdir, third.stderr))[0]["skills"] == ["changelog"]


@both
def test_files_that_steer_no_session_are_written_without_a_question(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    paths = ["MEMORY.md", "AGENTS.md.bak", "docs/skills/changelog/SKILL.md", ".agents/skills-proposed/x/SKILL.md"]
    result = run(chapter, provider, workdir, calls(*(write(f"w{i}", path) for i, path in enumerate(paths))), answers="")
    assert QUESTION not in result.terminal and NOBODY not in result.stderr
    got = results(provider)
    for i, path in enumerate(paths):
        assert got[f"w{i}"] == f"wrote {len(SKILL)} bytes to {path}", got[f"w{i}"]
        assert (workdir / path).read_text() == SKILL


# ---------------------------------------------------------------- writes a person keeps


@both
def test_with_no_terminal_a_write_a_person_keeps_is_refused(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    result = run(chapter, provider, workdir, calls(write("s", KEPT), write("r", "AGENTS.md", "- Tabs.\n")))
    got = results(provider)
    assert refused(chapter, got["s"]) and refused(chapter, got["r"]), got
    assert result.stderr.count(NOBODY) == 2, result.stderr
    assert not (workdir / ".agents").exists() and not (workdir / "AGENTS.md").exists()  # not even a directory


@pytest.mark.parametrize("answer", ["y", "n"])
@both
def test_at_a_terminal_the_answer_decides_the_write(
    provider: FakeProvider, workdir: Path, chapter: int | str, answer: str
) -> None:
    result = run(chapter, provider, workdir, calls(write("s", KEPT)), answers=f"{answer}\n")
    (shown,) = questions(result.terminal)
    assert asks_about(chapter, shown, workdir, KEPT), result.terminal
    assert NOBODY not in result.stderr
    got = results(provider)["s"]
    if answer == "y":
        assert got == f"wrote {len(SKILL)} bytes to {KEPT}"
        assert (workdir / KEPT).read_text() == SKILL
    else:
        assert refused(chapter, got), got
        assert not (workdir / ".agents").exists()


@both
def test_an_unread_kept_file_gets_the_read_first_error_before_any_question(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    put_skill(workdir, "changelog", SKILL)
    (workdir / "AGENTS.md").write_text("- Tabs.\n")
    before = files(workdir)
    edit = {"path": KEPT, "old_string": "past tense", "new_string": "present tense"}
    result = run(
        chapter,
        provider,
        workdir,
        calls(write("w", KEPT), ("e", "edit_file", edit), write("r", "AGENTS.md", "- Spaces.\n")),
        answers="",
    )
    got = results(provider)
    assert got == {
        "w": NOT_READ.format(path=KEPT),
        "e": NOT_READ.format(path=KEPT),
        "r": NOT_READ.format(path="AGENTS.md"),
    }
    assert QUESTION not in result.terminal and NOBODY not in result.stderr
    assert files(workdir) == before


@both
def test_an_edit_of_a_kept_file_asks_after_the_read_and_each_answer_decides(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    put_skill(workdir, "changelog", SKILL)
    (workdir / "AGENTS.md").write_text("- Tabs.\n")
    result = run(
        chapter,
        provider,
        workdir,
        calls(("r1", "read_file", {"path": KEPT}), ("r2", "read_file", {"path": "AGENTS.md"})),
        calls(
            ("e1", "edit_file", {"path": KEPT, "old_string": "past tense", "new_string": "present tense"}),
            ("e2", "edit_file", {"path": "AGENTS.md", "old_string": "Tabs", "new_string": "Spaces"}),
        ),
        answers="n\ny\n",
    )
    got = results(provider)
    assert got["r1"] == SKILL and got["r2"] == "- Tabs.\n"  # a read asks nothing
    first, second = questions(result.terminal)
    assert asks_about(chapter, first, workdir, KEPT) and asks_about(chapter, second, workdir, "AGENTS.md")
    assert refused(chapter, got["e1"]), got["e1"]
    assert got["e2"].startswith("edited AGENTS.md: replaced 1 occurrence"), got["e2"]
    assert (workdir / KEPT).read_text() == SKILL
    assert (workdir / "AGENTS.md").read_text() == "- Spaces.\n"


def spellings(workdir: Path, layout: str) -> list[str]:
    """Paths that name AGENTS.md or a file in .agents/skills/, each its own way, in a working
    directory set up for them."""
    if layout == ".agents a link":
        (workdir / "config" / "agents" / "skills").mkdir(parents=True)
        os.symlink("config/agents", workdir / ".agents")
        return [KEPT, "config/agents/skills/x/SKILL.md", str(workdir / "config/agents/skills/x/SKILL.md")]
    (workdir / ".agents" / "skills").mkdir(parents=True)
    (workdir / "sub").mkdir()
    os.symlink(".agents/skills", workdir / "shortcut")
    os.symlink("AGENTS.md", workdir / "rules-link.md")  # dangling until AGENTS.md is written
    return [
        KEPT,
        f"./{KEPT}",
        str(workdir / KEPT),
        f"sub/../{KEPT}",
        "shortcut/changelog/SKILL.md",
        ".AGENTS/SKILLS/changelog/SKILL.md",  # one file on a file system that ignores case (macOS)
        ".agents/Skills/changelog/SKILL.md",
        "AGENTS.md",
        "./AGENTS.md",
        "sub/../AGENTS.md",
        str(workdir / "AGENTS.md"),
        "agents.md",
        "rules-link.md",
    ]


@pytest.mark.parametrize("layout", ["a directory", ".agents a link"])
@both
def test_every_spelling_of_a_kept_path_asks(
    provider: FakeProvider, workdir: Path, chapter: int | str, layout: str
) -> None:
    paths = spellings(workdir, layout)
    before = files(workdir)
    result = run(
        chapter,
        provider,
        workdir,
        calls(*(write(f"w{i}", path) for i, path in enumerate(paths))),
        answers="n\n" * len(paths),
    )
    shown = questions(result.terminal)
    assert len(shown) == len(paths), result.terminal
    for path, question in zip(paths, shown, strict=True):
        assert asks_about(chapter, question, workdir, path), (path, question)
    got = results(provider)
    assert all(refused(chapter, got[f"w{i}"]) for i in range(len(paths))), got
    assert files(workdir) == before


# ---------------------------------------------------------------- bash near what a person keeps

ASKED = ["ls .agents/skills", "cat .agents/skills/x/SKILL.md", "cat .agents/sk*/x/SKILL.md", "cat AGENTS.md"]
SILENT = ["ls", "cat notes.txt", "cat .agents/skills-proposed/x/SKILL.md"]


@pytest.mark.parametrize("answer", ["y", "n"])
@both
def test_a_command_that_names_a_kept_path_asks_even_to_read(
    provider: FakeProvider, workdir: Path, chapter: int | str, answer: str
) -> None:
    x = SKILL.replace("changelog", "x")
    put_skill(workdir, "x", x)
    draft = workdir / ".agents" / "skills-proposed" / "x" / "SKILL.md"
    draft.parent.mkdir(parents=True)
    draft.write_text("a draft\n")
    (workdir / "AGENTS.md").write_text("- Tabs.\n")
    (workdir / "notes.txt").write_text("buy milk\n")
    commands = {f"a{i}": command for i, command in enumerate(ASKED)} | {f"s{i}": c for i, c in enumerate(SILENT)}
    result = run(chapter, provider, workdir, bash_calls(**commands), answers=f"{answer}\n" * len(ASKED))
    shown = questions(result.terminal)
    assert len(shown) == len(ASKED), result.terminal
    for command, question in zip(ASKED, shown, strict=True):
        assert command in question, (command, question)
    got = results(provider)
    for i in range(len(ASKED)):
        if answer == "n":
            assert refused(chapter, got[f"a{i}"], RUN_REFUSED), got[f"a{i}"]
        else:
            assert not got[f"a{i}"].startswith("error:"), got[f"a{i}"]
    if answer == "y":
        assert got["a0"] == "x\n" and got["a1"] == x and got["a3"] == "- Tabs.\n"
        assert x in got["a2"] and "a draft\n" in got["a2"]  # the pattern matches the draft too
    assert "notes.txt" in got["s0"].split("\n")
    assert got["s1"] == "buy milk\n" and got["s2"] == "a draft\n"
