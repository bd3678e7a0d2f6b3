"""Chapter 17: on-demand triggering (exercises/ex17/agent.py), and agent.py, which keeps it.

What a skill costs, in numbers, on stderr. Before a session's line, what the
list of skills in its system prompt costs, paid with every request:
"[skill manifest: N skill(s), ~T tokens, billed with every request]", where T
is the program's own estimate of that part of the prompt; a resumed session
reports the prompt it started with, whatever .agents/skills/ holds today. After
each skill call that loads a body: "[skill body entered the conversation: ~T
tokens]", T the estimate of the result; nothing after a call that failed, and
no manifest line for a session whose prompt lists no skill.

The programs run as subprocesses against the fake provider; each T is computed
with the program's own estimate() (agent.py's differs from the chapter's), from
the part of the system message and the tool result the provider received.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import load_program, run_agent
from fake_provider import FakeProvider, Reply, text
from helpers import (
    SESSION_ID,
    assert_ok,
    calls,
    header_line,
    message_line,
    new_session_id,
    prompt_section,
    put_session,
    put_skill,
    results,
    resumed,
    system_prompts,
)

CHAPTER = 17
both = pytest.mark.parametrize("chapter", [CHAPTER, "final"])
TASK = "We shipped session renaming; record it in the CHANGELOG"
MANIFEST = re.compile(r"\[skill manifest: (\d+) (skills?), ~([\d,]+) tokens, billed with every request\]")
BODY = re.compile(r"\[skill body entered the conversation: ~([\d,]+) tokens\]")
CHANGELOG_BODY = "# Changelog entries\n\nAdd one line under `## Unreleased`, in the past tense."


@pytest.fixture
def estimate(chapter: int | str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The program's own estimate()."""
    inproc = tmp_path / "inproc"
    inproc.mkdir()
    return load_program(chapter, inproc, monkeypatch).estimate


def skill(name: str, description: str, body: str = "Do it well.") -> str:
    return f"---\nname: {name}\ndescription: {description}\n---\n\n{body}\n"


def put_skills(workdir: Path, count: int, width: int = 60) -> list[str]:
    names = [f"skill-{number:02d}" for number in range(count)]
    for name in names:
        put_skill(workdir, name, skill(name, f"Handles the {name} kind of task. ".ljust(width, "x")))
    return names


def manifest_line(count: int, tokens: int) -> str:
    return f"[skill manifest: {count} skill{'s' if count > 1 else ''}, ~{tokens:,} tokens, billed with every request]"


def listing_cost(estimate, system: str) -> int:
    part = prompt_section(system, "# Skills")
    assert part is not None, system
    return estimate(part)


def listed_in(system: str) -> int:
    """How many skills a prompt lists: the lines of its list that start with "- "."""
    return sum(line.startswith("- ") for line in prompt_section(system, "# Skills").split("\n"))


def cost_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if MANIFEST.fullmatch(line) or BODY.fullmatch(line)]


def run(chapter: int | str, provider: FakeProvider, workdir: Path, *replies: Reply, args: tuple[str, ...] = ()):
    provider.script(*replies, text("Done."))
    result = run_agent(chapter, *(args or (TASK,)), provider=provider, cwd=workdir)
    assert_ok(result, "Done.\n")
    return result


# ---------------------------------------------------------------- the list's cost


@pytest.mark.parametrize("count", [1, 3, 40])
@both
def test_a_new_session_says_what_its_list_of_skills_costs_before_its_line(
    provider: FakeProvider, workdir: Path, chapter: int | str, estimate, count: int
) -> None:
    put_skills(workdir, count, width=1000 if count == 40 else 60)  # 40 long ones: over 1,000 tokens
    result = run(chapter, provider, workdir)
    (system,) = system_prompts(provider)
    tokens = listing_cost(estimate, system)
    assert tokens > (1000 if count == 40 else 10)
    listed = listed_in(system)  # agent.py may list fewer: its list has a cap
    assert listed == count if chapter == CHAPTER else 0 < listed <= count
    lines = result.stderr.splitlines()
    line = manifest_line(listed, tokens)
    assert cost_lines(result.stderr) == [line]
    assert lines[lines.index(line) + 1] == f"[new session {new_session_id(result.stderr)}]"


@pytest.mark.parametrize("layout", ["no skills", "only invalid skills"])
@both
def test_no_list_no_cost_line(provider: FakeProvider, workdir: Path, chapter: int | str, layout: str) -> None:
    if layout == "only invalid skills":
        put_skill(workdir, "broken", "no front matter\n")
        put_skill(workdir, "misnamed", skill("other-name", "Misnamed."))
    result = run(chapter, provider, workdir)
    assert "[skill manifest" not in result.stderr
    assert cost_lines(result.stderr) == []


# ---------------------------------------------------------------- a body's cost


@both
def test_each_body_loaded_is_said_with_its_cost_and_a_failed_call_says_nothing(
    provider: FakeProvider, workdir: Path, chapter: int | str, estimate
) -> None:
    put_skill(workdir, "changelog", skill("changelog", "Adds a CHANGELOG entry.", CHANGELOG_BODY))
    put_skill(workdir, "release-notes", skill("release-notes", "Drafts release notes.", "Group by type. " * 200))
    result = run(
        chapter,
        provider,
        workdir,
        calls(("c", "skill", {"name": "changelog"}), ("nope", "skill", {"name": "nope"})),
        calls(("r", "skill", {"name": "release-notes"})),
    )
    got = results(provider)
    assert got["nope"].startswith("error: ")
    assert got["r"].startswith('[skill "release-notes", directory: .agents/skills/release-notes]\n\n')
    shown = [
        line for line in result.stderr.splitlines() if line.startswith(("[round 1] ", "[round 2] ", "[skill body"))
    ]
    assert [line.split("(")[0] for line in shown] == [
        "[round 1] skill",
        f"[skill body entered the conversation: ~{estimate(got['c']):,} tokens]",
        "[round 1] skill",  # nope: nothing after it
        "[round 2] skill",
        f"[skill body entered the conversation: ~{estimate(got['r']):,} tokens]",
    ], shown
    assert estimate(got["r"]) > estimate(got["c"]) > 0


# ---------------------------------------------------------------- a resumed session


@both
def test_a_resumed_session_reports_the_list_it_started_with(
    provider: FakeProvider, workdir: Path, chapter: int | str, estimate
) -> None:
    put_skill(workdir, "changelog", skill("changelog", "Adds a CHANGELOG entry.", CHANGELOG_BODY))
    put_skill(workdir, "release-notes", skill("release-notes", "Drafts release notes."))
    first = run(chapter, provider, workdir)
    session_id = new_session_id(first.stderr)
    (started,) = system_prompts(provider)
    line = manifest_line(2, listing_cost(estimate, started))
    assert cost_lines(first.stderr) == [line]

    # A skill added and a description grown since: the session's list is the one it started with.
    put_skill(workdir, "api-docs", skill("api-docs", "Writes API pages."))
    put_skill(workdir, "release-notes", skill("release-notes", "Drafts release notes. " * 40))
    again = run(chapter, provider, workdir, args=("-c", session_id, "Go on"))
    lines = again.stderr.splitlines()
    assert cost_lines(again.stderr) == [line]
    assert lines[lines.index(line) + 1].startswith(f"[resumed session {session_id}, ")
    assert system_prompts(provider)[-1] == started

    # Every skill removed since: the same list, and a body that cannot load costs nothing.
    for name in ("changelog", "release-notes", "api-docs"):
        (workdir / ".agents" / "skills" / name / "SKILL.md").unlink()
    last = run(
        chapter, provider, workdir, calls(("c", "skill", {"name": "changelog"})), args=("-c", session_id, "More")
    )
    assert cost_lines(last.stderr) == [line]
    assert results(provider)["c"].startswith("error: ")


@both
def test_a_resumed_session_created_without_skills_reports_none(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    first = run(chapter, provider, workdir)
    assert cost_lines(first.stderr) == []
    put_skill(workdir, "changelog", skill("changelog", "Adds a CHANGELOG entry."))
    again = run(chapter, provider, workdir, args=("-c", new_session_id(first.stderr), "Go on"))
    assert cost_lines(again.stderr) == []


@both
def test_a_session_file_whose_first_message_is_damaged_resumes_without_a_traceback(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    """A hand-edited file: the first message has no role. The cost line has nothing to
    report, and the request goes out as before."""
    put_skill(workdir, "changelog", skill("changelog", "Adds a CHANGELOG entry."))
    put_session(workdir, header_line() + message_line({"content": "no role"}))
    provider.validate = False  # it is the program's reading that is under test, not the provider's
    again = run(chapter, provider, workdir, args=("-c", SESSION_ID, "Go on"))
    assert resumed(again.stderr)[0] == SESSION_ID
    assert cost_lines(again.stderr) == []
    assert provider.chat_requests[-1]["messages"][-1] == {"role": "user", "content": "Go on"}
