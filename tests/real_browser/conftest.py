"""Fixtures of the real-browser tier: a headless Chromium the program starts itself, and pages on 127.0.0.1.

    python3 -m pytest -n0 -m real_browser tests/real_browser

The tier needs a Chromium (or Chrome) on PATH, under one of the names the
program looks for, and it runs only when it is asked for: with -m real_browser,
or a path in this directory on the command line. Otherwise every test here is
skipped with one reason: a plain `python3 -m pytest` starts no browser. Debian:
`apt-get install chromium`.

This directory is a package (__init__.py), so this file is imported as
real_browser.conftest and `import conftest` in the tests still finds
tests/conftest.py.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import alive
from tiers import select_tier

from .pages import Pages

HERE = Path(__file__).resolve().parent
COMMAND = "python3 -m pytest -n0 -m real_browser tests/real_browser"
BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless_shell")
STARTED = re.compile(r"\[browser started \(pid (\d+), profile (\S+)\); it opened a tab of its own\]")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def missing() -> str | None:
        found = any(shutil.which(name) for name in BROWSER_NAMES)
        return None if found else "install Chromium: apt-get install chromium"

    select_tier(config, items, HERE, "real_browser", "real-browser", COMMAND, missing)


@pytest.fixture
def pages() -> Iterator[Pages]:
    with Pages() as served:
        yield served


@pytest.fixture
def other_pages() -> Iterator[Pages]:
    """A second server: another host:port inside the machine, which a page must not reach unasked."""
    with Pages() as served:
        yield served


@pytest.fixture
def deep_tmp(tmp_path: Path) -> Path:
    """A TMPDIR of the program's own, empty, and deep: a socket made there would have an address
    longer than the 108 bytes one can hold, and Chromium aborts at start unless the program gives
    it the profile, by a relative path, for its temporary files."""
    made = tmp_path / ("tmp-" + "d" * 100)
    made.mkdir()
    return made


def started(shown: str) -> tuple[int, Path]:
    """The pid and the profile directory of the browser a run started, from the line it printed."""
    found = STARTED.findall(shown)
    assert len(found) == 1, f"not one browser started:\n{shown[-3000:]}"
    return int(found[0][0]), Path(found[0][1])


def using(profile: Path) -> list[int]:
    """The live processes whose command line names a profile directory: Chromium's crash handler
    puts itself in a session of its own, outside the group, and it must end too. (A profile's
    name is made for one run, so nothing else names it.)"""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            named = str(profile).encode() in (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if named and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def group(pgid: int) -> list[int]:
    """The live processes of a process group, found by their group, never by their name."""
    members = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # not a process, or gone meanwhile
            continue
        if int(fields[2]) == pgid and alive(int(entry.name)):
            members.append(int(entry.name))
    return members
