"""How a real tier (tests/real_server, tests/real_mcp, tests/real_browser) is chosen.

A tier runs only when it is asked for: `-m <its marker>`, or a path in its directory on the
command line. Otherwise, or when what it needs is missing, every test in it is skipped with
one reason that says what to run: a plain `python3 -m pytest` starts no llama-server, no
MCP server from PyPI and no browser.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


def asked_for(config: pytest.Config, directory: Path, marker: str) -> bool:
    """Was the tier asked for: -m <marker>, or a path in its directory on the command line?"""
    if marker in (config.getoption("markexpr", "") or ""):
        return True
    for arg in config.args:
        path = (config.invocation_params.dir / arg.split("::")[0]).resolve()
        if path == directory or directory in path.parents:
            return True
    return False


def select_tier(
    config: pytest.Config,
    items: list[pytest.Item],
    directory: Path,
    marker: str,
    name: str,
    command: str,
    missing: Callable[[], str | None],
) -> None:
    """Mark every test of the tier's directory with its marker, and skip them all with one
    reason: what `missing()` says the tier lacks, or that the tier `name` runs only when
    asked for, with `command`."""
    ours = [item for item in items if directory in item.path.parents]
    if not ours:
        return
    reason = missing()
    if reason is None and not asked_for(config, directory, marker):
        reason = f"the {name} tier runs only when asked for: {command}"
    for item in ours:
        item.add_marker(getattr(pytest.mark, marker))
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
