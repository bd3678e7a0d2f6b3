"""llama-server run for the tests, and a proxy in front of it that logs and steers.

`LlamaServer` starts the binary that setup.py built, on 127.0.0.1 and a free
port, with one of the shipped chat templates (--jinja --chat-template-file),
greedy sampling (--temp 0) and one slot, and waits (bounded) for GET /health
to say ok. Nothing in it reaches past the loopback address.

`Proxy` is a stdlib HTTP server that forwards every request to a llama-server
and relays the answer as it comes, chunk by chunk, so a program streams
through it as it would from the server itself. It logs each exchange (what
the program sent, what went on, the status and the body that came back, as it
grows) and steers the tiny model, one step of `plan` per chat request:

- "text": a plain answer: max_tokens lowered to `max_tokens`, tool_choice
  "none", so the model writes text whatever tools the program declared;
- "call": a call of the tool named in `tool`: tool_choice "required", no
  parallel calls, and the assistant turn begun with
  `<tool_call>{"name": TOOL, "arguments": ` (llama-server continues a final
  assistant message, and parses the call from that beginning on); with
  `arguments` set, the tool's schema as llama-server gets it allows only those
  values, so the grammar it derives from the schema writes exactly that call.
  The tools declared stay the same, and the template leaves schemas out of
  the prompt: the prompt does not change, and llama-server's cache of it holds;
- "cut": the same call with max_tokens so low that the turn ends inside it;
- "as-is": forwarded unchanged.

An empty plan means "text". What reaches the program is llama-server's own
answer either way: the proxy rewrites requests, never responses.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from . import setup as build

HERE = Path(__file__).resolve().parent
TOOLS_TEMPLATE = HERE / "gemma-tools.jinja"  # declares tools, renders tool calls and results
CHAT_TEMPLATE = HERE / "gemma-chat.jinja"  # plain chat: roles and text only
STARTUP_TIMEOUT = 120  # seconds for the model to load and /health to say ok
UPSTREAM_TIMEOUT = 300  # seconds llama-server may go without sending a byte, before the proxy gives up


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """One llama-server process with a context window of `ctx` tokens and a chat template."""

    def __init__(self, ctx: int, log: Path, template: Path = TOOLS_TEMPLATE) -> None:
        self.ctx = ctx
        self.log = log
        self.template = template
        self.port = free_port()
        argv = [
            str(build.binary_path()),
            "--model", str(build.model_path()),
            "--jinja", "--chat-template-file", str(template),
            "--temp", "0",
            "--ctx-size", str(ctx),
            "--parallel", "1",  # one slot: the window is the whole -c, as a user's server has it
            # One thread: two spin-wait on each other when the machine is busy (a test
            # suite beside it), which made generation 20 times slower than with one.
            "--threads", "1",
            "--fit", "off",  # no memory probing at start: a 270M model fits anywhere
            "--no-ui",
            "--host", "127.0.0.1", "--port", str(self.port),
        ]  # fmt: skip
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """OPENAI_BASE_URL for a program that talks to this server directly."""
        return f"{self.base}/v1"

    def log_tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with status {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(OSError, ValueError, urllib.error.URLError):
                with urllib.request.urlopen(f"{self.base}/health", timeout=2) as response:
                    if json.load(response).get("status") == "ok":
                        return
            time.sleep(0.2)  # /health answers 503 while the model loads: there is no event to wait on
        raise TimeoutError(f"llama-server was not ready in {STARTUP_TIMEOUT} s:\n{self.log_tail()}")

    def post(self, path: str, body: dict, timeout: float = 120) -> tuple[int, Any]:
        """A request straight to the server, past any proxy: (status, the JSON answer)."""
        request = urllib.request.Request(
            self.base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as error:
            with error:
                return error.code, json.loads(error.read() or b"null")

    def kill(self) -> None:
        """SIGKILL, as a crash or the OOM killer would end it."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class Exchange:
    """One request through the proxy."""

    method: str
    path: str
    step: str  # the plan step it was given ("" for a request that is not a chat completion)
    received: Any  # the JSON body the program sent (None if none)
    forwarded: Any  # the JSON body llama-server got
    status: int = 0  # 0: llama-server never answered
    body: bytes = b""  # what came back so far, de-chunked (it grows while the answer streams)
    complete: bool = False  # False: the body broke off (the server died mid-answer), or is still coming
    done: threading.Event = field(default_factory=threading.Event)

    def events(self) -> list[dict]:
        """The SSE data events of a streamed answer, parsed ([DONE] left out). Only whole
        events count, ended by a blank line: a client acts on nothing less, so an event
        the server never finished (it died mid-answer) is left out too."""
        end = self.body.rfind(b"\n\n")
        whole = self.body[: end + 2] if end >= 0 else b""
        return [
            json.loads(line[len("data: ") :])
            for line in whole.decode(errors="replace").splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"
        ]

    def json(self) -> Any:
        return json.loads(self.body)

    def choices(self) -> list[dict]:
        return [choice for event in self.events() for choice in event.get("choices") or []]

    def streamed_text(self) -> str:
        return "".join(choice["delta"].get("content") or "" for choice in self.choices())

    def tool_fragments(self) -> list[dict]:
        """Every tool-call piece of a streamed answer, in order."""
        return [piece for choice in self.choices() for piece in choice["delta"].get("tool_calls") or []]

    def streamed_arguments(self) -> str:
        """The arguments of the (one) streamed call, joined from its fragments."""
        return "".join((piece.get("function") or {}).get("arguments") or "" for piece in self.tool_fragments())

    def finish_reason(self) -> str | None:
        reasons = [choice["finish_reason"] for choice in self.choices() if choice.get("finish_reason")]
        return reasons[-1] if reasons else None

    def usage(self) -> dict | None:
        found = [event["usage"] for event in self.events() if event.get("usage")]
        return found[-1] if found else None


class Proxy:
    def __init__(self, upstream: LlamaServer, max_tokens: int = 24) -> None:
        self.upstream = upstream  # may be replaced between requests (a restarted server)
        self.max_tokens = max_tokens  # a text turn's cap: a tiny model at temp 0 rambles to whatever cap it gets
        self.call_max_tokens = 64  # room for one short call
        self.cut_max_tokens = 3  # inside the call: its name is out, its arguments are not finished
        self.tool = "read_file"
        self.arguments: dict[str, str] | None = None  # the call's arguments, pinned; None: the model's choice
        self.plan: list[str] = []
        self.exchanges: list[Exchange] = []
        self.changed = threading.Condition()  # notified on every new exchange and every chunk relayed
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)

    @property
    def url(self) -> str:
        """OPENAI_BASE_URL for a program (conftest.run_agent takes the proxy as its provider)."""
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    @property
    def chats(self) -> list[Exchange]:
        """The chat-completion exchanges, in order (each finished: its body is whole or broke off)."""
        with self.changed:
            chats = [e for e in self.exchanges if e.path.endswith("/chat/completions")]
        for exchange in chats:
            exchange.done.wait(UPSTREAM_TIMEOUT)
        return chats

    def wait_until(self, condition: Callable[[], bool], what: str, timeout: float = 120) -> None:
        """Wait until condition() holds; it is checked at every new exchange and every chunk relayed."""
        with self.changed:
            if not self.changed.wait_for(condition, timeout):
                raise TimeoutError(
                    f"{what}: not in {timeout} s; exchanges: {[(e.step, e.status) for e in self.exchanges]}"
                )

    def rewrite(self, body: Any) -> tuple[str, Any]:
        """The plan's next step, and the body llama-server is to get."""
        with self.changed:
            step = self.plan.pop(0) if self.plan else "text"
        if step == "as-is" or not isinstance(body, dict):
            return step, body
        body = json.loads(json.dumps(body))  # a copy: the log keeps what the program sent
        if step == "text":
            body["max_tokens"] = min(body.get("max_tokens") or self.max_tokens, self.max_tokens)
            if body.get("tools"):
                body["tool_choice"] = "none"
        elif step in ("call", "cut"):
            tools = [t for t in body.get("tools") or [] if t.get("function", {}).get("name") == self.tool]
            assert tools, f"the program declared no {self.tool} tool"
            if self.arguments is not None:
                function = tools[0]["function"]
                required = function.get("parameters", {}).get("required", [])
                assert set(required) <= set(self.arguments), (required, self.arguments)
                function["parameters"] = {
                    "type": "object",
                    "properties": {name: {"type": "string", "enum": [value]} for name, value in self.arguments.items()},
                    "required": required,  # the template shows these: the prompt stays as it was
                    "additionalProperties": False,
                }
            body["tool_choice"] = "required"
            body["parallel_tool_calls"] = False
            body["stop"] = ["</tool_call>"]
            begun = f'<tool_call>{{"name": "{self.tool}", "arguments": '
            body["messages"] = [*body["messages"], {"role": "assistant", "content": begun}]
            body["max_tokens"] = self.cut_max_tokens if step == "cut" else self.call_max_tokens
        else:
            raise ValueError(f"unknown plan step {step!r}")
        return step, body


def _handler_for(proxy: Proxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            self._forward(None)

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._forward(raw)

        def _forward(self, raw: bytes | None) -> None:
            received = json.loads(raw) if raw else None
            chat = self.path.endswith("/chat/completions")
            step, forwarded = proxy.rewrite(received) if chat else ("", received)
            exchange = Exchange(self.command, self.path, step, received, forwarded)
            with proxy.changed:
                proxy.exchanges.append(exchange)
                proxy.changed.notify_all()
            self.close_connection = True
            upstream = http.client.HTTPConnection("127.0.0.1", proxy.upstream.port, timeout=UPSTREAM_TIMEOUT)
            try:
                data = None if forwarded is None else json.dumps(forwarded).encode()
                headers = {"Content-Type": "application/json"} if data is not None else {}
                if self.headers.get("Authorization"):
                    headers["Authorization"] = self.headers["Authorization"]
                try:
                    upstream.request(self.command, self.path, body=data, headers=headers)
                    response = upstream.getresponse()
                except (OSError, http.client.HTTPException):
                    return  # no answer at all: the program sees the connection close, as from a dead server
                exchange.status = response.status
                self.send_response(response.status)
                for name, value in response.getheaders():
                    if name.lower() not in ("transfer-encoding", "content-length", "connection", "keep-alive"):
                        self.send_header(name, value)
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Connection", "close")
                self.end_headers()
                try:
                    while chunk := response.read1(65536):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                        with proxy.changed:
                            exchange.body += chunk
                            proxy.changed.notify_all()
                    self.wfile.write(b"0\r\n\r\n")
                    exchange.complete = True
                except (OSError, http.client.HTTPException):
                    pass  # llama-server died mid-answer: the chunked body is left unfinished, as it left it
            finally:
                upstream.close()
                with proxy.changed:
                    exchange.done.set()
                    proxy.changed.notify_all()

    return Handler
