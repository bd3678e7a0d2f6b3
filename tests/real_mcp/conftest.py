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

from . import setup as venv

HERE = Path(__file__).resolve().parent
COMMAND = f"{venv.COMMAND} && python3 -m pytest -n0 -m real_mcp tests/real_mcp"


def asked_for(config: pytest.Config) -> bool:
    """Was the tier asked for: -m real_mcp, or a path in this directory on the command line?"""
    if "real_mcp" in (config.getoption("markexpr", "") or ""):
        return True
    for arg in config.args:
        path = (config.invocation_params.dir / arg.split("::")[0]).resolve()
        if path == HERE or HERE in path.parents:
            return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test of this directory is marked real_mcp, and skipped with one reason
    if the venv is not ready or the tier was not asked for."""
    ours = [item for item in items if HERE in item.path.parents]
    if not ours:
        return
    reason = venv.missing()
    if reason:
        reason = f"{reason}: run {COMMAND}"
    elif not asked_for(config):
        reason = f"the real-MCP tier runs only when asked for: {COMMAND}"
    for item in ours:
        item.add_marker(pytest.mark.real_mcp)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


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
