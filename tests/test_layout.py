"""The layout DESIGN.md promises: chapter snapshots, the finished agent, runtime dependencies."""

import ast
import sys

import pytest

from conftest import ROOT, program

CHAPTERS = range(1, 12)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_chapter_has_a_program_and_a_readme(chapter: int) -> None:
    directory = program(chapter).parent
    readme = (directory / "README.md").read_text(encoding="utf-8")
    assert readme.startswith(f"# Chapter {chapter} — "), readme[:80]
    assert program(chapter).is_file()
    assert f"(ex{chapter:02d}/)" in (ROOT / "exercises" / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_only_openai_and_dotenv_beyond_the_standard_library(chapter: int) -> None:
    tree = ast.parse(program(chapter).read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"__future__"}
    assert third_party <= {"openai", "dotenv"}, third_party


def test_requirements_name_only_the_two_runtime_packages() -> None:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    names = {
        line.split(">")[0].split("=")[0].split("<")[0].strip() for line in lines if line and not line.startswith("#")
    }
    assert names == {"openai", "python-dotenv"}
