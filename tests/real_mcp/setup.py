"""Install the real MCP servers the tier runs agent.py against, once, into a private venv.

    python3 tests/real_mcp/setup.py                     # this: install, or return at once
    python3 tests/real_mcp/setup.py && python3 -m pytest -n0 -m real_mcp tests/real_mcp

The servers are the MCP project's reference servers, nobody here wrote them,
installed from PyPI at pinned versions with the ordinary pip:

- mcp-server-time (get_current_time, convert_time),
- mcp-server-git (git_status, git_log, git_commit, ...).

They go into a venv under ${XDG_CACHE_HOME:-~/.cache}/agent-py-real-mcp/venv,
made by the Python that runs this script. Once it holds the pinned versions a
run only looks at a stamp file and the installed packages' metadata, and
returns. Their own dependencies (the mcp SDK, GitPython, ...) are what pip
picks for those pins. The last line on stdout is the path of the venv's bin
directory, alone; what it does goes to stderr. The tests import this file for
the paths and the check (see conftest.py).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

PINS = {"mcp-server-time": "2026.10.19", "mcp-server-git": "2026.10.19"}
COMMAND = "python3 tests/real_mcp/setup.py"
STAMP = "agent-py-real-mcp.json"  # in the venv: written once pip has installed the pins


class SetupError(Exception):
    """One line: what failed, and what to do."""


def say(message: str) -> None:
    print(f"[real-mcp] {message}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "agent-py-real-mcp"


def venv_dir() -> Path:
    return cache_dir() / "venv"


def bin_dir() -> Path:
    return venv_dir() / "bin"


def executable(package: str) -> Path:
    """The console script a server package installs: its name is the package's."""
    return bin_dir() / package


def installed_version(package: str) -> str | None:
    """The version of package in the venv, from its dist-info directory (no interpreter started)."""
    wanted = re.sub(r"[-_.]+", "_", package).lower()
    for info in sorted(venv_dir().glob("lib/python3*/site-packages/*.dist-info")):
        name, _, version = info.name[: -len(".dist-info")].partition("-")
        if re.sub(r"[-_.]+", "_", name).lower() == wanted and (info / "METADATA").is_file():
            return version
    return None


def missing() -> str | None:
    """None when the venv holds the pinned servers, ready to run; else what is wrong, in a few words."""
    python = bin_dir() / "python"
    if not os.access(python, os.X_OK):  # a link to an interpreter that is gone fails here too
        return f"the venv {venv_dir()} is missing"
    try:
        stamp = json.loads((venv_dir() / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"the venv {venv_dir()} was not finished by setup.py"
    if stamp != {"pins": PINS}:
        return f"the venv {venv_dir()} holds other versions than {PINS}"
    for package, version in PINS.items():
        if installed_version(package) != version:
            return f"{package}=={version} is not installed in {venv_dir()}"
        if not os.access(executable(package), os.X_OK):
            return f"{executable(package)} is missing"
    return None


def run(argv: list[str], what: str, timeout: float) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        raise SetupError(f"{what} took more than {timeout:.0f} s; run again") from error
    except OSError as error:
        raise SetupError(f"{what} could not run: {error}") from error
    if done.returncode:
        print("\n".join((done.stdout + done.stderr).splitlines()[-20:]), file=sys.stderr)
        raise SetupError(f"{what} failed (its output ends above); fix that and run again")


def install() -> None:
    venv = venv_dir()
    say(f"making the venv {venv} with {sys.executable}")
    shutil.rmtree(venv, ignore_errors=True)  # whatever was there is not what the pins say
    run([sys.executable, "-m", "venv", str(venv)], "python -m venv", timeout=300)
    requirements = [f"{package}=={version}" for package, version in PINS.items()]
    say(f"pip install {' '.join(requirements)}")
    pip = [str(bin_dir() / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    run([*pip, *requirements], "pip install", timeout=900)
    for package in PINS:  # the entry points import: each one's --help runs
        run([str(executable(package)), "--help"], f"{package} --help", timeout=120)
    (venv / STAMP).write_text(json.dumps({"pins": PINS}) + "\n", encoding="utf-8")
    if reason := missing():
        raise SetupError(f"after pip install, {reason}")


def main() -> int:
    started = time.monotonic()
    cache = cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with (cache / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a second run waits for the first, then finds the venv ready
            if reason := missing():
                say(f"{reason}: installing")
                install()
    except SetupError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"error: {error}; check that {cache} is writable, then run again", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: run the command again to go on", file=sys.stderr)
        return 130
    say(f"ready in {time.monotonic() - started:.1f} s: {', '.join(f'{p}=={v}' for p, v in PINS.items())}")
    print(bin_dir(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
