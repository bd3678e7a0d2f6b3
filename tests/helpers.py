"""Helpers shared by the test files: one home for each, so the files cannot drift apart.

- chapters: which chapter introduced what (`since`), and views of a run that
  hide the lines agent.py adds (`chapter_output`, `conversation`, `project_files`);
- scripting the fake provider (`calls`, `bash_calls`) and reading what it got (`results`);
- what the user sees (`stderr_lines`, `status_line`, `summary`, `round_lines`, `hint`);
- processes (`Live`, `alive`, `live_processes`, `free_port`);
- session files, written by hand and read back independently of the agent
  (`session_bytes`, `put_session`, `disk_messages`, `snapshot`), and comparing a
  request with a stored history (`shape`, `assert_sent`);
- instruments for a session program loaded in-process, which spy on the standard
  library only (`measure_save`, `watch_creation`, `decoy_sessions`);
- the context budget and compaction (chapters 12 and 13): the budget lines of a run
  (`budget_lines`, `without_budget`), the conversation a file stands for after its
  compaction records (`replayed`), and a run that compacts (`crossing_run`);
- the system prompt a project's files make (chapters 14 to 18): every request's
  (`system_prompts`), one of its parts (`prompt_section`), the tools a request
  offers (`tool_names`), and a skill on disk (`put_skill`).

Fixtures and the subprocess runners themselves live in conftest.py.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import time
from datetime import datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

from conftest import Terminal, run_agent, start_agent, wait_for_file
from fake_provider import FakeProvider, Reply, sequence_error, text, tool_calls

# ---------------------------------------------------------------- chapters


def since(chapter: int | str, introduced: int) -> bool:
    """Does this program have what chapter `introduced` added? agent.py ("final") has everything."""
    return chapter == "final" or int(chapter) >= introduced


def calls_saved_first(chapter: int | str) -> bool:
    """From chapter 19 on, a round's tool calls are on disk before they run (a subagent's file
    names its call): a run stopped during a tool leaves its call there, without results."""
    return since(chapter, 19)


SESSION_ID_SHAPE = r"\d{8}-\d{6}-[0-9a-f]{8}"
NEW_SESSION = re.compile(rf"\[new session ({SESSION_ID_SHAPE})\]\n")


def hint(session_id: str) -> str:
    """The resume hint a session run prints last (chapter 11 and agent.py)."""
    return f"[session {session_id} — continue with: -c {session_id}]"


def new_session_id(stderr: str) -> str:
    match = re.search(rf"\[new session ({SESSION_ID_SHAPE})\]", stderr)
    assert match, stderr
    return match.group(1)


def session_file(workdir: Path, stderr: str) -> Path:
    """The file of the session whose ID a run printed."""
    return workdir / ".sessions" / f"{new_session_id(stderr)}.jsonl"


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


# Control characters a terminal acts on instead of showing: C0 but tab and newline, DEL, C1, bidi controls.
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def assert_no_control(where: str, text_: str) -> None:
    found = sorted(set(CONTROL.findall(text_)))
    assert not found, f"raw control characters {found!r} reached {where}: {text_!r}"


def chapter_output(chapter: int | str, result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """The run as a chapter before 11 prints it. A session program starts stderr with
    `[new session ID]` and ends it with the resume hint for that same ID: both are
    checked here and cut off. From chapter 12 on, the `[budget ...]` line of each
    round is cut too. Every other byte is left for the chapter's own checks."""
    if not since(chapter, 11):
        return result
    match = NEW_SESSION.match(result.stderr)
    assert match, f"no [new session ID] line first:\n{result.stderr}"
    closing = hint(match.group(1)) + "\n"
    assert result.stderr.endswith(closing), f"no resume hint last:\n{result.stderr}"
    middle = result.stderr[match.end() : len(result.stderr) - len(closing)]
    if since(chapter, 12):
        middle = without_budget(middle)
    return subprocess.CompletedProcess(result.args, result.returncode, result.stdout, middle)


# A budget line (chapter 12 on): [budget 3,214/128,000 tokens · 2.5%], or with ~ and
# "· estimated..." when it is not the API's count.
BUDGET_LINE = re.compile(r"\[budget (~?)([\d,]+)/([\d,]+) tokens · (\d+\.\d)%( · estimated[^\]]*)?\]")


class Budget(NamedTuple):
    estimated: bool
    used: int
    window: int
    share: str  # as printed, "2.5"
    note: str  # "", " · estimated" or " · estimated: the server reports no usage"


def budget_lines(stderr: str) -> list[Budget]:
    """Every budget line of a run, in order; each must be a whole line."""
    found = []
    for line in stderr.splitlines():
        if line.startswith("[budget "):
            match = BUDGET_LINE.fullmatch(line)
            assert match, f"a budget line of another shape: {line!r}"
            tilde, used, window, share, note = match.groups()
            assert bool(tilde) == bool(note), line  # an estimate has both marks, a count neither
            found.append(Budget(bool(tilde), number(used), number(window), share, note or ""))
    return found


def number(shown: str) -> int:
    """A number as the programs print it: 128,000."""
    return int(shown.replace(",", ""))


def without_budget(stderr: str) -> str:
    """stderr without its budget lines."""
    return "".join(line for line in stderr.splitlines(keepends=True) if not BUDGET_LINE.fullmatch(line.rstrip("\n")))


def conversation(chapter: int | str, messages: list[dict]) -> list[dict]:
    """A request's messages without the system prompt chapter 8 puts first (checked to be
    there, once); before chapter 8 there must be no system message at all."""
    if since(chapter, 8):
        assert messages and messages[0]["role"] == "system" and messages[0]["content"], messages[:1]
        messages = messages[1:]
    assert all(m["role"] != "system" for m in messages), messages
    return messages


def project_files(chapter: int | str, directory: Path) -> list[str]:
    """Names in a directory, without the .sessions/ that a session program keeps there."""
    return sorted(p.name for p in directory.iterdir() if not (since(chapter, 11) and p.name == ".sessions"))


# ---------------------------------------------------------------- scripting the fake provider


def calls(*specs: tuple[str, str, dict | str], **kw: Any) -> Reply:
    """Parallel tool calls with ids chosen by the test: (id, name, arguments)."""
    return tool_calls([(name, args) for _, name, args in specs], ids=[cid for cid, _, _ in specs], **kw)


def bash_calls(**commands: str | dict) -> Reply:
    """One round of bash calls, keyed by call id: a command string, or the full arguments."""
    return calls(
        *[(cid, "bash", spec if isinstance(spec, dict) else {"command": spec}) for cid, spec in commands.items()]
    )


def tool_messages(request: dict) -> list[dict]:
    return [m for m in request["messages"] if m["role"] == "tool"]


def results(provider: FakeProvider) -> dict[str, str]:
    """Every tool result the model received, by tool_call_id (from the last request)."""
    return {m["tool_call_id"]: m["content"] for m in tool_messages(provider.chat_requests[-1])}


# ---------------------------------------------------------------- what the user sees


def stderr_lines(stderr: str) -> list[str]:
    """The non-blank lines of a stderr text."""
    return [line for line in stderr.splitlines() if line.strip()]


def status_line(prompt: int = 11, completion: int = 7, finish: str = "stop", key: str = "finish_reason") -> str:
    """Chapters 1-4: the status line after an answer."""
    return f"[input {prompt} tokens · output {completion} tokens · {key}={finish}]"


SUMMARY = re.compile(r"^\[(\d+) (rounds?) · last round input (\S+) tokens · finish_reason=(\w+)\]$")
SUMMARY_CACHED = re.compile(
    r"^\[(\d+) (rounds?) · last round input (\S+) tokens \((\S+) cached\) · finish_reason=(\w+)\]$"
)
ROUND_USAGE = re.compile(r"^\[round (\d+) input (\S+) tokens, (\S+) cached\]$", re.MULTILINE)


class Summary(NamedTuple):
    rounds: str
    tokens: str  # the last round's input tokens, or "?"
    cached: str | None  # chapter 8 on; None before
    finish: str


def summary(chapter: int | str, stderr: str) -> Summary:
    """The closing line of a one-shot run (chapter 5 on), the last of stderr after a blank line."""
    lines = stderr.splitlines()
    assert len(lines) >= 2, stderr
    assert lines[-2] == "", f"no blank line before the summary:\n{stderr}"
    match = (SUMMARY_CACHED if since(chapter, 8) else SUMMARY).match(lines[-1])
    assert match, stderr
    rounds, word, *figures = match.groups()
    assert word == ("round" if rounds == "1" else "rounds"), f"a count of {rounds} reads {word}: {lines[-1]}"
    if not since(chapter, 8):
        figures.insert(1, None)  # no cached count before chapter 8
    return Summary(rounds, *figures)


def has_summary(stderr: str) -> bool:
    return any(pattern.match(line) for line in stderr.splitlines() for pattern in (SUMMARY, SUMMARY_CACHED))


def round_lines(stderr: str) -> list[str]:
    """The `[round N] tool(arguments)` lines: one per tool call run."""
    return [line for line in stderr.splitlines() if re.match(r"\[round \d+\] ", line)]


def assert_ok(result: subprocess.CompletedProcess, stdout: str | None = None) -> None:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    if stdout is not None:
        assert result.stdout == stdout, (result.stdout, result.stderr)


def assert_one_error_line(result: subprocess.CompletedProcess, *needles: str) -> None:
    """A clean failure: exit 1, no traceback, nothing on stdout, stderr exactly one line `error: ...`."""
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert result.stdout == "", result.stdout


def assert_setup_guide(result: subprocess.CompletedProcess, secret: str | None = None) -> None:
    """Missing configuration: exit 1 and the short guide (what to set, a DeepSeek and an Ollama example)."""
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: OPENAI_API_KEY and MODEL must be set"), result.stderr
    for needle in ("DeepSeek", "api.deepseek.com", "Ollama", "localhost:11434"):
        assert needle in result.stderr, (needle, result.stderr)
    if secret:
        assert secret not in result.stderr + result.stdout


# ---------------------------------------------------------------- sockets and processes


def free_port() -> int:
    """A port nothing listens on: bind to get one, then close it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    """Is pid a running process (not gone, not a zombie)?"""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def wait_dead(pid: int, timeout: float = 5) -> bool:
    """SIGKILL is delivered at once, but a dying process may show for a moment: poll briefly."""
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not alive(pid)


def live_processes(argv: list[str]) -> list[int]:
    """Pids of processes running exactly argv that are not zombies."""
    wanted = [arg.encode() for arg in argv]
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")[:-1]
        except OSError:
            continue  # gone meanwhile
        if cmdline == wanted and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def kill_quietly(pid: int | None) -> None:
    """Stop a process a test left behind (only ever a pid the test itself learned)."""
    if pid is not None and alive(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def read_until(pipe: Any, needle: bytes, seen: bytes = b"", count: int = 1, timeout: float = 30) -> bytes:
    """Read a pipe until needle has appeared `count` times in seen and what was read; all of it."""
    deadline = time.monotonic() + timeout
    while seen.count(needle) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{needle!r} never appeared: {seen.decode(errors='replace')}")
        if select.select([pipe.fileno()], [], [], left)[0]:
            chunk = os.read(pipe.fileno(), 65536)
            if not chunk:
                raise AssertionError(f"the pipe closed before {needle!r}: {seen.decode(errors='replace')}")
            seen += chunk
    return seen


class Live:
    """A program running as a subprocess, its stdout and stderr readable while it runs.
    Every wait is bounded; used as a context manager, it is killed if a test fails early."""

    def __init__(
        self,
        chapter: int | str,
        *args: str,
        provider: FakeProvider | None,
        cwd: Path,
        stdin: bytes = b"",
        answers: str | None = None,
        hang_up: bool = True,
        **env: str,
    ) -> None:
        """With `answers`, the program runs at a conftest.Terminal (self.terminal) that
        answers its questions; with hang_up=False, a question left unanswered waits."""
        self.terminal = Terminal(answers, hang_up) if answers is not None else None
        self.proc = start_agent(chapter, *args, provider=provider, cwd=cwd, terminal=self.terminal, **env)
        self.out = b""
        self.err = b""
        if stdin:
            self.write(stdin)

    def __enter__(self) -> Live:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate(timeout=30)
        if self.terminal:
            self.terminal.close()

    def write(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def wait_stderr(self, needle: str, count: int = 1, timeout: float = 30) -> None:
        """Read stderr until needle has appeared `count` times in all."""
        self.err = read_until(self.proc.stderr, needle.encode(), self.err, count, timeout)

    def wait_stdout(self, needle: str, count: int = 1, timeout: float = 30) -> None:
        self.out = read_until(self.proc.stdout, needle.encode(), self.out, count, timeout)

    def signal(self, number: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(number)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def finish(self, timeout: float = 60) -> tuple[int, str, str]:
        """Wait for the exit (killing it after `timeout`); (exit code, all of stdout, all of stderr)."""
        try:
            out, err = self.proc.communicate(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.communicate(timeout=30)
            if self.terminal:
                self.terminal.close()
        return self.proc.returncode, (self.out + out).decode(), (self.err + err).decode()

    def completed(self, timeout: float = 60) -> subprocess.CompletedProcess:
        """finish(), as run_agent would have returned it."""
        code, out, err = self.finish(timeout)
        return subprocess.CompletedProcess(self.proc.args, code, out, err)

    def stopped_mid_command(self, workdir: Path, stop: int | str) -> subprocess.CompletedProcess:
        """Once the running command has written its shell's pid to shell.txt (and a child's to
        child.txt before it), stop the agent: send it signal `stop`, or type the keys `stop` at its
        terminal ("\\x1c" is Ctrl-\\). The run, exit 130 and no traceback, the shell and its child
        gone, checked by their pids. Neither outlives the test, whatever fails."""
        shell = child = None
        try:
            shell = int(wait_for_file(workdir / "shell.txt"))
            child = int((workdir / "child.txt").read_text())  # written before shell.txt
            if isinstance(stop, str):
                self.terminal.type(stop)
            else:
                self.signal(stop)
            result = self.completed(timeout=30)
            assert wait_dead(shell) and wait_dead(child), "the command or its child outlived the agent"
        finally:
            kill_quietly(shell)
            kill_quietly(child)
        assert result.returncode == 130 and "Traceback" not in result.stderr, (result.returncode, result.stderr)
        return result


# ---------------------------------------------------------------- session files, by hand

SESSION_ID = "20260801-090720-56492195"


def header_line(session_id: str = SESSION_ID) -> bytes:
    meta = {"type": "meta", "id": session_id, "created_at": "2026-08-01T09:07:20+08:00", "version": 1}
    return json.dumps(meta).encode() + b"\n"


def message_line(message: Any, compact: bool = False, **extra: Any) -> bytes:
    """One message record as the documented format has it: one line of JSON."""
    record = {"type": "message", "message": message, **extra}
    separators = (",", ":") if compact else None
    return json.dumps(record, ensure_ascii=False, separators=separators).encode() + b"\n"


def session_bytes(*messages: dict, session_id: str = SESSION_ID) -> bytes:
    return header_line(session_id) + b"".join(message_line(m) for m in messages)


def put_session(workdir: Path, data: bytes, session_id: str = SESSION_ID) -> Path:
    """Write a session file into workdir/.sessions (created 0700), mode 0600."""
    sessions = workdir / ".sessions"
    sessions.mkdir(mode=0o700, exist_ok=True)
    path = sessions / f"{session_id}.jsonl"
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def complete_lines(data: bytes) -> tuple[list[dict], bytes]:
    """The records of every newline-terminated line, and the torn tail after the last newline."""
    end = data.rfind(b"\n") + 1
    return [json.loads(line) for line in data[:end].split(b"\n")[:-1]], data[end:]


def disk_messages(path: Path) -> list[dict]:
    """Messages on disk, parsed independently of the agent; the file must be whole lines with a header."""
    records, torn = complete_lines(path.read_bytes())
    assert torn == b"", f"torn tail on disk: {torn[:80]!r}"
    assert records and records[0]["type"] == "meta" and records[0]["id"] == path.stem, records[:1]
    assert all(r["type"] == "message" and set(r) == {"type", "message"} for r in records[1:]), records
    return [r["message"] for r in records[1:]]


def snapshot(root: Path) -> dict[str, tuple[str, int, bytes | None]]:
    """Every path under root: kind, mode and bytes, to prove that nothing changed."""
    out = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        name = str(path.relative_to(root))
        if path.is_symlink():
            out[name] = ("link", info.st_mode, os.readlink(path).encode())
        elif path.is_dir():
            out[name] = ("dir", info.st_mode, None)
        else:
            try:
                data = path.read_bytes()
            except OSError:
                data = None
            out[name] = ("file", info.st_mode, data)
    return out


def appended(before: bytes, after: bytes) -> list[dict]:
    """The records added after the old bytes, which must be untouched."""
    assert after[: len(before)] == before, "the old bytes of the session changed"
    tail = after[len(before) :]
    assert tail.endswith(b"\n"), tail[-200:]
    return [json.loads(line) for line in tail.split(b"\n")[:-1]]


RESUMED = re.compile(r"^\[resumed session (\S+), (\d+) messages\]$")


def resumed(stderr: str) -> tuple[str, int]:
    """(ID, message count) from the one `[resumed session ...]` line a resume prints."""
    found = [match for line in stderr.splitlines() if (match := RESUMED.match(line))]
    assert len(found) == 1, stderr
    return found[0].group(1), int(found[0].group(2))


def warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("warning:")]


def thread_io() -> dict[str, int]:
    """This thread's I/O counters (Linux): write() bytes (wchar) and calls (syscw)."""
    text_ = Path("/proc/thread-self/io").read_text()
    return {key: int(value) for key, value in (line.split(": ") for line in text_.splitlines())}


# ---------------------------------------------------------------- instruments for a program loaded in-process
# They spy on the standard library (os.open, os.fsync, the thread's I/O counters), never on the program.


def long_history(length: int) -> list[dict]:
    messages = [{"role": "system", "content": "You are a coding agent."}]
    for i in range(1, length):
        role = "user" if i % 2 else "assistant"
        messages.append({"role": role, "content": f"message {i}: " + "lorem ipsum dolor sit amet " * 6})
    return messages


class SaveMeasure(NamedTuple):
    path: Path
    before: bytes  # the file after create_session
    after: bytes  # after one save of the two new messages
    new: list[dict]  # those messages
    writes: int  # write() calls that save made
    written: int  # bytes they wrote
    fsynced: list[str]  # files and directories fsynced during that save
    idle_writes: int  # write() calls of a second save with nothing new
    idle_after: bytes  # the file after it


def measure_save(program: ModuleType, length: int, monkeypatch: Any) -> SaveMeasure:
    """With a loaded session program: create a session of `length` messages, add two
    and save once, then save again with nothing new; what each save did."""
    fsynced: list[str] = []
    real_fsync = os.fsync

    def watched_fsync(fd: int) -> None:
        fsynced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", watched_fsync)
    session = program.create_session(long_history(length))
    path = program.SESSIONS / f"{session.id}.jsonl"
    try:
        before = path.read_bytes()
        new = [
            {"role": "user", "content": "one more question — ünïcode\u2028too"},
            {"role": "assistant", "content": "one more answer", "reasoning_content": "thinking"},
        ]
        session.history.extend(new)
        fsynced.clear()
        io_before = thread_io()
        session.save()
        io_after = thread_io()
        after = path.read_bytes()
        synced = list(fsynced)
        idle_before = thread_io()
        session.save()
        idle_writes = thread_io()["syscw"] - idle_before["syscw"]
    finally:
        if hasattr(session, "fd"):  # agent.py keeps its session open (and locked) for the whole run
            os.close(session.fd)
        monkeypatch.setattr(os, "fsync", real_fsync)
    return SaveMeasure(
        path,
        before,
        after,
        new,
        io_after["syscw"] - io_before["syscw"],
        io_after["wchar"] - io_before["wchar"],
        synced,
        idle_writes,
        path.read_bytes(),
    )


class Creation(NamedTuple):
    session: Any
    path: Path
    opened: list[tuple[int, int]]  # (flags, mode) of every os.open of the session file
    fsynced: list[tuple[str, bytes | None]]  # (what, its bytes if a file) for every fsync, in order


def watch_creation(program: ModuleType, monkeypatch: Any) -> Creation:
    """With a loaded session program: create a session under umask 0 (so modes must come
    from the program) and watch every os.open and os.fsync it makes."""
    opened: list[tuple[str, int, int]] = []
    fsynced: list[tuple[str, bytes | None]] = []
    real_open, real_fsync = os.open, os.fsync

    def watched_open(path: Any, flags: int, mode: int = 0o777, *args: Any, **kwargs: Any) -> int:
        opened.append((os.fspath(path), flags, mode))
        return real_open(path, flags, mode, *args, **kwargs)

    def watched_fsync(fd: int) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}")
        fsynced.append((target, Path(target).read_bytes() if Path(target).is_file() else None))
        real_fsync(fd)

    monkeypatch.setattr(os, "open", watched_open)
    monkeypatch.setattr(os, "fsync", watched_fsync)
    old_umask = os.umask(0)
    try:
        session = program.create_session([{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}])
    finally:
        os.umask(old_umask)
        monkeypatch.setattr(os, "open", real_open)
        monkeypatch.setattr(os, "fsync", real_fsync)
    path = program.SESSIONS / f"{session.id}.jsonl"
    return Creation(session, path, [(flags, mode) for name, flags, mode in opened if name == str(path)], fsynced)


def decoy_sessions(program: ModuleType, monkeypatch: Any) -> list[Path]:
    """Fix the random part of new IDs, then fill .sessions with a file under every name
    the next half minute could produce: a creation can only succeed by reusing one."""
    monkeypatch.setattr(os, "urandom", lambda n: bytes.fromhex("0badcafe"))
    program.SESSIONS.mkdir(mode=0o700)
    now = datetime.now()
    decoys = []
    for second in range(-2, 30):
        decoy = program.SESSIONS / f"{now + timedelta(seconds=second):%Y%m%d-%H%M%S}-0badcafe.jsonl"
        decoy.write_bytes(b"precious bytes\n")
        decoys.append(decoy)
    return decoys


# ---------------------------------------------------------------- comparing a request with a history


def call(call_id: str, name: str = "read_file", arguments: str = '{"path": "a.txt"}') -> dict:
    """One tool call as an assistant message carries it."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def shape(message: dict) -> tuple:
    """What identifies a message in a history; a tool result by the call it answers."""
    call_ids = tuple(call["id"] for call in message.get("tool_calls") or [])
    content = "<result>" if message["role"] == "tool" else message.get("content")
    return message["role"], content, message.get("tool_call_id"), call_ids


def round_shapes(*replies: Reply) -> list[tuple]:
    """The shapes that completed tool rounds leave on disk: each call, then its results."""
    out = []
    for reply in replies:
        out.append(("assistant", reply.content, None, tuple(c[0] for c in reply.tool_calls)))
        out += [("tool", "<result>", c[0], ()) for c in reply.tool_calls]
    return out


def synthetic(message: dict, stored: list[dict]) -> bool:
    """A tool result the agent made up for a call the file leaves unanswered (it reports a failure)."""
    if message["role"] != "tool" or any(m["role"] == "tool" and m == message for m in stored):
        return False
    assert message["content"].startswith("error:"), message
    return True


def assert_sent(messages: list[dict], stored: list[dict]) -> None:
    """What a request carried: valid for the provider, and exactly the stored history
    (plus a system prompt if the file had none, plus a synthetic result per unanswered call)."""
    assert sequence_error(messages) is None, (sequence_error(messages), messages)
    assert messages[0]["role"] == "system"
    if not stored or stored[0]["role"] != "system":
        messages = messages[1:]
    real = [m for m in messages if not synthetic(m, stored)]
    assert [shape(m) for m in real] == [shape(m) for m in stored]
    # Count the calls the file leaves unanswered, independently of the agent.
    unanswered = 0
    for i, message in enumerate(stored):
        ids = [call["id"] for call in message.get("tool_calls") or []]
        following = set()
        for later in stored[i + 1 :]:
            if later["role"] != "tool":
                break
            following.add(later.get("tool_call_id"))
        unanswered += len([call_id for call_id in ids if call_id not in following])
    assert len(messages) - len(real) == unanswered


def assert_batches_whole(messages: list[dict], saved_first: bool = False) -> None:
    """On disk, every tool-call message is directly followed by all of its results; with
    saved_first (chapter 19 on, where a call is saved before it runs), or by none of them,
    a crash having come while its tools ran."""
    for i, message in enumerate(messages):
        ids = [call["id"] for call in message.get("tool_calls") or []]
        if ids:
            after = [m.get("tool_call_id") if m["role"] == "tool" else None for m in messages[i + 1 : i + 1 + len(ids)]]
            answered = [call_id for call_id in after if call_id is not None]
            assert after == ids or (saved_first and not answered), f"message {i} calls {ids} but is followed by {after}"


# ---------------------------------------------------------------- compaction (chapter 13 and agent.py)


def summary_message(summary: str) -> dict:
    """The message a compaction puts where the folded messages were."""
    return {"role": "user", "content": f"[summary of the earlier conversation]\n{summary}"}


def replayed(records: list[dict]) -> list[dict]:
    """The conversation a session file's records stand for, replayed independently of the
    agent: the messages in order, each compaction record replacing all but the system
    prompt and its last `kept` messages with its summary."""
    messages: list[dict] = []
    for record in records:
        if record["type"] == "message":
            messages.append(record["message"])
        elif record["type"] == "compaction":
            messages = messages[:1] + [summary_message(record["summary"])] + messages[len(messages) - record["kept"] :]
    return messages


def file_records(path: Path) -> list[dict]:
    """Every record of a session file that has no torn tail."""
    records, torn = complete_lines(path.read_bytes())
    assert torn == b"", torn[:80]
    return records


def summary_requests(provider: FakeProvider) -> list[dict]:
    """The chat requests that offer no tools: a compaction's summary requests."""
    return [body for body in provider.chat_requests if "tools" not in body]


def turn_requests(provider: FakeProvider) -> list[dict]:
    """The chat requests of the agent's rounds, which offer the tools."""
    return [body for body in provider.chat_requests if "tools" in body]


# A session of ~2,000 tokens, by hand: the next round, reported at 3,107 tokens, crosses
# 75% of a 4,000-token window. a2 is long, so the tail the compaction keeps (at most
# 1,200 tokens) starts at the new question: u1 to a2 are folded.
EARLIER = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Read notes.txt and summarize it"},
    {"role": "assistant", "content": "The notes plan a stock API for a bookshop. " * 40},
    {"role": "user", "content": "What did we decide about the database, and why?"},
    {"role": "assistant", "content": "PostgreSQL 16, because the till and the web shop write at once. " * 80},
]
QUESTION = {"role": "user", "content": "Now read todo.txt and tell me what is still open"}
TODO = "- POST /sales (Lin)\n- delete the cache entry after a sale (Lin)\n- test a restore (Sam)\n"
SUMMARY_TEXT = "The user plans a bookshop stock API: PostgreSQL 16 for two writers; todo.txt is next."
ANSWER = "Three items are open."


def first_request_tokens(chapter: int | str, tmp: Path) -> int:
    """The tokens of a program's first request for a one-word task, counted as the fake
    provider's context_limit counts them (bytes / 4): its system prompt and its tools.
    A test of a tight window sets the window above it, so that a chapter that adds a
    tool or a line of prompt does not move the test's ground."""
    probe = tmp / f"probe-{chapter}"
    probe.mkdir()
    with FakeProvider() as fp:
        fp.script(text("ok"))
        run_agent(chapter, "Hi", provider=fp, cwd=probe)
        return len(fp.requests[0]["raw"]) // 4


def crossing_window(chapter: int | str) -> tuple[int, int]:
    """(the window, the prompt tokens of a first round that crosses 75% of it) for a resume of
    EARLIER that starts under 75%. agent.py's tools (13: the web's, the browser, the tasks')
    take about 800 tokens more of every request than a chapter 13 program's 4: a larger window."""
    window = 4800 if chapter == "final" else 4000
    return window, window * 3 // 4 + 100


def crossing_run(chapter: int | str, provider: FakeProvider, workdir: Path, summary: Reply, **env: str):
    """Resume EARLIER with QUESTION in crossing_window()'s window. Its first round reads
    todo.txt and the API counts past 75% (3,107 of 4,000 tokens for a chapter): a compaction
    comes before the second request, whose reply is `summary`; then the answer. (the
    session file, its bytes before, the run)"""
    (workdir / "todo.txt").write_text(TODO)
    path = put_session(workdir, session_bytes(*EARLIER))
    before = path.read_bytes()
    window, tokens = crossing_window(chapter)
    round_1 = tool_calls([("read_file", {"path": "todo.txt"})], ids=["call_todo"], prompt_tokens=tokens)
    provider.script(round_1, summary, text(ANSWER))
    env = {"CONTEXT_WINDOW": str(window), **env}
    result = run_agent(chapter, "-c", SESSION_ID, QUESTION["content"], provider=provider, cwd=workdir, **env)
    return path, before, result


# ---------------------------------------------------------------- the system prompt a project's files make (chapters 14 to 18)

PROMPT_SECTION = "\n\n---\n\n"  # between the parts of a new session's system prompt


def system_prompts(provider: FakeProvider) -> list[str]:
    """The system message of every chat request, in order: each request has one, first."""
    found = []
    for body in provider.chat_requests:
        first = body["messages"][0]
        assert first["role"] == "system", body["messages"][:1]
        assert sum(m["role"] == "system" for m in body["messages"]) == 1, body["messages"]
        found.append(first["content"])
    return found


def prompt_section(system: str, heading: str) -> str | None:
    """The part of a system prompt whose first line is `heading`, or None; never two of them.
    (The parts are joined by PROMPT_SECTION: a test's own texts must not hold it.)"""
    found = [part for part in system.split(PROMPT_SECTION) if part.split("\n", 1)[0] == heading]
    assert len(found) <= 1, f"{len(found)} parts of the prompt start with {heading!r}"
    return found[0] if found else None


def tool_names(request: dict) -> list[str]:
    """The names of the tools a chat request offers."""
    return [tool["function"]["name"] for tool in request.get("tools", [])]


def put_skill(workdir: Path, directory: str, text_: str | bytes, root: str = ".agents/skills") -> Path:
    """Write <root>/<directory>/SKILL.md (str as UTF-8, bytes as they are, newlines untouched)."""
    path = workdir / root / directory / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text_.encode() if isinstance(text_, str) else text_)
    return path


# ---------------------------------------------------------------- subagents (chapters 19 to 21)


def first_user(body: dict) -> str | None:
    """The first user message of a chat request: the task, or a child's prompt."""
    return next((m.get("content") for m in body["messages"] if m["role"] == "user"), None)


def requests_of(provider: FakeProvider, key: str) -> list[dict]:
    """The chat requests of one conversation: those whose first user message holds key
    (as FakeProvider.route picks them), in arrival order."""
    return [body for body in provider.chat_requests if key in (first_user(body) or "")]


def children(workdir: Path, parent_id: str) -> dict[str, tuple[dict, list[dict]]]:
    """The children of a session on disk, .sessions/<parent ID>/<child ID>.jsonl, by the
    description in their header: (header, messages), read independently of the agent."""
    found = {}
    for path in sorted((workdir / ".sessions" / parent_id).glob("*.jsonl")):
        records, torn = complete_lines(path.read_bytes())
        assert torn == b"", f"torn tail in {path.name}: {torn[:80]!r}"
        header, *rest = records
        assert header["type"] == "meta" and header["id"] == path.stem, header
        assert all(r["type"] == "message" for r in rest), rest
        assert header["description"] not in found, f"two children described {header['description']!r}"
        found[header["description"]] = (header, [r["message"] for r in rest])
    return found


def record_arrivals(provider: FakeProvider) -> list[tuple[float, dict]]:
    """From now on, (time.monotonic() of its arrival, body) of every request, in arrival order:
    the moment the fake provider takes it, before any Reply.delay."""
    arrivals: list[tuple[float, dict]] = []
    take = provider._take

    def recorded(path: str, headers: dict, body: Any, raw: bytes) -> Reply | None:
        arrivals.append((time.monotonic(), body))
        return take(path, headers, body, raw)

    provider._take = recorded
    return arrivals


def wait_until(predicate: Any, what: str, timeout: float = 30) -> None:
    """Poll a condition no event announces (a counter of the fake provider), bounded."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"never: {what}")
        time.sleep(0.01)


def bodies(provider: FakeProvider) -> bytes:
    """Every request body the provider received, as bytes (the headers carry the key, as they must)."""
    return b"".join(request["raw"] for request in provider.requests)
