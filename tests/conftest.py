"""Shared fixtures: a fake provider per test, and the programs run as real subprocesses.

Every run is hermetic: a temporary working directory, a minimal environment
(no real keys, no .env from the repo, no proxy), the fake provider's URL, and
umask 022, so modes such as 0600 must come from the program itself.

Plain helpers (tool-call builders, output views, session files, a live run
you can watch) are in helpers.py.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import ModuleType

import pytest

from fake_provider import FakeProvider

ROOT = Path(__file__).resolve().parent.parent
TEST_KEY = "test-key-not-real"


def program(chapter: int | str) -> Path:
    """Path of a chapter's agent.py (1..11), or of the finished agent.py ("final")."""
    if chapter == "final":
        return ROOT / "agent.py"
    return ROOT / "exercises" / f"ex{int(chapter):02d}" / "agent.py"


@pytest.fixture
def provider():
    with FakeProvider() as fp:
        yield fp


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    return work


def hermetic_env(provider: FakeProvider | None, home: Path, **extra: str | None) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "OPENAI_API_KEY": TEST_KEY,
        "OPENAI_BASE_URL": provider.url if provider else "http://127.0.0.1:9/v1",
        "MODEL": "test-model",
    }
    if "TZ" in os.environ:  # times the program prints must read as the test computes them
        env["TZ"] = os.environ["TZ"]
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def run_agent(
    chapter: int | str,
    *args: str,
    provider: FakeProvider | None,
    cwd: Path,
    stdin: str | None = None,
    timeout: float = 120,
    python: str = sys.executable,
    options: dict | None = None,
    **env: str | None,
) -> subprocess.CompletedProcess:
    """Run a chapter's program to completion; stdout and stderr are text.
    `options` go to subprocess.run (user=, preexec_fn=, ...)."""
    return subprocess.run(
        [python, str(program(chapter)), *args],
        cwd=cwd,
        env=hermetic_env(provider, cwd.parent, **env),
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="replace",
        timeout=timeout,
        umask=0o022,
        **(options or {}),
    )


def start_agent(
    chapter: int | str, *args: str, provider: FakeProvider | None, cwd: Path, **env: str | None
) -> subprocess.Popen:
    """Start a chapter's program without waiting; pipes for stdin, stdout, stderr (bytes).
    helpers.Live wraps this with bounded waits; prefer it."""
    return subprocess.Popen(
        [sys.executable, str(program(chapter)), *args],
        cwd=cwd,
        env=hermetic_env(provider, cwd.parent, **env),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        umask=0o022,
    )


def assert_clean_failure(result: subprocess.CompletedProcess, *needles: str, code: int = 1) -> None:
    """An expected failure: the exit code, the last line on stderr says what failed, no traceback."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith(("error:", "stopped:")), result.stderr
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)


def load_program(
    chapter: int | str, directory: Path, monkeypatch: pytest.MonkeyPatch, api_key: str = TEST_KEY
) -> ModuleType:
    """A chapter's agent.py imported as a module, for in-process checks. It reads
    its configuration and WORKDIR at import, so it is imported from `directory`."""
    monkeypatch.chdir(directory)
    monkeypatch.setenv("OPENAI_API_KEY", api_key)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("MODEL", "test-model")
    spec = importlib.util.spec_from_file_location(f"agent_under_test_{uuid.uuid4().hex}", program(chapter))
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # @dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def loaded(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """A program imported in-process from a fresh, empty working directory: agent.py by
    default, or the chapter given with @pytest.mark.parametrize("loaded", [...], indirect=True)."""
    work = tmp_path / "inproc"
    work.mkdir()
    module = load_program(getattr(request, "param", "final"), work, monkeypatch)
    assert getattr(module, "WORKDIR", work) == work  # chapter 7 on: where bash runs
    return module


def wait_for_file(path: Path, timeout: float = 30) -> str:
    """Poll for a file a command writes (there is no other signal from inside a running tool)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            content = path.read_text()
            if content.endswith("\n"):
                return content
        time.sleep(0.01)
    raise TimeoutError(f"{path} never appeared")
