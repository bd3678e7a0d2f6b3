"""Chapter 16: a minimal skill loader (exercises/ex16/agent.py), and agent.py, which keeps it.

A skill is .agents/skills/<name>/SKILL.md in the Agent Skills format: a YAML
front matter with its name (the directory's name: lowercase words joined by
single hyphens, at most 64 characters) and a description (1 to 1,024
characters), then its body. A new session's prompt lists every valid skill
after the rules, "- name: description" sorted by name, the same bytes every
time; an invalid one is skipped with one warning that names it and says why.
The skill tool is offered exactly when the list has a skill, and returns a
skill's body, read when it is asked for, with the directory its relative
references are in. The session's header records the listed names: a resume
offers the tool exactly when its header lists skills, and only those.

The programs run as subprocesses against the fake provider; the tests read the
system message and the tools of every request, the tool results, the session
header, and stderr. The front matter is written the way published collections
write it, and each description is checked against what YAML means by it
(worked out by hand here: the tests do not depend on a YAML library); the exact
values, which the prompt shows with their whitespace collapsed, are checked
in-process on the program's find_skills().
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from conftest import load_program, run_agent
from fake_provider import FakeProvider, Reply, text
from helpers import (
    PROMPT_SECTION,
    SESSION_ID,
    assert_ok,
    bodies,
    calls,
    file_records,
    header_line,
    new_session_id,
    prompt_section,
    put_session,
    put_skill,
    results,
    session_bytes,
    session_file,
    system_prompts,
    tool_names,
    warnings,
)

CHAPTER = 16
both = pytest.mark.parametrize("chapter", [CHAPTER, "final"])
HEADING = "# Skills"
TASK = "We shipped session renaming; record it in the CHANGELOG"

CHANGELOG_BODY = """\
# Changelog entries

1. Read CHANGELOG.md.
2. Add one line under `## Unreleased`, in the past tense.
3. Run `scripts/check.sh`; the format is in `references/format.md`."""
CHANGELOG = f"""\
---
name: changelog
description: Adds an entry to CHANGELOG.md under Unreleased. Use it when a change has shipped.
---

{CHANGELOG_BODY}
"""
CHANGELOG_LINE = "- changelog: Adds an entry to CHANGELOG.md under Unreleased. Use it when a change has shipped."
RELEASE_NOTES = """\
---
name: release-notes
description: Drafts the release notes from the git log. Use it when a version is tagged.
---

Run `git log --oneline $(git describe --tags --abbrev=0)..HEAD` and group the lines.
"""


def skill(name: str, description: str, body: str = "Do it well.") -> str:
    return f"---\nname: {name}\ndescription: {description}\n---\n\n{body}\n"


def listing(system: str) -> list[str]:
    """The lines of a prompt's list of skills: a heading, an instruction, then one line a skill."""
    part = prompt_section(system, HEADING)
    assert part is not None, system
    heading, instruction, lines = part.split("\n\n")
    assert heading == HEADING and "skill tool" in instruction, part
    return lines.split("\n")


def naming(warned: list[str], directory: str) -> list[str]:
    """The warnings that name a skill's directory: quoted (the chapter), or by its path."""
    name = re.escape(directory)
    return [line for line in warned if re.search(rf"'{name}'|skills/{name}(?=[/: ])", line)]


def header(result) -> dict:
    """The header record of the session a run created."""
    return file_records(session_file(result.cwd, result.stderr))[0]


def run(chapter: int | str, provider: FakeProvider, workdir: Path, *replies: Reply, task: str = TASK, **options):
    """A new session to its answer, "Done."; the run knows its working directory."""
    provider.script(*replies, text("Done."))
    result = run_agent(chapter, task, provider=provider, cwd=workdir, **options)
    assert_ok(result, "Done.\n")
    result.cwd = workdir
    return result


def resume(chapter: int | str, provider: FakeProvider, workdir: Path, session_id: str, *replies: Reply):
    provider.script(*replies, text("Done."))
    result = run_agent(chapter, "-c", session_id, "Go on", provider=provider, cwd=workdir)
    assert_ok(result, "Done.\n")
    return result


# ---------------------------------------------------------------- the list in the prompt


@both
def test_the_list_comes_after_the_rules_sorted_by_name_and_the_same_bytes_every_time(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    (workdir / "AGENTS.md").write_text("- Tabs.\n")
    # Made in an order that is not the names' order.
    put_skill(workdir, "zz-last", skill("zz-last", "Comes last."))
    put_skill(workdir, "release-notes", RELEASE_NOTES)
    put_skill(workdir, "api-docs", skill("api-docs", "Writes API pages   from\n  the OpenAPI file."))
    put_skill(workdir, "changelog", CHANGELOG)
    put_skill(workdir, "a11y", skill("a11y", "Checks the pages for accessibility."))
    first = run(chapter, provider, workdir)
    second = run(chapter, provider, workdir, task="Something else")
    one, two = system_prompts(provider)
    assert one == two  # the cacheable prefix, byte for byte
    assert provider.chat_requests[0]["tools"] == provider.chat_requests[1]["tools"]
    assert listing(one) == [
        "- a11y: Checks the pages for accessibility.",
        "- api-docs: Writes API pages from the OpenAPI file.",
        CHANGELOG_LINE,
        "- release-notes: Drafts the release notes from the git log. Use it when a version is tagged.",
        "- zz-last: Comes last.",
    ]
    parts = one.split(PROMPT_SECTION)
    assert parts[1] == "# Project rules (AGENTS.md)\n\n- Tabs." and parts[2].startswith(HEADING + "\n")
    assert prompt_section(one, "# Your memory (MEMORY.md)") is not None
    if chapter == CHAPTER:
        assert len(parts) == 4
    for result in (first, second):
        assert header(result)["skills"] == ["a11y", "api-docs", "changelog", "release-notes", "zz-last"]
        assert warnings(result.stderr) == []


@pytest.mark.parametrize("layout", ["no .agents/skills", "empty .agents/skills", "only an invalid skill", "one skill"])
@both
def test_the_skill_tool_is_offered_exactly_when_the_list_has_a_skill(
    provider: FakeProvider, workdir: Path, chapter: int | str, layout: str
) -> None:
    if layout == "empty .agents/skills":
        (workdir / ".agents" / "skills").mkdir(parents=True)
    elif layout == "only an invalid skill":
        put_skill(workdir, "broken", "no front matter\n")
    elif layout == "one skill":
        put_skill(workdir, "changelog", CHANGELOG)
    result = run(chapter, provider, workdir)
    (request,) = provider.chat_requests
    (system,) = system_prompts(provider)
    listed = layout == "one skill"
    assert ("skill" in tool_names(request)) == listed
    assert (prompt_section(system, HEADING) is not None) == listed
    assert header(result)["skills"] == (["changelog"] if listed else [])
    if listed:
        (tool,) = [tool for tool in request["tools"] if tool["function"]["name"] == "skill"]
        assert tool["function"]["parameters"]["required"] == ["name"]
        assert listing(system) == [CHANGELOG_LINE]
    assert len(warnings(result.stderr)) == (layout == "only an invalid skill")


# ---------------------------------------------------------------- skills that are skipped

DESCRIPTION_RULE = "a description has 1 to 1,024 characters; this one has {}"
NAME_RULE = "a name is lowercase letters and digits, in words joined by single hyphens, at most 64 characters"
NO_FRONT_MATTER = "SKILL.md does not start with a front matter between two --- lines"
# directory -> (its SKILL.md, or None for none; a word the warning must have; the chapter's reason)
INVALID = {
    "no-front-matter": ("# Just a body\n", "front matter", NO_FRONT_MATTER),
    "unclosed": ("---\nname: unclosed\ndescription: Never closed.\n\n# body\n", "front matter", NO_FRONT_MATTER),
    "deploy": (skill("deploy-prod", "Deploys."), "name", "its name ('deploy-prod') is not the name of its directory"),
    "nameless": ("---\ndescription: Has no name.\n---\n", "name", "its name ('') is not the name of its directory"),
    "Upper_Case": (skill("Upper_Case", "Shouts."), "name", NAME_RULE),
    "double--hyphen": (skill("double--hyphen", "Two hyphens."), "name", NAME_RULE),
    "-leading": (skill("-leading", "A hyphen first."), "name", NAME_RULE),
    "trailing-": (skill("trailing-", "A hyphen last."), "name", NAME_RULE),
    "a" * 65: (skill("a" * 65, "A name one character too long."), "name", NAME_RULE),
    "no-description": ("---\nname: no-description\n---\n", "description", DESCRIPTION_RULE.format(0)),
    "blank-description": (skill("blank-description", "'   '"), "description", DESCRIPTION_RULE.format(0)),
    "long-description": (skill("long-description", "x" * 1025), "description", DESCRIPTION_RULE.format("1,025")),
    # Over the 32 KiB cap as well: still one warning, its reason, not the cut.
    "long-and-wrong": (
        skill("long-and-wrong", "x" * 1025, "y" * 40_000),
        "description",
        DESCRIPTION_RULE.format("1,025"),
    ),
    "no-skill-file": (None, "SKILL.md", "it has no SKILL.md file"),
    "lowercase-file-name": ("skill.md", "SKILL.md", "it has no SKILL.md file"),
}
# At the limits, and valid.
VALID = {"a" * 64: skill("a" * 64, "y" * 1024), "v2-api": skill("v2-api", "Calls the v2 API."), "x": skill("x", "X.")}


@both
def test_each_invalid_skill_is_skipped_with_one_warning_naming_it_and_why(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    for directory, (content, _, _) in INVALID.items():
        if content is None:
            (workdir / ".agents" / "skills" / directory).mkdir(parents=True)
            (workdir / ".agents" / "skills" / directory / "README.md").write_text("Not a skill.\n")
        elif content == "skill.md":
            put_skill(workdir, directory, skill(directory, "Named in lowercase.")).rename(
                workdir / ".agents" / "skills" / directory / "skill.md"
            )
        else:
            put_skill(workdir, directory, content)
    for directory, content in VALID.items():
        put_skill(workdir, directory, content)
    result = run(chapter, provider, workdir)

    warned = warnings(result.stderr)
    assert len(warned) == len(INVALID), warned
    for directory, (_, word, reason) in INVALID.items():
        (line,) = naming(warned, directory)
        assert line.startswith("warning: skipped skill ") and word in line, line
        if chapter == CHAPTER:
            assert line == f"warning: skipped skill {directory!r}: {reason}"
    (system,) = system_prompts(provider)
    assert [line.split(":")[0] for line in listing(system)] == [f"- {name}" for name in sorted(VALID)]
    assert header(result)["skills"] == sorted(VALID)
    assert "skill" in tool_names(provider.chat_requests[0])


# ---------------------------------------------------------------- front matter as published collections write it

# directory -> (SKILL.md, the description as YAML means it)
PUBLISHED = {
    "release-notes": (
        "---\n"
        "name: release-notes\n"
        "description: >\n"
        "  Drafts release notes from the git log since the last tag.\n"
        "  Use it when the user tags a version or asks what changed.\n"
        "\n"
        "  Not for CHANGELOG.md entries.\n"
        "license: Apache-2.0\n"
        "---\n\n# Release notes\n",
        "Drafts release notes from the git log since the last tag. Use it when the user tags a version"
        " or asks what changed.\nNot for CHANGELOG.md entries.\n",
    ),
    "pdf-forms": (
        "---\n"
        "# The front matter of the Agent Skills format\n"
        "name: pdf-forms\n"
        "description: >-\n"
        "  Fills in PDF forms with pypdf.\n"
        "  Use it for any .pdf that has fields.\n"
        "metadata:\n"
        "  author: example-org\n"
        '  version: "1.2"\n'
        "  description: not the skill's description\n"
        "allowed-tools: Bash(python:*) Read Write\n"
        "---\n\nUse `scripts/fill.py`.\n",
        "Fills in PDF forms with pypdf. Use it for any .pdf that has fields.",
    ),
    "sql-review": (
        "---\n"
        "name: 'sql-review'\n"
        "description: |\n"
        "  Reviews SQL migrations.\n"
        "  Use it before a migration is merged.\n"
        "---\n\nCheck for locks.\n",
        "Reviews SQL migrations.\nUse it before a migration is merged.\n",
    ),
    "changelog-order": (
        "---\n"
        "name: changelog-order\n"
        "description: |+\n"
        "  Keeps the CHANGELOG in order.\n"
        "  Use it after every release.\n"
        "\n"
        "compatibility: Requires git\n"
        "---\n\nSort the sections.\n",
        "Keeps the CHANGELOG in order.\nUse it after every release.\n\n",
    ),
    "lint-fix": (
        "---\n"
        "name: lint-fix\n"
        "description: |-\n"
        "  Fixes what ruff reports.\n"
        "  Use it when the linter fails.\n"
        "---\n\nRun `ruff check --fix`.\n",
        "Fixes what ruff reports.\nUse it when the linter fails.",
    ),
    "commit-message": (
        "---\n"
        "name: commit-message\n"
        "description: 'Writes the team''s commit messages: type(scope): summary. # is no comment here'\n"
        "---\n\nOne line, then a blank line.\n",
        "Writes the team's commit messages: type(scope): summary. # is no comment here",
    ),
    "config-format": (
        "---\n"
        "name: config-format\n"
        'description: "Formats \\"quoted\\" config values,\\ttabs, caf\\u00e9 and back\\\\slashes"\n'
        "---\n\nKeep the keys sorted.\n",
        'Formats "quoted" config values,\ttabs, caf\u00e9 and back\\slashes',
    ),
    "color-output": (  # escapes YAML has and JSON has not
        "---\n"
        "name: color-output\n"
        'description: "Strips \\e[0m colour codes, keeps \\x41\\u00e9 and a no-break\\_space"\n'
        "---\n\nUse scripts/strip.py.\n",
        "Strips \x1b[0m colour codes, keeps A\u00e9 and a no-break\xa0space",
    ),
    "table-format": (  # a folded block keeps the line breaks around its more indented lines
        "---\n"
        "name: table-format\n"
        "description: >\n"
        "  Formats Markdown tables. Use it on a table like\n"
        "\n"
        "    | a | b |\n"
        "    | 1 | 2 |\n"
        "\n"
        "  when its columns do not line up.\n"
        "---\n\nAlign the pipes.\n",
        "Formats Markdown tables. Use it on a table like\n\n  | a | b |\n  | 1 | 2 |\n\nwhen its columns do not line up.\n",
    ),
    "api-docs": (
        "---\n"
        "name: api-docs\n"
        "\n"
        "description: Writes API reference pages\n"
        "  from the OpenAPI file. Use it when an\n"
        "  endpoint changes.   # keep it short\n"
        "\n"
        "license: MIT\n"
        "---\n\nOne page an endpoint.\n",
        "Writes API reference pages from the OpenAPI file. Use it when an endpoint changes.",
    ),
    "csharp-style": (
        "---\nname: csharp-style\ndescription: Formats C# and F# code the way the team does.\n---\n\nUse dotnet format.\n",
        "Formats C# and F# code the way the team does.",
    ),
    "csv-tools": (
        "\ufeff---\r\n"
        'name: "csv-tools"\r\n'
        "description: >\r\n"
        "  Cleans CSV files: quoting, encodings and\r\n"
        "  line endings.\r\n"
        "---\r\n\r\n# CSV\r\n\r\nUse scripts/clean.py.\r\n",
        "Cleans CSV files: quoting, encodings and line endings.\n",
    ),
}


def put_published(workdir: Path) -> None:
    for directory, (content, _) in PUBLISHED.items():
        path = put_skill(workdir, directory, content)
        (path.parent / "scripts").mkdir()  # beside SKILL.md, as collections ship them
        (path.parent / "scripts" / "run.sh").write_text("#!/bin/sh\necho run\n")
        (path.parent / "references").mkdir()
        (path.parent / "references" / "guide.md").write_text("---\nname: not-a-skill\n---\n")


@both
def test_front_matter_as_collections_write_it_lists_each_description_as_yaml_means_it(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    put_published(workdir)
    result = run(chapter, provider, workdir)
    assert warnings(result.stderr) == []
    (system,) = system_prompts(provider)
    assert listing(system) == [
        f"- {name}: {' '.join(description.split())}" for name, (_, description) in sorted(PUBLISHED.items())
    ]
    assert header(result)["skills"] == sorted(PUBLISHED)


@pytest.mark.parametrize("chapter", [CHAPTER, "final"])
def test_each_description_is_the_value_yaml_gives_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chapter: int | str
) -> None:
    """Folding, chomping, quotes and escapes, exactly: the prompt collapses whitespace, the
    length limit does not."""
    work = tmp_path / "inproc"
    put_published(work)
    monkeypatch.setenv("HOME", str(tmp_path))  # agent.py also reads ~/.agents/skills: nothing there
    found = load_program(chapter, work, monkeypatch).find_skills()
    assert {name: found[name].description for name in PUBLISHED} == {
        name: description for name, (_, description) in PUBLISHED.items()
    }


# ---------------------------------------------------------------- the skill tool


@both
def test_the_skill_tool_returns_the_body_and_its_directory_and_the_body_is_never_in_the_prompt(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    put_skill(workdir, "changelog", CHANGELOG)
    put_skill(workdir, "release-notes", RELEASE_NOTES)
    (workdir / ".agents/skills/changelog/scripts").mkdir()
    (workdir / ".agents/skills/changelog/scripts/check.sh").write_text("#!/bin/sh\n")
    run(
        chapter,
        provider,
        workdir,
        calls(("load", "skill", {"name": "changelog"}), ("nope", "skill", {"name": "nope"})),
        calls(("up", "skill", {"name": "../changelog"})),
    )
    got = results(provider)
    assert got["load"] == f'[skill "changelog", directory: .agents/skills/changelog]\n\n{CHANGELOG_BODY}'
    for call_id, name in (("nope", "nope"), ("up", "../changelog")):
        assert got[call_id].startswith("error: ") and repr(name) in got[call_id], got[call_id]
        assert "changelog" in got[call_id].split(repr(name), 1)[1], got[call_id]  # it names the skills there are
        if chapter == CHAPTER:
            assert (
                got[call_id]
                == f"error: no skill named {name!r} in this session; the skills are: changelog, release-notes"
            )
    # Only the description is in the prompt; the body enters the conversation as the tool's result.
    first = provider.chat_requests[0]
    assert "Add one line under" not in json.dumps(first)
    assert all("Add one line under" not in system for system in system_prompts(provider))


@both
def test_a_body_is_cut_at_32_kib(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    body = "".join(f"{number:05d} Check the next line of the table.\n" for number in range(1000))  # 40 KiB
    put_skill(workdir, "big", skill("big", "A long checklist.", body))
    result = run(chapter, provider, workdir, calls(("load", "skill", {"name": "big"})))
    loaded = results(provider)["load"]
    assert loaded.startswith('[skill "big", directory: .agents/skills/big]\n\n00000 Check')
    assert len(loaded.encode()) <= 32 * 1024 + 200
    marker = loaded.rsplit("\n", 1)[1]  # the model is told
    assert marker.startswith("[... ") and "cut here" in marker and "32,768" in marker, loaded[-200:]
    if chapter == CHAPTER:  # the cut is said when the body is loaded, not at every start that lists it
        assert marker == "[... .agents/skills/big/SKILL.md was cut here: it is longer than 32,768 bytes ...]"
        cut = "warning: .agents/skills/big/SKILL.md is longer than 32,768 bytes; only the first 32,768 are used"
    else:  # agent.py cuts the body at 32,768 characters, and says so once
        cut = "warning: .agents/skills/big/SKILL.md's body is longer than 32,768 characters; the rest is left out"
    assert warnings(result.stderr) == [cut], result.stderr


# ---------------------------------------------------------------- links and special files


@both
def test_a_linked_skill_is_followed_only_if_it_stays_inside_the_working_directory(
    provider: FakeProvider, workdir: Path, tmp_path: Path, chapter: int | str
) -> None:
    skills = workdir / ".agents" / "skills"
    skills.mkdir(parents=True)
    # Inside: a common directory, and a SKILL.md kept with the docs.
    put_skill(workdir, "lint", skill("lint", "Runs the linters.", "LINT-BODY"), root="common")
    os.symlink("../../common/lint", skills / "lint")
    (workdir / "docs").mkdir()
    (workdir / "docs" / "guide.md").write_text(skill("guide", "Writes the user guide.", "GUIDE-BODY"))
    (skills / "guide").mkdir()
    os.symlink("../../../docs/guide.md", skills / "guide" / "SKILL.md")
    # Outside: whatever it holds must not reach the provider.
    outside = tmp_path / "outside"
    put_skill(outside, "leak", skill("leak", "SECRET-OUTSIDE-1"), root=".")
    os.symlink(outside / "leak", skills / "leak")
    (outside / "passwd.md").write_text(skill("passwd", "SECRET-OUTSIDE-2"))
    (skills / "passwd").mkdir()
    os.symlink(outside / "passwd.md", skills / "passwd" / "SKILL.md")
    (skills / "zero").mkdir()
    os.symlink("/dev/zero", skills / "zero" / "SKILL.md")

    result = run(chapter, provider, workdir, calls(("l", "skill", {"name": "lint"}), ("g", "skill", {"name": "guide"})))
    (system, _) = system_prompts(provider)
    assert listing(system) == ["- guide: Writes the user guide.", "- lint: Runs the linters."]
    got = results(provider)
    assert got["l"] == '[skill "lint", directory: .agents/skills/lint]\n\nLINT-BODY'
    assert got["g"] == '[skill "guide", directory: .agents/skills/guide]\n\nGUIDE-BODY'
    warned = warnings(result.stderr)
    assert len(warned) == 3, warned
    # agent.py asks about a link out once: after a no (here nobody to ask), the others are counted.
    named = ("leak", "passwd", "zero") if chapter == CHAPTER else ("leak", "zero")
    if chapter != CHAPTER:
        assert "warning: 1 more skill(s) link out of the project; after a no they are not read" in warned, warned
    for name in named:
        (line,) = naming(warned, name)
        assert line.startswith("warning: skipped skill "), line
        if chapter == CHAPTER:
            assert line.endswith(": it is a link to somewhere outside the working directory"), line
    assert all(b"SECRET-OUTSIDE" not in request["raw"] for request in provider.requests)


@both
def test_a_fifo_skill_file_is_skipped_without_waiting(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    (workdir / ".agents" / "skills" / "pipe").mkdir(parents=True)
    os.mkfifo(workdir / ".agents" / "skills" / "pipe" / "SKILL.md")
    put_skill(workdir, "changelog", CHANGELOG)
    result = run(chapter, provider, workdir, calls(("p", "skill", {"name": "pipe"})), timeout=30)
    (line,) = warnings(result.stderr)
    assert line.startswith("warning: skipped skill ") and naming([line], "pipe"), line
    if chapter == CHAPTER:
        assert line == "warning: skipped skill 'pipe': its SKILL.md is not a regular file"
    assert header(result)["skills"] == ["changelog"]
    assert results(provider)["p"].startswith("error: "), results(provider)


# ---------------------------------------------------------------- a resumed session


@both
def test_a_resumed_session_offers_the_skills_its_header_lists_even_when_removed_since(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    put_skill(workdir, "changelog", CHANGELOG)
    put_skill(workdir, "release-notes", RELEASE_NOTES)
    first = run(chapter, provider, workdir)
    (started,) = system_prompts(provider)
    put_skill(workdir, "changelog", "Not a skill any more.\n")  # changed into an invalid one
    (workdir / ".agents/skills/release-notes/SKILL.md").unlink()  # removed
    again = resume(
        chapter,
        provider,
        workdir,
        new_session_id(first.stderr),
        calls(("c", "skill", {"name": "changelog"}), ("r", "skill", {"name": "release-notes"})),
    )
    request = provider.chat_requests[1]
    assert request["messages"][0]["content"] == started and "skill" in tool_names(request)
    got = results(provider)
    for call_id, name in (("c", "changelog"), ("r", "release-notes")):
        assert got[call_id].startswith("error: ") and repr(name) in got[call_id], got[call_id]
        assert "removed" in got[call_id], got[call_id]
    if chapter == CHAPTER:
        assert (
            got["r"]
            == "error: the skill 'release-notes' was removed or changed since this session started: it has no SKILL.md file"
        )
    assert "Traceback" not in again.stderr


@both
def test_a_resumed_session_offers_only_the_skills_its_header_lists(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    put_skill(workdir, "changelog", CHANGELOG)
    first = run(chapter, provider, workdir)
    put_skill(workdir, "release-notes", RELEASE_NOTES)  # added after the session started
    resume(
        chapter,
        provider,
        workdir,
        new_session_id(first.stderr),
        calls(("r", "skill", {"name": "release-notes"}), ("c", "skill", {"name": "changelog"})),
    )
    got = results(provider)
    assert got["r"].startswith("error: ") and "'release-notes'" in got["r"], got["r"]
    if chapter == CHAPTER:
        assert got["r"] == "error: no skill named 'release-notes' in this session; the skills are: changelog"
    assert got["c"] == f'[skill "changelog", directory: .agents/skills/changelog]\n\n{CHANGELOG_BODY}'
    assert listing(system_prompts(provider)[-1]) == [CHANGELOG_LINE]  # the prompt it started with


@pytest.mark.parametrize("listed", [["changelog", "../skills-proposed/draft", 7, "../../../etc"], "changelog", 7])
@both
def test_a_header_s_list_holds_only_names_a_skill_can_have(
    provider: FakeProvider, workdir: Path, chapter: int | str, listed: object
) -> None:
    """A session file edited, or committed by a hostile repository: its header lists a path, not
    a name. No path is made of it (the draft in .agents/skills-proposed/ stays unread), a list of
    another type lists nothing, and neither is a traceback."""
    put_skill(workdir, "changelog", CHANGELOG)
    put_skill(workdir, "draft", skill("draft", "A draft. DRAFT-MARKER", "DRAFT-MARKER body"), ".agents/skills-proposed")
    meta = {"type": "meta", "id": SESSION_ID, "created_at": "2026-08-01T09:07:20+08:00", "version": 1, "skills": listed}
    put_session(
        workdir,
        (json.dumps(meta) + "\n").encode() + session_bytes({"role": "system", "content": "S"})[len(header_line()) :],
    )
    draft = ("d", "skill", {"name": "../skills-proposed/draft"})
    again = resume(chapter, provider, workdir, SESSION_ID, calls(draft, ("c", "skill", {"name": "changelog"})))
    got = results(provider)
    assert got["d"].startswith("error: "), got["d"]
    if isinstance(listed, list):
        assert got["c"] == f'[skill "changelog", directory: .agents/skills/changelog]\n\n{CHANGELOG_BODY}'
    else:
        assert "skill" not in tool_names(provider.chat_requests[0])
    assert b"DRAFT-MARKER" not in bodies(provider)
    assert "Traceback" not in again.stderr


@pytest.mark.parametrize("created", ["with no skills", "by an older program"])
@both
def test_a_session_created_without_skills_resumes_without_the_tool_though_skills_exist_now(
    provider: FakeProvider, workdir: Path, chapter: int | str, created: str
) -> None:
    if created == "by an older program":  # its header has no "skills" at all
        put_session(workdir, session_bytes({"role": "system", "content": "You are a coding agent."}))
        session_id = SESSION_ID
    else:
        first = run(chapter, provider, workdir)
        assert header(first)["skills"] == []
        session_id = new_session_id(first.stderr)
    put_skill(workdir, "changelog", CHANGELOG)
    again = resume(chapter, provider, workdir, session_id, calls(("c", "skill", {"name": "changelog"})))
    for request in provider.chat_requests:
        assert "skill" not in tool_names(request)
        assert prompt_section(request["messages"][0]["content"], HEADING) is None
    assert results(provider)["c"].startswith("error: unknown tool 'skill'"), results(provider)
    assert warnings(again.stderr) == []
