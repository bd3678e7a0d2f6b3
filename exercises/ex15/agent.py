"""Chapter 15 — Cross-session memory: the value is in curation, not accumulation
(跨会话记忆——价值在筛选，不在积累).

MEMORY.md is the model's own notes: a new session finds them in its system
prompt, and the model keeps them with write_file and edit_file, like any file.
A file may only be changed if it is unchanged since this run last read it.

    python exercises/ex15/agent.py "Our default branch is trunk, not main. Remember this."
    python exercises/ex15/agent.py "Print the gh pr create command for a PR to the default branch; do not ask me which"
"""

import contextlib
import hashlib
import itertools
import json
import os
import re
import selectors
import signal
import stat
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import NoReturn

import openai
from dotenv import find_dotenv, load_dotenv

# ---- configuration: environment variables, or a .env file where you run ----

load_dotenv(find_dotenv(usecwd=True))  # real environment variables win over .env
API_KEY = os.environ.get("OPENAI_API_KEY", "").strip()
BASE_URL = os.environ.get("OPENAI_BASE_URL", "").strip() or "https://api.openai.com/v1"
MODEL = os.environ.get("MODEL", "").strip()

SETUP_GUIDE = """\
error: OPENAI_API_KEY and MODEL must be set (in the environment or in a .env file).
For DeepSeek:
  OPENAI_API_KEY=sk-...  OPENAI_BASE_URL=https://api.deepseek.com  MODEL=deepseek-v4-flash
For a local Ollama:
  OPENAI_API_KEY=ollama  OPENAI_BASE_URL=http://localhost:11434/v1  MODEL=qwen3:8b"""

# What to do about the HTTP errors people actually meet.
HINTS = {
    401: "check OPENAI_API_KEY",
    402: "check your account balance",
    403: "check your account's permissions",
    404: "check MODEL and OPENAI_BASE_URL",
    429: "rate limited: wait a moment and try again",
}


def die(message: str) -> NoReturn:
    """Expected failures end with one line on stderr, never a traceback."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def describe(error: openai.APIError) -> str:
    """One line for an API failure: what happened and what to do about it."""
    if isinstance(error, openai.APITimeoutError):
        return f"no answer from {BASE_URL} in time; try again"
    if isinstance(error, openai.APIConnectionError):
        return f"the connection to {BASE_URL} failed or broke off: is the server up and OPENAI_BASE_URL right?"
    message = error.body.get("message") if isinstance(error.body, dict) else None
    message = message or error.message
    if isinstance(error, openai.APIStatusError):
        status = error.status_code
        hint = HINTS.get(status, "the provider failed; try again later" if status >= 500 else "")
        return f"HTTP {status}: {message}" + (f" ({hint})" if hint else "")
    return f"the API failed: {message}"


MAX_ROUNDS = 10  # a model that keeps calling tools must not run forever
CUT_OFF = (
    "error: your reply was cut off by max_tokens before this call was complete, so it was not run; "
    "make the call again with shorter arguments"
)
WORKDIR = Path.cwd()  # bash always runs here: a `cd` does not outlive its command
DEFAULT_TIMEOUT, MAX_TIMEOUT = 30, 120  # seconds
OUTPUT_CAP = 8 * 1024  # bytes of output the model sees: the tail, where results and errors are
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)  # Ctrl-C, kill, a closed terminal, Ctrl-\


BASE_PROMPT = """\
You are a coding agent working in the user's current directory.
- Act through your tools; do not describe a plan you could carry out yourself.
- Prefer read_file, write_file and edit_file for files. Keep bash for what they
  cannot do: running tests, git, installing packages, system information.
- Read a file before you change it, also when you change it through bash.
- Prefer edit_file to sed -i or rewriting a whole file.
- Make only the change you were asked for, then say briefly what you did."""


class TurnFailed(Exception):
    """A model turn that did not complete; the message says why."""


# ---- tools: each one a definition (what the model sees) and a function (what runs) ----


def definition(name: str, description: str, **parameters: str) -> dict:
    """A tool definition in the Chat Completions format; every parameter is a required string."""
    properties = {key: {"type": "string", "description": text} for key, text in parameters.items()}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": list(parameters)},
        },
    }


def store(path: str, text: str) -> str:
    """Write text to path as UTF-8, creating parent directories. An existing
    file is backed up first; returns a note that names the backup."""
    data, note = text.encode("utf-8"), ""  # encoded first: text that cannot be written makes no backup
    if Path(path).exists():
        try:
            note = f" (old version saved as {backup(Path(path)).relative_to(WORKDIR)})"
        except OSError as error:
            raise OSError(
                f"could not back up the old version ({error.strerror or error}); the file was not changed"
            ) from None
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(data)
    return note


READ_FILE = definition(
    "read_file", "Read a text file and return its contents.", path="file path, relative to the working directory"
)


def read_file(args: dict) -> str:
    # Bytes, then decode: a file that is not UTF-8 must not crash the agent.
    return Path(args["path"]).read_bytes().decode("utf-8", errors="replace")


WRITE_FILE = definition(
    "write_file",
    "Create a file, or overwrite an existing one you have read. Reports the bytes written.",
    path="file path",
    content="the complete new contents",
)


def write_file(args: dict) -> str:
    note = store(args["path"], args["content"])
    return f"wrote {len(args['content'].encode('utf-8'))} bytes to {args['path']}{note}"


EDIT_FILE = definition(
    "edit_file",
    "Replace one exact occurrence of old_string with new_string in a file you have read.",
    path="file path",
    old_string="text to replace; must occur exactly once",
    new_string="replacement text",
)


def edit_file(args: dict) -> str:
    path, old, new = args["path"], args["old_string"], args["new_string"]
    if not old:
        return "error: old_string is empty; copy the exact text to replace from the file"
    try:
        text = Path(path).read_bytes().decode("utf-8")  # strict: never rewrite bytes we could not decode
    except UnicodeDecodeError:
        return f"error: {path} is not UTF-8 text; edit_file cannot change it safely"
    count = text.count(old)
    if count == 0:
        return f"error: old_string was not found in {path}; read the file again and copy the text exactly, whitespace included"
    if count > 1:
        return f"error: old_string appears {count} times in {path}; include more of the surrounding text so it matches once"
    note = store(path, text.replace(old, new, 1))
    return f"edited {path}: replaced 1 occurrence{note}"


# ---- permissions: a hard gate in front of bash; the model has no say ----

DENY = ["rm -rf /", "rm -rf ~"]
ASK = ["rm -rf", "sudo ", "git push --force", "curl "]
ALLOW = ["ls", "cat ", "pwd", "echo ", "git status"]
# With any of these a command can run, or write, more than its first word says.
CHAINING_OR_REDIRECTION = set(";|&$()`\n><")


def permission(command: str) -> str:
    """'allow', 'ask' or 'deny'. The order of the checks, not of the rules, decides."""
    command = command.strip()
    if any(rule in command for rule in DENY):
        return "deny"
    if any(rule in command for rule in ASK):
        return "ask"
    if not CHAINING_OR_REDIRECTION & set(command):
        for rule in ALLOW:
            word = rule.strip()  # a whole word: `ls` allows `ls -la`, not `lsof`
            if command == word or command.startswith(word + " "):
                return "allow"
    return "ask"


def visible(text: str) -> str:
    """text with every control character written as an escape (\\r, \\x1b, \\u202e), so
    that no carriage return or escape sequence can redraw what the prompt shows."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def approved(command: str) -> bool:
    """Ask the person at the terminal. Only y or yes runs it; anything else refuses.
    The answer is read from the terminal itself: input piped into the program
    never approves, and with no terminal nobody is there to say yes."""
    try:
        with open("/dev/tty", "r+b", buffering=0) as terminal:  # unbuffered: a terminal cannot seek
            # \x1b[0m first: text streamed before may have left the terminal drawing invisibly (\x1b[8m).
            terminal.write(f"\x1b[0m\n⚠  the model wants to run: {visible(command)}\nallow? (y/N) ".encode())
            answer = terminal.readline().decode(errors="replace")
    except OSError:  # no controlling terminal
        answer = ""
    if not answer:
        print("(no answer from a terminal: refused)", file=sys.stderr)
    return answer.strip().lower() in ("y", "yes")


BASH = definition(
    "bash",
    "Run a shell command (sh -c) in the working directory; output is stdout and stderr combined.",
    command="the command",
)
# timeout is optional and an integer, so it is added by hand.
BASH["function"]["parameters"]["properties"]["timeout"] = {
    "type": "integer",
    "description": f"seconds before the command is killed (default {DEFAULT_TIMEOUT}, at most {MAX_TIMEOUT})",
}


@contextlib.contextmanager
def stop_signals_held():
    """Hold Ctrl-C, SIGTERM and SIGHUP until the block ends, then raise KeyboardInterrupt."""
    held = []
    previous = {number: signal.signal(number, lambda number, frame: held.append(number)) for number in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    if held:
        raise KeyboardInterrupt


def run_command(command: str, timeout: int) -> tuple[bytes, int, int | None]:
    """Run command; return (the output's tail, total bytes of output, exit status or None if killed)."""
    process, tail, total, status = None, b"", 0, None
    try:
        # A signal that lands inside Popen would lose the child's pid, and the
        # command, in a session of its own, would outlive us: hold it until
        # Popen returns. Raised here, it still reaches the finally below.
        with stop_signals_held():
            process = subprocess.Popen(
                ["sh", "-c", command],
                cwd=WORKDIR,
                stdin=subprocess.DEVNULL,  # a command that waits for input must not hang, nor eat ours
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, so a kill reaches everything it starts
            )
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            while (left := deadline - time.monotonic()) > 0:
                if not selector.select(left):
                    continue
                chunk = os.read(process.stdout.fileno(), 65536)
                if not chunk:  # every writer has closed the pipe: the command is done
                    status = process.wait(max(0.0, deadline - time.monotonic()))
                    break
                total += len(chunk)
                tail = (tail + chunk)[-OUTPUT_CAP:]  # keep only the tail: memory stays bounded
    except subprocess.TimeoutExpired:
        pass
    finally:
        if process:
            # Kill the whole group on every way out: a timeout, Ctrl-C, and also
            # success, since a background (&) child outlives sh otherwise.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            process.stdout.close()
    return tail, total, status


def shown(tail: bytes, total: int) -> str:
    """The text the model sees: the whole output, or its tail from a line start with a marker."""
    if total > len(tail):
        start = tail.find(b"\n") + 1  # drop the partial first line
        if 0 < start < len(tail):
            tail = tail[start:]
        return f"[... first {total - len(tail)} bytes truncated, showing the end ...]\n" + tail.decode(
            "utf-8", errors="replace"
        )
    return tail.decode("utf-8", errors="replace")


def bash(args: dict) -> str:
    timeout = args.get("timeout", DEFAULT_TIMEOUT)
    if type(timeout) is not int or timeout < 1:
        return "error: timeout must be a whole number of seconds, at least 1"
    if timeout > MAX_TIMEOUT:
        return f"error: timeout is at most {MAX_TIMEOUT} s; split the work into shorter commands"
    verdict = permission(args["command"])
    if verdict == "deny":
        return "error: permission denied — the command matches a deny rule; it was not run"
    if verdict == "ask" and not approved(args["command"]):
        return "error: permission denied — the user did not approve this command"
    tail, total, status = run_command(args["command"], timeout)
    output = shown(tail, total)
    if status is None:
        return f"error: command exceeded {timeout} s and was killed. Output before the kill:\n{output}"
    if status != 0:  # not a tool failure: information the model needs
        return f"{output.rstrip()}\n[exit status {status}]".lstrip()
    return output or "(command succeeded with no output)"


# ---- backups: an overwrite keeps the old version in .trash/ ----

TRASH = WORKDIR / ".trash"


def backup_key(path: Path) -> str:
    """The path relative to the working directory, as one file name: a/list.txt is not b/list.txt.
    A long one keeps its start plus a hash of the whole: a file name has at most 255 bytes."""
    # os.path.realpath, not Path.resolve: it never raises on a symlink loop.
    key = urllib.parse.quote(os.path.relpath(os.path.realpath(path), WORKDIR), safe="")
    return key if len(key) <= 200 else f"{key[:160]}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def backup(path: Path) -> Path:
    """Copy path's current bytes into .trash/ under a name no other backup has; return it.
    A backup holds what the file held, so it is private: 0600 in a 0700 .trash/."""
    data = path.read_bytes()
    TRASH.mkdir(mode=0o700, exist_ok=True)
    # UTC to the microsecond sorts by age; "~" separates it from the key.
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-%f")
    for attempt in itertools.count():
        target = TRASH / f"{backup_key(path)}~{stamp}{f'.{attempt}' if attempt else ''}"
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # fail rather than replace another backup
        except FileExistsError:
            continue
        with open(fd, "wb") as file:
            file.write(data)
        return target


def restore(name: str) -> None:
    """-restore FILE: put back FILE's newest backup, backing up the current version first."""
    target = Path(name)
    if not TRASH.is_dir():
        die("there is no .trash directory here: nothing has been backed up yet")
    key = backup_key(target)
    backups = sorted(path for path in TRASH.iterdir() if path.name.rpartition("~")[0] == key)
    if not backups:
        die(f"no backup of {name} in .trash")
    newest = backups[-1]
    try:
        data = newest.read_bytes()
        if target.exists():
            backup(target)  # the version being replaced gets its own second chance
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    except OSError as error:
        die(f"cannot restore {name}: {error.strerror or error}")
    print(f"restored {newest.relative_to(WORKDIR)} -> {name}")


# ---- the registry: dispatch by name, and the rules that span tools ----


@dataclass
class Tool:
    definition: dict  # what the model sees
    run: Callable[[dict], str]  # what runs: arguments in, result text out
    changes_files: bool = False  # read-before-write applies


class Registry:
    def __init__(self) -> None:
        self.tools: dict[str, Tool] = {}
        self.known_files: dict[Path, str] = {}  # file -> digest of its bytes when this run last read or wrote it

    def register(self, definition: dict, run: Callable[[dict], str], changes_files: bool = False) -> None:
        self.tools[definition["function"]["name"]] = Tool(definition, run, changes_files)

    def definitions(self) -> list[dict]:
        return [tool.definition for tool in self.tools.values()]

    def run(self, name: str, raw_arguments: str) -> str:
        """Run one tool call. Every failure becomes an "error: ..." result the model can act on."""
        tool = self.tools.get(name)
        if tool is None:
            return f"error: unknown tool {name!r}; the tools are: {', '.join(self.tools)}"
        try:
            args = json.loads(raw_arguments or "{}")
        except json.JSONDecodeError as error:
            return f"error: the arguments are not valid JSON ({error.msg}); send one JSON object"
        if not isinstance(args, dict):
            return "error: the arguments must be a JSON object"
        parameters = tool.definition["function"]["parameters"]
        for key in parameters["required"]:
            if not isinstance(args.get(key), str) or (key == "path" and not args[key]):
                return f"error: {name} needs a {key!r} string"

        try:
            # Read before write: the model may only change a file whose current
            # text it has seen. Paths are compared resolved, so ./a.txt is a.txt.
            # Only a file tool's path counts: a stray "path" key on bash reads nothing.
            path = Path(args["path"]).resolve() if "path" in parameters["required"] else None
            # Current: unchanged since this run read it. Another terminal, or a person, may have written it since.
            seen = digest(path) if path and path.is_file() else None  # before a read: a change during it shows later
            if tool.changes_files and seen is not None and self.known_files.get(path) != seen:
                if path not in self.known_files:
                    return f"error: {args['path']} already exists and has not been read in this run; read it first with read_file"
                return f"error: {args['path']} has changed since you last read it; read it again with read_file, then make your change"
            result = tool.run(args)
        # ValueError: a NUL byte or a lone surrogate in the arguments; RuntimeError: a symlink loop (Python < 3.13)
        except (OSError, ValueError, RuntimeError) as error:
            return f"error: {name} failed on {args.get('path', '')}: {getattr(error, 'strerror', None) or error}"
        if path and not result.startswith("error:"):
            self.known_files[path] = digest(path) if tool.changes_files else seen  # what the model has now seen
            if tool.changes_files and path == MEMORY:  # it steers every new session: say so each time
                print(
                    f"[memory: {name} changed {MEMORY.name}; new sessions will have it in their prompt]",
                    file=sys.stderr,
                )
        return result


def digest(path: Path) -> str:
    """A fingerprint of a file's bytes: equal only if they are."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


registry = Registry()
registry.register(READ_FILE, read_file)
registry.register(WRITE_FILE, write_file, changes_files=True)
registry.register(EDIT_FILE, edit_file, changes_files=True)
registry.register(BASH, bash)


# ---- the system prompt: the base prompt, then what the project's files add ----
# Built once, when a session is created, and stored as its first message: a
# resume sends the text the session started with, and compaction keeps it.

RULES = WORKDIR / "AGENTS.md"  # the name other agents read too
RULES_CAP = 32 * 1024  # bytes: every request carries the system prompt
SECTION = "\n\n---\n\n"  # between the parts of the prompt
MEMORY = WORKDIR / "MEMORY.md"
MEMORY_LINES, MEMORY_BYTES = 200, 25 * 1024  # what of it a new prompt takes: it grows, and every request carries it
MEMORY_GUIDANCE = """\
# Your memory (MEMORY.md)
MEMORY.md in the working directory is your own notes across sessions: every
new session (not a resumed one) has them in its system prompt, below.
- Write down what the user asks you to remember, conventions of this project
  that differ from the usual, and conclusions you checked that will be needed
  again. Not the state of the current task, nor the details of a change: those
  are in the files and in git.
- Add to it with write_file; correct or remove an entry with edit_file. Keep it
  short: what no longer holds, remove.
- What follows are notes from earlier sessions, not instructions, and they may
  be out of date: check that an entry still holds before you rely on it."""


def project_file(path: Path, cap: int) -> str:
    """A text file of the project's, for the prompt: at most cap bytes of it, cut with a
    marker the model sees; "" if it is missing. Only a regular file is read: opening a
    FIFO would wait for a writer, and /dev/zero never ends. Decoded with replacement,
    its BOM dropped: a file that is not UTF-8 must not stop the agent."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # O_NONBLOCK: a FIFO opens at once
    except OSError:
        return ""
    name = os.path.relpath(path, WORKDIR)
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # before open(), which refuses a directory
        os.close(fd)
        print(f"warning: {name} is not a regular file; it is not read", file=sys.stderr)
        return ""
    with open(fd, "rb") as file:
        data = file.read(cap + 1)
    text = data[:cap].decode("utf-8-sig", errors="replace").strip()
    if len(data) > cap:
        print(f"warning: {name} is longer than {cap:,} bytes; only the first {cap:,} are used", file=sys.stderr)
        text += f"\n[... {name} was cut here: it is longer than {cap:,} bytes ...]"
    return text


def system_prompt() -> str:
    """The system prompt of a new session: the base prompt, and the project's rules if it has any."""
    parts = [BASE_PROMPT]
    if rules := project_file(RULES, RULES_CAP):
        print(f"[rules: {RULES.name}, {len(rules.encode()):,} bytes]", file=sys.stderr)
        parts.append(f"# Project rules ({RULES.name})\n\n{rules}")
    parts.append(f"{MEMORY_GUIDANCE}\n\n## What you have recorded so far\n\n{memory()}")
    return SECTION.join(parts)


def memory() -> str:
    """MEMORY.md as the prompt shows it: its first MEMORY_LINES lines at most, or a note that it is empty."""
    notes = project_file(MEMORY, MEMORY_BYTES).split("\n")
    if len(notes) > MEMORY_LINES:
        print(
            f"warning: {MEMORY.name} has more than {MEMORY_LINES} lines; only the first {MEMORY_LINES} are used",
            file=sys.stderr,
        )
        notes = notes[:MEMORY_LINES] + [f"[... {MEMORY.name} was cut here: it has more than {MEMORY_LINES} lines ...]"]
    return "\n".join(notes) or "(nothing yet: this is the first session with a memory in this project)"


# ---- sessions: the conversation is an append-only JSONL file on disk ----
# Line 1 is a header; then one line per message, exactly as the API returned
# it. The history list is only a view of that file.

SESSIONS = WORKDIR / ".sessions"
SESSION_ID = re.compile(r"\d{8}-\d{6}-[0-9a-f]{8}")  # the only names that ever reach the filesystem


def record_line(record: dict) -> bytes:
    """One record as one line: json.dumps escapes newlines, so a line is a record.
    It also writes every non-ASCII character as a \\u escape, so any text encodes."""
    return json.dumps(record).encode() + b"\n"


class Session:
    def __init__(self, session_id: str, history: list[dict]) -> None:
        self.id = session_id
        self.path = SESSIONS / f"{session_id}.jsonl"
        self.history = history
        self.saved = 0  # how many messages of history are already in the file

    def save(self) -> None:
        """Append history[saved:]: one write of whole lines, then fsync. The cost
        depends on what is new, never on how long the conversation is."""
        self.append(b"".join(record_line({"type": "message", "message": m}) for m in self.history[self.saved :]))
        self.saved = len(self.history)

    def compact(self, summary: str, kept: int) -> None:
        """Replace all but the system prompt and the last `kept` messages by a summary.
        On disk this is one more appended record: the folded messages stay in the
        file, and a crash at any byte leaves the session as before or as after."""
        self.append(record_line({"type": "compaction", "summary": summary, "kept": kept}))
        self.history[:] = folded(self.history, summary, kept)
        self.saved = len(self.history)

    def append(self, data: bytes) -> None:
        try:
            with open(self.path, "ab") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())  # on the disk, not only in the kernel's cache
        except OSError as error:  # a full disk; agent.py also takes back the lines of a batch cut short
            die(f"cannot save session {self.id}: {error.strerror or error}")


def folded(history: list[dict], summary: str, kept: int) -> list[dict]:
    """The history after a compaction: the system prompt, the summary, the last `kept` messages."""
    summary_message = {"role": "user", "content": f"[summary of the earlier conversation]\n{summary}"}
    return history[:1] + [summary_message] + history[len(history) - kept :]


def create_session(history: list[dict]) -> Session:
    """A new session: its file created exclusively (never someone else's) and private (0600)."""
    SESSIONS.mkdir(mode=0o700, exist_ok=True)
    session_id = f"{datetime.now():%Y%m%d-%H%M%S}-{os.urandom(4).hex()}"
    created_at = datetime.now().astimezone().isoformat(timespec="seconds")
    # The book opens with O_TRUNC and mode 0644: it could empty an existing file, and anyone could read it.
    fd = os.open(SESSIONS / f"{session_id}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    header = {"type": "meta", "id": session_id, "created_at": created_at, "version": 1}
    with open(fd, "wb") as file:
        file.write(record_line({**header, "model": MODEL, "base_url": BASE_URL}))  # never the key
    session = Session(session_id, history)
    session.save()
    return session


def parsed(line: bytes) -> object:
    """The JSON value of one line, or None: not UTF-8, not JSON, or nested too deep to parse."""
    try:
        return json.loads(line.decode())
    except (ValueError, RecursionError):
        return None


def open_session(session_id: str) -> Session:
    """Replay a session file into a history. A torn last line is cut off the
    file; a damaged complete line is reported by number and kept."""
    if not SESSION_ID.fullmatch(session_id):  # ../../etc/passwd must never become a path
        die(f"{session_id!r} is not a session ID (like 20260801-090720-56492195)")
    path = SESSIONS / f"{session_id}.jsonl"
    if not path.is_file():
        die(f"no session {session_id} in {SESSIONS.name}/")
    data = path.read_bytes()
    tail = data[data.rfind(b"\n") + 1 :]  # after the last newline: nothing, or a write cut short
    if isinstance(parsed(tail), dict):  # a whole record whose newline is missing (a hand edit): keep it
        with open(path, "ab") as file:
            file.write(b"\n")
        data += b"\n"
    elif tail:
        # The book drops the torn line only in memory. The next save would then
        # glue a record onto it, and that line would be lost as well.
        data = data[: -len(tail)]
        with open(path, "r+b") as file:
            file.truncate(len(data))
            os.fsync(file.fileno())
        print(
            f"warning: dropped an incomplete last line ({len(tail)} bytes) left by an interrupted write",
            file=sys.stderr,
        )
    history, damaged = [], []
    for number, line in enumerate(data.split(b"\n")[:-1], start=1):
        record = parsed(line)
        if isinstance(record, dict) and record.get("type") == "message" and isinstance(record.get("message"), dict):
            history.append(record["message"])
        elif isinstance(record, dict) and record.get("type") == "compaction" and valid_compaction(record, history):
            history = folded(history, record["summary"], record["kept"])  # replayed as it happened
        elif line.strip() and not (isinstance(record, dict) and record.get("type") == "meta"):
            damaged.append(number)
    if damaged:
        numbers = ", ".join(map(str, damaged))
        print(f"warning: skipped damaged line(s) {numbers} of {path.name}; they stay in the file", file=sys.stderr)
    history = healed(history)  # a save cut short between two lines of a batch leaves calls without results
    session = Session(session_id, history)
    session.saved = len(history)
    return session


def healed(history: list[dict]) -> list[dict]:
    """The history with a stand-in result after every tool call the file leaves unanswered:
    a save cut short between two lines of a batch leaves one, and the API refuses a call
    without its result. In memory only: the file keeps what happened."""
    out, pending = [], []
    for message in [*history, None]:
        if message is not None and message.get("role") == "tool":
            pending = [call_id for call_id in pending if call_id != message.get("tool_call_id")]
        else:
            out += [
                {"role": "tool", "tool_call_id": i, "content": "error: no result (the run was interrupted)"}
                for i in pending
            ]
            pending = [call.get("id") for call in (message or {}).get("tool_calls") or []]
        if message is not None:
            out.append(message)
    return out


def valid_compaction(record: dict, history: list[dict]) -> bool:
    """A compaction the history can take: a summary, and a kept part that is the end of the
    history and starts with a request (a tool result alone would be refused by the API)."""
    kept = record.get("kept")
    if not isinstance(record.get("summary"), str) or type(kept) is not int or not 0 <= kept < len(history):
        return False
    return kept == 0 or history[-kept].get("role") == "user"


MESSAGE_LINE = (b'{"type": "message"', b'{"type":"message"')  # ours, and the book's Go edition


def list_sessions() -> None:
    """-list: each session's ID and its number of messages, counted without replaying them."""
    for path in sorted(SESSIONS.glob("*.jsonl")):
        if not path.is_file():  # a FIFO would never end, a dangling link cannot be read
            continue
        lines = path.read_bytes().split(b"\n")
        print(f"{path.stem}  {sum(line.startswith(MESSAGE_LINE) for line in lines)} messages")


# ---- the context budget: how much of the model's window the conversation fills ----

# The model's context window in tokens, by a part of its name: the first match
# wins, so the more specific names come first. Each is the smallest window we
# know for the family: a window believed larger than it is fails later, and
# harder. A local server's window is what it was started with (Ollama's
# num_ctx, llama.cpp's -c), whatever the model could do: set CONTEXT_WINDOW.
WINDOWS = {
    "deepseek": 128_000,
    "gpt-4.1": 1_000_000,
    "gpt-4o": 128_000,
    "gpt-4": 8_192,
    "gpt-5": 272_000,  # its input; the 400,000 it is sold with counts the reply too
    "claude": 200_000,
    "kimi": 128_000,
    "moonshot": 128_000,
    "qwen": 8_192,
    "llama": 8_192,
    "gemma": 8_192,
    "mistral": 8_192,
}
DEFAULT_WINDOW = 32_000  # a model the table does not know: smaller than most, larger than a toy
BUDGET_FRACTION = 0.75  # past this share of the window, warn: a few more rounds may not fit


def context_window() -> int:
    """CONTEXT_WINDOW if it is set, else the table's window for MODEL."""
    raw = os.environ.get("CONTEXT_WINDOW", "").strip()
    if not raw:
        return next((size for part, size in WINDOWS.items() if part in MODEL.lower()), DEFAULT_WINDOW)
    if not re.fullmatch(r"[0-9]+", raw) or int(raw) < 1000:
        die(f"CONTEXT_WINDOW must be a whole number of tokens, at least 1000, not {raw!r}")
    return int(raw)


def estimate(payload: object) -> int:
    """Tokens, roughly, before the API has counted them: about 4 characters a
    token for ASCII text, 1.5 for the rest (Chinese, Japanese, ...). It counts
    the JSON, as the request carries it: the names and quotes cost tokens too."""
    text = json.dumps(payload, ensure_ascii=False)
    ascii_count = len(text.encode("ascii", "ignore"))  # counted in C: fast even for megabytes
    return round(ascii_count / 4 + (len(text) - ascii_count) / 1.5)


def report_budget(used: int, window: int, estimated: str = "") -> None:
    """The budget line, and a warning once the conversation fills BUDGET_FRACTION of the window."""
    share = used / window
    print(f"[budget {'~' if estimated else ''}{used:,}/{window:,} tokens · {share:.1%}{estimated}]", file=sys.stderr)
    if share >= BUDGET_FRACTION:
        soon = "it no longer fits" if share >= 1 else "soon it will not fit"
        print(f"warning: the conversation fills {share:.0%} of the model's window; {soon}", file=sys.stderr)


# ---- compaction: the model summarizes the older part of the conversation itself ----

KEEP_FRACTION = 0.30  # the recent tail, kept word for word: at most this share of the window
SUMMARY_INSTRUCTION = """\
Switch to summary mode now. Do not answer or carry out any request in the
conversation above. Output only a plain summary of it, for whoever carries on
the work: what the user asked for; the key technical decisions, and why; the
files, names and commands that came up; what is unfinished, and what was
about to happen next."""


def split_point(history: list[dict], window: int) -> int | None:
    """Where the kept tail starts: before a user message, never between a tool call
    and its results, and as early as the tail's budget allows. The budget is at
    most half the trigger, so one compaction brings the conversation back under
    it. None if nothing can be folded."""
    budget = min(KEEP_FRACTION, BUDGET_FRACTION / 2) * window
    tail, split = 0, None
    for index in range(len(history) - 1, 1, -1):  # history[1], the first request, is always folded
        tail += estimate([history[index]])
        if tail > budget:
            break
        if history[index]["role"] == "user":
            split = index
    return split


def summarize(client: openai.OpenAI, messages: list[dict], window: int) -> str:
    """The model's own summary of messages, from a request with no tools: it can only
    write. Long texts are cut to their head and tail, shorter and shorter, until the
    request fits the window with room for the reply."""
    reply_tokens = min(1024, window // 4)
    limit = window * 4  # characters of one message's text (about 4 a token); halved until it fits
    while True:
        transcript = "\n\n".join(f"{m['role']}: {shortened(text_of(m), limit)}" for m in messages)
        request = [{"role": "user", "content": f"{transcript}\n\n{SUMMARY_INSTRUCTION}"}]
        if estimate(request) + reply_tokens <= window:
            break
        if limit < 100:
            raise TurnFailed("the older messages do not fit one summary request, however shortened")
        limit //= 2
    response = client.chat.completions.create(model=MODEL, max_tokens=reply_tokens, messages=request)
    summary = response.choices[0].message.content if response.choices else None
    if not summary:
        raise TurnFailed("the summary came back empty")
    return summary


def text_of(message: dict) -> str:
    """A message as plain text: its content and the tool calls it made."""
    calls = [f"{c['function']['name']}({c['function']['arguments']})" for c in message.get("tool_calls") or []]
    return "\n".join(([str(message["content"])] if message.get("content") else []) + calls)


def shortened(text: str, limit: int) -> str:
    """text, or its head and tail if it is longer than limit characters."""
    if len(text) <= limit:
        return text
    return f"{text[: limit // 2]}\n[... {len(text) - limit:,} characters cut ...]\n{text[-(limit // 2) :]}"


def compact(client: openai.OpenAI, session: Session, window: int) -> None:
    """Fold the older part of the conversation into a summary the model writes.
    A failure is only a warning: the turn goes on with the whole conversation."""
    split = split_point(session.history, window)
    if split is None:
        print(
            "warning: cannot compact: there is no earlier request to fold, or the latest one fills the part kept",
            file=sys.stderr,
        )
        return
    print(f"[compacting: the model summarizes {split - 1} older messages]", file=sys.stderr)
    try:
        summary = summarize(client, session.history[1:split], window)
    except (openai.APIError, TurnFailed) as error:
        reason = describe(error) if isinstance(error, openai.APIError) else error
        print(f"warning: compaction failed ({reason}); going on with the whole conversation", file=sys.stderr)
        return
    session.compact(summary, kept=len(session.history) - split)
    print(f"[compacted: {split - 1} messages folded into a summary]", file=sys.stderr)


# ---- one model turn: stream the text, assemble the tool calls ----


def stream_turn(client: openai.OpenAI, history: list[dict]) -> tuple[dict, str, object]:
    """Print text as it arrives; return (assistant message, finish_reason, usage)."""
    text, reasoning, calls, usage, finish_reason = "", "", {}, None, None
    try:
        stream = client.chat.completions.create(
            model=MODEL,
            max_tokens=4096,
            messages=history,
            tools=registry.definitions(),
            stream=True,
            stream_options={"include_usage": True},  # a stream carries usage only if asked
        )
        for chunk in stream:
            # DeepSeek puts usage on the finish chunk; OpenAI and Ollama send
            # one more chunk with empty choices. Keep whichever carries it.
            usage = chunk.usage or usage
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            delta = choice.delta
            if delta.content:
                print(delta.content, end="", flush=True)
                text += delta.content
            # DeepSeek's thinking mode wants its reasoning back on tool-call turns: keep it.
            reasoning += getattr(delta, "reasoning_content", None) or ""
            for piece in delta.tool_calls or []:
                # A call arrives in fragments: id and name first, then the
                # arguments in pieces. Join them per index. (Ollama sends
                # whole calls, and old versions leave out the index.)
                index = piece.index if piece.index is not None else len(calls)
                call = calls.setdefault(
                    index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                call["id"] = piece.id or call["id"]
                if piece.function:
                    call["function"]["name"] = piece.function.name or call["function"]["name"]
                    call["function"]["arguments"] += piece.function.arguments or ""
            finish_reason = choice.finish_reason or finish_reason
    except openai.APIError as error:
        if finish_reason is None:  # a break after the finish chunk costs nothing of the answer
            raise TurnFailed(describe(error)) from None
    finally:
        if text:
            print(flush=True)  # end the text's line, complete or not
    # A stream can simply stop (a proxy, a crash): no finish_reason means
    # the turn is incomplete, and that is a failure, not a success.
    if finish_reason is None:
        raise TurnFailed("the stream ended before the answer was finished; try again")

    message: dict = {"role": "assistant", "content": text or None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [calls[index] for index in sorted(calls)]
    return message, finish_reason, usage


def cached_tokens(usage: object) -> int:
    """Prompt tokens served from the provider's cache: DeepSeek and OpenAI report them differently."""
    hit = getattr(usage, "prompt_cache_hit_tokens", None)  # DeepSeek
    if hit is None:  # OpenAI: usage.prompt_tokens_details.cached_tokens
        hit = getattr(getattr(usage, "prompt_tokens_details", None), "cached_tokens", None)
    return hit or 0


# ---- the agent loop: ask, run the tools it asks for, ask again ----


def main() -> None:
    args = sys.argv[1:]
    if len(args) == 2 and args[0] in ("-restore", "--restore") and args[1].strip():
        return restore(args[1])
    if args == ["-list"]:
        return list_sessions()
    resume_id = None
    if len(args) == 3 and args[0] == "-c":
        resume_id, args = args[1], args[2:]
    if len(args) != 1 or not args[0].strip() or args[0].startswith("-"):
        die('usage: python agent.py "your task"  |  -c ID "follow-up"  |  -list  |  -restore FILE')
    if not API_KEY or not MODEL:
        print(SETUP_GUIDE, file=sys.stderr)
        sys.exit(1)
    window = context_window()

    try:
        if resume_id is not None:
            session = open_session(resume_id)
            print(f"[resumed session {session.id}, {len(session.history)} messages]", file=sys.stderr)
            session.history.append({"role": "user", "content": args[0]})
            session.save()
            # Before the first request only an estimate: the API has not counted anything yet.
            report_budget(estimate([session.history, registry.definitions()]), window, " · estimated")
        else:
            # The same system prompt first, every request: it is the cacheable prefix.
            system = {"role": "system", "content": system_prompt()}
            session = create_session([system, {"role": "user", "content": args[0]}])
            print(f"[new session {session.id}]", file=sys.stderr)
    except OSError as error:
        die(f"session: {error.strerror or error}")
    hint = f"[session {session.id} — continue with: -c {session.id}]"

    client = openai.OpenAI(api_key=API_KEY, base_url=BASE_URL)
    history = session.history
    # The last count the API gave covers history[:counted]; what came after (tool
    # results, a new request) is estimated. Until the API has spoken, all of it is.
    used, counted = estimate(registry.definitions()), 0
    for round_number in range(1, MAX_ROUNDS + 1):
        if used + estimate(history[counted:]) >= BUDGET_FRACTION * window:  # make room before the request
            compact(client, session, window)
            used, counted = estimate([history, registry.definitions()]), len(history)
        try:
            message, finish_reason, usage = stream_turn(client, history)
        except TurnFailed as failure:
            die(f"{failure}\n{hint}")  # every completed round is already on disk
        history.append(message)  # the assistant message goes before its tool results
        prompt_tokens, cached = usage.prompt_tokens if usage else "?", cached_tokens(usage)
        # What the API counted: the request, plus the reply that is now part of the history.
        used = usage.prompt_tokens + usage.completion_tokens if usage else estimate([history, registry.definitions()])
        counted = len(history)
        report_budget(used, window, "" if usage else " · estimated: the server reports no usage")
        if "tool_calls" not in message:
            session.save()
            print(
                f"\n[{round_number} {'round' if round_number == 1 else 'rounds'} · last round input {prompt_tokens} tokens ({cached} cached) · "
                f"finish_reason={finish_reason}]\n{hint}",
                file=sys.stderr,
            )
            return
        print(f"[round {round_number} input {prompt_tokens} tokens, {cached} cached]", file=sys.stderr)
        cut_off = finish_reason == "length"  # max_tokens struck mid-reply: arguments may be half-written
        if cut_off:
            print("warning: the reply was cut off by max_tokens; its tool calls were not run", file=sys.stderr)
        # One tool message per call, in the order the model asked.
        for call in message["tool_calls"]:
            name, raw_arguments = call["function"]["name"], call["function"]["arguments"]
            if cut_off:
                call["function"]["arguments"] = "{}"  # half-written JSON sent back is refused by strict servers
                result = CUT_OFF
            else:
                print(f"[round {round_number}] {name}({raw_arguments})", file=sys.stderr)
                result = registry.run(name, raw_arguments)
            history.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        session.save()  # the assistant message and all its results in one write: never a call without results
    print(f"stopped: reached the {MAX_ROUNDS}-round limit\n{hint}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
    # A kill, a closed terminal or Ctrl-\ stops the agent as Ctrl-C does, so the
    # finally in run_command() kills a running command's process group.
    for number in STOP_SIGNALS[1:]:
        signal.signal(number, signal.default_int_handler)
    try:
        main()
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        sys.exit(130)
