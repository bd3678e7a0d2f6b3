"""Fixtures of the real-MCP tier: the reference servers from PyPI, in the venv setup.py makes.

    python3 tests/real_mcp/setup.py && python3 -m pytest -n0 -m real_mcp tests/real_mcp

The tier needs that venv, and it runs only when it is asked for: with -m
real_mcp, or a path in this directory on the command line. Otherwise every
test here is skipped with one reason that names the command: a plain
`python3 -m pytest` never starts a server from PyPI.

This directory is a package (__init__.py), so this file is imported as
real_mcp.conftest and `import conftest` in the tests still finds
tests/conftest.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest

from tiers import select_tier

from . import setup as venv

HERE = Path(__file__).resolve().parent
COMMAND = f"{venv.COMMAND} && python3 -m pytest -n0 -m real_mcp tests/real_mcp"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def missing() -> str | None:
        reason = venv.missing()
        return reason and f"{reason}: run {COMMAND}"

    select_tier(config, items, HERE, "real_mcp", "real-MCP", COMMAND, missing)


class Servers(NamedTuple):
    bin: Path  # the venv's bin directory
    time: Path  # its mcp-server-time
    git: Path  # its mcp-server-git


@pytest.fixture(scope="session")
def servers() -> Servers:
    """The servers' executables, by absolute path; the test is skipped if the venv is not ready."""
    if reason := venv.missing():
        pytest.skip(f"{reason}: run {COMMAND}")
    return Servers(venv.bin_dir(), venv.executable("mcp-server-time"), venv.executable("mcp-server-git"))
