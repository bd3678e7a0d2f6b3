"""Shared fixtures: a fake provider per test, and the programs run as real subprocesses.

Every run is hermetic: a temporary working directory, a minimal environment
(no real keys, no .env from the repo, no proxy), the fake provider's URL, and
umask 022 unless a test says otherwise, so modes such as 0600 must come from
the program itself. A program runs in a session of its own with no
controlling terminal, so a permission question is refused and can never reach
the terminal pytest runs in; a test that answers questions gives it a
pseudo-terminal (`Terminal`) instead.

Plain helpers (tool-call builders, output views, session files, a live run
you can watch) are in helpers.py.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from types import ModuleType

import pytest

from fake_provider import FakeProvider

ROOT = Path(__file__).resolve().parent.parent
TEST_KEY = "test-key-not-real"

# A suite started in the background (`nohup python -m pytest &` in a script) ignores SIGINT,
# SIGQUIT and SIGHUP, and every program it starts inherits that: then no Ctrl-C, no closed
# terminal and no Ctrl-\ reaches the agents, and every test of a stop waits out its timeout.
# The programs under test start with the dispositions a person's terminal gives them.
signal.signal(signal.SIGINT, signal.default_int_handler)
for number in (signal.SIGQUIT, signal.SIGHUP):
    signal.signal(number, signal.SIG_DFL)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject.toml's addopts): two workers a core. A test spends most of its time
    waiting for a program to start, answer or end, so one worker a core left the cores half idle
    (a load average of 1.1 on 2 cores); with two, the suite takes 13 minutes instead of 23."""
    return 2 * (os.cpu_count() or 1)


def program(chapter: int | str) -> Path:
    """Path of a chapter's agent.py, or of the finished agent.py ("final"); AGENT_UNDER_TEST=/path/to/a/copy
    puts a copy in its place, to check that a test fails without the line it is about (mutation testing)."""
    if chapter == "final":
        return Path(os.environ.get("AGENT_UNDER_TEST") or ROOT / "agent.py")
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


@pytest.fixture
def resident(workdir: Path):
    """resident(chapter, *args, provider=, cwd=, **env) starts a program at a terminal (a
    resident.Resident). When the test ends, whatever failed, each is closed, and whatever still
    runs in the working directory is killed."""
    from processes import started_terminals  # here: it imports this module, through resident.py

    with started_terminals(workdir) as start:
        yield start


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


# What a fresh interpreter reads from its environment as it starts: a warm start (warm_start.py)
# has read these already, from the hermetic environment, so a run that sets them starts cold.
READ_AT_START = ("PYTHON", "LC_", "LANG", "TZ")


class WarmStarts:
    """This worker's warm_start.py server, started at its first run and ended with the worker.
    run() is subprocess.run for a program under test, or None where only a cold start will do."""

    def __init__(self) -> None:
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.env = hermetic_env(None, Path(tempfile.mkdtemp(prefix="warm-start-home-")))
        self.server = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "warm_start.py"), str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            env=self.env,
            # Pipes, never used: sys.stdin/stdout/stderr remember that their files are pipes
            # (not seekable, not terminals), as the children's will be.
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        theirs.close()
        self.lock = threading.Lock()
        atexit.register(self.close)

    def close(self) -> None:
        """End the server: the end of its socket is its signal to exit."""
        self.control.close()
        try:
            self.server.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.communicate()

    def read_at_start(self, env: dict[str, str]) -> dict[str, str]:
        return {key: value for key, value in env.items() if key.startswith(READ_AT_START)}

    def run(self, argv: list[str], cwd: Path, env: dict, stdin: str, timeout: float, umask: int):
        argv = [os.fsdecode(arg) for arg in argv]  # as the interpreter decodes a byte it cannot: \udcXX
        request = json.dumps({"argv": argv, "cwd": str(cwd), "env": env, "umask": umask}).encode()
        if len(request) > 1 << 16 or self.read_at_start(env) != self.read_at_start(self.env):
            return None
        if not self.lock.acquire(blocking=False):  # a run from another thread of this test
            return None
        try:
            return self._run(argv, request, stdin.encode(), timeout)
        finally:
            self.lock.release()

    def _run(self, argv: list[str], request: bytes, stdin: bytes, timeout: float) -> subprocess.CompletedProcess:
        """Send the request with the child's ends of three pipes, then feed and drain ours as
        subprocess.run does, until the server says the child has ended."""
        child_stdin, stdin_pipe = os.pipe()
        stdout_pipe, child_stdout = os.pipe()
        stderr_pipe, child_stderr = os.pipe()
        try:
            socket.send_fds(self.control, [request], [child_stdin, child_stdout, child_stderr])
        finally:
            for descriptor in (child_stdin, child_stdout, child_stderr):
                os.close(descriptor)
        pid = json.loads(self.control.recv(4096))["pid"]
        output: dict[str, str] = {"stdout": "", "stderr": ""}

        def drain(name: str, descriptor: int) -> None:
            with open(descriptor, "rb") as pipe:  # text=True's decoding and newlines
                output[name] = pipe.read().decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")

        def feed() -> None:
            # A program that ends without reading all of its stdin: as communicate() does, say nothing.
            # The file is closed (and flushed) inside the suppress, where a broken pipe is raised too.
            with contextlib.suppress(BrokenPipeError), open(stdin_pipe, "wb") as pipe:
                pipe.write(stdin)

        threads = [
            threading.Thread(target=feed, daemon=True),
            threading.Thread(target=drain, args=("stdout", stdout_pipe), daemon=True),
            threading.Thread(target=drain, args=("stderr", stderr_pipe), daemon=True),
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + timeout
        self.control.settimeout(timeout)
        try:
            status = json.loads(self.control.recv(4096))["status"]
        except TimeoutError:
            status = None
            os.killpg(pid, signal.SIGKILL)
            self.control.settimeout(None)
            self.control.recv(4096)  # the status of the child just killed
        finally:
            self.control.settimeout(None)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if status is None or any(thread.is_alive() for thread in threads):
            raise subprocess.TimeoutExpired(argv, timeout, output["stdout"], output["stderr"])
        return subprocess.CompletedProcess(argv, status, output["stdout"], output["stderr"])


WARM_STARTS: list[WarmStarts] = []


def warm_starts() -> WarmStarts:
    """This worker's warm-start server, started at its first use, and again if it has ended."""
    if WARM_STARTS and WARM_STARTS[0].server.poll() is not None:
        WARM_STARTS.pop().close()
    if not WARM_STARTS:
        WARM_STARTS.append(WarmStarts())
    return WARM_STARTS[0]


class Terminal:
    """A pseudo-terminal to be a program's controlling terminal, with a person at it
    who answers each `allow? (y/N)` question with the next line of `answers`, and
    once they run out with end of input (Ctrl-D), or, with hang_up=False, never.
    `shown` is everything the program wrote to the terminal, the echoed answers too."""

    QUESTION = b"allow? (y/N) "

    def __init__(self, answers: str = "", hang_up: bool = True) -> None:
        self.master, self.slave = os.openpty()  # the slave stays open here until close(): reads never see EIO early
        self.name = os.ttyname(self.slave)
        self.answers = answers.splitlines(keepends=True)
        self.hang_up = hang_up
        self.shown = b""
        self.questions = 0
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: closed
                return
            if not data:
                return
            with self.changed:
                self.shown += data
                while self.shown.count(self.QUESTION) > self.questions:
                    self.questions += 1
                    if self.answers:
                        os.write(self.master, self.answers.pop(0).encode())
                    elif self.hang_up:
                        os.write(self.master, b"\x04")
                self.changed.notify_all()

    def type(self, keys: str) -> None:
        """Type at the terminal now, whatever it shows: typing ahead, or an answer given by hand
        (with hang_up=False and no answers left). "\\x04" is Ctrl-D."""
        os.write(self.master, keys.encode())

    def wait_for(self, needle: str, count: int = 1, timeout: float = 30) -> None:
        with self.changed:
            if not self.changed.wait_for(lambda: self.shown.count(needle.encode()) >= count, timeout):
                raise TimeoutError(f"{needle!r} never reached the terminal: {self.text}")

    @property
    def text(self) -> str:
        """What the terminal showed, lines ended by \\n. Without the attribute reset (\\x1b[0m)
        the programs write before each question: every other escape is the test's to find."""
        return self.shown.decode(errors="replace").replace("\r\n", "\n").replace("\x1b[0m", "")

    def argv(self, argv: list[str]) -> list[str]:
        """argv run in a new session whose controlling terminal is this one (opening it makes it so)."""
        attach = "import os, sys; os.setsid(); os.close(os.open(sys.argv[1], os.O_RDWR)); os.execv(sys.argv[2], sys.argv[2:])"
        return [sys.executable, "-c", attach, self.name, *argv]

    def close(self) -> None:
        """Close the terminal, once the program is done with it (closing twice does nothing).
        What it showed stays in `shown`."""
        if self.master is None:
            return
        os.close(self.slave)
        self.thread.join(5)
        os.close(self.master)
        self.master = self.slave = None


def run_agent(
    chapter: int | str,
    *args: str,
    provider: FakeProvider | None,
    cwd: Path,
    stdin: str | None = None,
    answers: str | None = None,
    timeout: float = 120,
    python: str = sys.executable,
    umask: int = 0o022,
    options: dict | None = None,
    cold: bool = False,
    **env: str | None,
) -> subprocess.CompletedProcess:
    """Run a chapter's program to completion; stdout and stderr are text. With
    `answers`, it runs at a Terminal that answers its questions, and the result's
    `terminal` is what the terminal showed. `options` go to subprocess.run. Without
    a terminal, options or another interpreter, the run is a warm start (warm_start.py)
    unless `cold`."""
    argv = [python, str(program(chapter)), *args]
    env = hermetic_env(provider, cwd.parent, **env)
    if answers is None and python == sys.executable and not options and not cold:
        result = warm_starts().run(argv[1:], cwd, env, stdin or "", timeout, umask)
        if result is not None:
            result.args, result.terminal = argv, ""
            return result
    terminal = Terminal(answers) if answers is not None else None
    try:
        result = subprocess.run(
            terminal.argv(argv) if terminal else argv,
            cwd=cwd,
            env=env,
            input=stdin if stdin is not None else "",
            capture_output=True,
            text=True,
            encoding="utf-8",
            errors="replace",
            timeout=timeout,
            umask=umask,
            start_new_session=terminal is None,  # no controlling terminal: no question can be answered
            **(options or {}),
        )
    finally:
        if terminal:
            terminal.close()
    result.terminal = terminal.text if terminal else ""
    return result


def start_agent(
    chapter: int | str,
    *args: str,
    provider: FakeProvider | None,
    cwd: Path,
    terminal: Terminal | None = None,
    **env: str | None,
) -> subprocess.Popen:
    """Start a chapter's program without waiting; pipes for stdin, stdout, stderr (bytes),
    and `terminal` as its controlling terminal if given. helpers.Live wraps this with
    bounded waits; prefer it."""
    argv = [sys.executable, str(program(chapter)), *args]
    return subprocess.Popen(
        terminal.argv(argv) if terminal else argv,
        cwd=cwd,
        env=hermetic_env(provider, cwd.parent, **env),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        umask=0o022,
        start_new_session=terminal is None,
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
