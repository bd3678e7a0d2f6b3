"""Chapter 7 — bash is a privileged tool (bash 是特权工具).

One tool that can do anything, so all of its code is about taming it: a
time limit that kills everything the command started, output read as it
comes with only the tail kept, stdin closed, failures reported as facts.

    python exercises/ex07/agent.py "How many lines of Python are in this directory?"
"""

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
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


def store(path: str, text: str) -> None:
    """Write text to path as UTF-8, creating parent directories."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(text.encode("utf-8"))


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
    store(args["path"], args["content"])
    return f"wrote {len(args['content'].encode('utf-8'))} bytes to {args['path']}"


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
    store(path, text.replace(old, new, 1))
    return f"edited {path}: replaced 1 occurrence"


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
    tail, total, status = run_command(args["command"], timeout)
    output = shown(tail, total)
    if status is None:
        return f"error: command exceeded {timeout} s and was killed. Output before the kill:\n{output}"
    if status != 0:  # not a tool failure: information the model needs
        return f"{output.rstrip()}\n[exit status {status}]".lstrip()
    return output or "(command succeeded with no output)"


# ---- the registry: dispatch by name, and the rules that span tools ----


@dataclass
class Tool:
    definition: dict  # what the model sees
    run: Callable[[dict], str]  # what runs: arguments in, result text out
    changes_files: bool = False  # read-before-write applies


class Registry:
    def __init__(self) -> None:
        self.tools: dict[str, Tool] = {}
        self.known_files: set[Path] = set()  # files this run has read or written

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
            if tool.changes_files and path.exists() and path not in self.known_files:
                return f"error: {args['path']} already exists and has not been read in this run; read it first with read_file"
            result = tool.run(args)
        # ValueError: a NUL byte or a lone surrogate in the arguments; RuntimeError: a symlink loop (Python < 3.13)
        except (OSError, ValueError, RuntimeError) as error:
            return f"error: {name} failed on {args.get('path', '')}: {getattr(error, 'strerror', None) or error}"
        if path and not result.startswith("error:"):
            self.known_files.add(path)
        return result


registry = Registry()
registry.register(READ_FILE, read_file)
registry.register(WRITE_FILE, write_file, changes_files=True)
registry.register(EDIT_FILE, edit_file, changes_files=True)
registry.register(BASH, bash)


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


# ---- the agent loop: ask, run the tools it asks for, ask again ----


def main() -> None:
    if len(sys.argv) != 2 or not sys.argv[1].strip():
        die('usage: python agent.py "your task"')
    if not API_KEY or not MODEL:
        print(SETUP_GUIDE, file=sys.stderr)
        sys.exit(1)

    client = openai.OpenAI(api_key=API_KEY, base_url=BASE_URL)
    history: list[dict] = [{"role": "user", "content": sys.argv[1]}]
    for round_number in range(1, MAX_ROUNDS + 1):
        try:
            message, finish_reason, usage = stream_turn(client, history)
        except TurnFailed as failure:
            die(str(failure))
        history.append(message)  # the assistant message goes before its tool results
        if "tool_calls" not in message:
            print(
                f"\n[{round_number} {'round' if round_number == 1 else 'rounds'} · last round input {usage.prompt_tokens if usage else '?'} tokens · "
                f"finish_reason={finish_reason}]",
                file=sys.stderr,
            )
            return
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
    print(f"stopped: reached the {MAX_ROUNDS}-round limit", file=sys.stderr)
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
