"""A fake model provider: a real HTTP server on 127.0.0.1 for the tests.

It speaks OpenAI Chat Completions (streaming SSE and plain JSON) the way
DeepSeek, OpenAI, Kimi and Ollama do, and the Anthropic Messages endpoint for
ex04. Tests script its replies in order and read the requests it received.

    with FakeProvider() as fp:
        fp.script(text("Hello"), tool_call("read_file", {"path": "a.txt"}))
        ... run the agent with OPENAI_BASE_URL=fp.url ...
        fp.chat_requests[0]["messages"]

Every reply is a `Reply`; the helpers below build the common ones. A request
that arrives when the script is empty gets HTTP 500 "no scripted reply", so a
test that expected fewer requests fails loudly.

Wire shapes follow what DeepSeek, OpenAI, Kimi and Ollama send: SSE chunks
with usage where each of them puts it, tool calls in fragments or whole, error
bodies, and DeepSeek's checks of the message sequence.
"""

from __future__ import annotations

import dataclasses
import json
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# ---------------------------------------------------------------- replies


@dataclass
class Reply:
    """One scripted answer to one request."""

    content: str | None = None  # assistant text
    tool_calls: list[tuple[str, str, str]] = field(default_factory=list)  # (id, name, raw args)
    reasoning: str | None = None  # DeepSeek reasoning_content, streamed first
    finish: str | None = "stop"  # None: the stream never says why it ended
    prompt_tokens: int = 11
    completion_tokens: int = 7
    cached_tokens: int = 0
    # "deepseek": usage on the finish chunk, always; "openai": a separate
    # choices:[] chunk, only when the request asked for include_usage;
    # "kimi": usage inside choices[0] of the finish chunk; "none": no usage.
    usage_style: str = "deepseek"
    # "deepseek": first fragment has id+name, arguments follow in pieces;
    # "ollama": each call whole in one chunk; "ollama-noindex": same, no index.
    tool_style: str = "deepseek"
    pieces: int = 3  # how many chunks the text is split into
    keepalive: int = 0  # ": keep-alive" comments before the first chunk
    # Failure modes, counted in SSE events (chunks) sent before they strike.
    cut_after: int | None = None  # stop sending after N events
    cut_mode: str = "broken"  # "broken": bad chunked encoding; "close": clean EOF
    pause_after: int | None = None  # hold after N events until release()
    keepalive_after: int | None = None  # after N events, only ": keep-alive" comments until the client leaves
    # The SSE body as raw bytes, sent as they are (a broken proxy, a hostile server):
    # the events above are ignored. Each item is one HTTP chunk.
    raw: list[bytes] | None = None
    error_after: int | None = None  # a data: {"error":...} line after N events
    # An HTTP error status instead of a completion.
    status: int = 200
    error_body: dict | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds before the reply starts: a model that takes its time (subagents in parallel)
    # No reply at all: the server waits before the headers until the client hangs up (counted in
    # FakeProvider.hangups) or the provider closes. A model that has not started answering.
    hold: bool = False


def text(content: str, **kw: Any) -> Reply:
    return Reply(content=content, **kw)


def raw(*pieces: bytes) -> Reply:
    """A streamed reply of raw bytes, one HTTP chunk each: whatever a broken or hostile server sends."""
    return Reply(raw=list(pieces))


def sse(payload: Any) -> bytes:
    """One SSE event: `data: <payload as JSON>` and the blank line after it."""
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def chunk(delta: Any, finish: Any = None, **top: Any) -> bytes:
    """One SSE event holding a chat.completion.chunk with one choice (any field may be made wrong)."""
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return sse({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice], **top})


def tool_call(name: str, args: Any, call_id: str | None = None, **kw: Any) -> Reply:
    """One tool call. `args` may be a dict (encoded) or a raw string (sent as is)."""
    return tool_calls([(name, args)], ids=[call_id] if call_id else None, **kw)


def tool_calls(calls: list[tuple[str, Any]], ids: list[str] | None = None, **kw: Any) -> Reply:
    """Several tool calls in one assistant message (parallel calls)."""
    out = []
    for i, (name, args) in enumerate(calls):
        raw = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        call_id = ids[i] if ids else f"call_{i:02d}_{_next_id()}"
        out.append((call_id, name, raw))
    kw.setdefault("finish", "tool_calls")
    return Reply(tool_calls=out, **kw)


_id_counter = 0
_id_lock = threading.Lock()


def _next_id() -> str:
    global _id_counter
    with _id_lock:
        _id_counter += 1
        return f"{_id_counter:024d}"


# Error bodies as DeepSeek sends them: a message and a type for each status.
DEEPSEEK_ERRORS = {
    400: ("Model Not Exist", "invalid_request_error"),
    401: ("Authentication Fails, Your api key: ****abcd is invalid", "authentication_error"),
    402: ("Insufficient Balance", "unknown_error"),
    404: ("model 'nope' not found", "not_found_error"),
    422: ("Invalid Parameters", "invalid_request_error"),
    429: ("Rate Limit Reached", "rate_limit_error"),
    500: ("Server Error", "api_error"),
    503: ("Server Overloaded", "api_error"),
}


def error(status: int, message: str | None = None, retry: bool = False) -> Reply:
    """An HTTP error with a DeepSeek-shaped body.

    By default it tells the SDK not to retry (`x-should-retry: false`), so one
    scripted error is one failed request and tests need not wait for backoff.
    """
    default_msg, err_type = DEEPSEEK_ERRORS.get(status, ("error", "api_error"))
    body = {"error": {"message": message or default_msg, "type": err_type, "param": None, "code": err_type}}
    headers = {"retry-after-ms": "1"} if retry else {"x-should-retry": "false"}
    return Reply(status=status, error_body=body, headers=headers)


def anthropic_text(
    content: str, stop_reason: str = "end_turn", input_tokens: int = 13, output_tokens: int = 5
) -> Reply:
    """A reply for the Anthropic Messages endpoint (ex04)."""
    return Reply(content=content, finish=stop_reason, prompt_tokens=input_tokens, completion_tokens=output_tokens)


# ---------------------------------------------------------------- validation


def sequence_error(messages: list[dict], thinking: bool = False, legacy_reasoner: bool = False) -> str | None:
    """The checks DeepSeek makes on a request's messages (each failure is an HTTP 400
    with this message): tool results must answer the calls just before them, and
    thinking mode wants reasoning_content back on tool-call turns. None if valid."""
    pending: set[str] = set()
    for i, msg in enumerate(messages):
        role = msg.get("role")
        if role == "tool":
            if msg.get("tool_call_id") not in pending:
                return "Messages with role 'tool' must be a response to a preceding message with 'tool_calls'"
            pending.discard(msg["tool_call_id"])
            continue
        if pending:
            return (
                "An assistant message with 'tool_calls' must be followed by tool messages responding to "
                "each 'tool_call_id'. (insufficient tool messages following tool_calls message)"
            )
        if role not in ("system", "user", "assistant"):
            return f"Invalid role at message index {i}"
        if role == "assistant":
            if legacy_reasoner and "reasoning_content" in msg:
                return "The reasoning_content is an intermediate result of the model; remove it before the next request"
            if msg.get("tool_calls"):
                if thinking and not msg.get("reasoning_content"):
                    return "The reasoning_content in the thinking mode must be passed back to the API."
                pending = {c["id"] for c in msg["tool_calls"]}
    if pending:
        return (
            "An assistant message with 'tool_calls' must be followed by tool messages responding to "
            "each 'tool_call_id'. (insufficient tool messages following tool_calls message)"
        )
    return None


# ---------------------------------------------------------------- server


class FakeProvider:
    def __init__(self) -> None:
        self.replies: list[Reply] = []
        # Replies by conversation: a chat request whose first user message contains a key takes the
        # next reply of that key's queue, whatever order parallel requests arrive in (subagents).
        self.routes: dict[str, list[Reply]] = {}
        self.in_flight = 0  # chat requests being answered now
        self.most_in_flight = 0  # the most there ever were at once
        self.requests: list[dict] = []  # every request: path, headers, body (parsed JSON), raw (its bytes), refused
        self.validate = True  # DeepSeek sequence validation
        # A context window: a chat request over it (counted as len(body) // 4 tokens) gets the
        # HTTP 400 the provider named in limit_style sends, and no scripted reply is used up.
        self.context_limit: int | None = None
        self.limit_style = "deepseek"  # "deepseek", "openai", "kimi", "llamacpp" or "unnamed" (no number)
        self.limit_counts_reply = False  # True: the request's max_tokens counts in the window too (OpenAI, vLLM)
        self.measure = False  # usage reports the request's own size (len(body) // 4) as prompt_tokens
        # The reply to every chat request that offers no tools (a compaction's summary request),
        # outside the script, so a test need not know when the agent compacts. None: such a
        # request takes the script's next reply, like any other.
        self.summary: Reply | None = None
        self.thinking = False  # DeepSeek thinking mode: reasoning_content required on tool-call turns
        self.legacy_reasoner = False  # R1 era: any reasoning_content is a 400
        self.paused = threading.Event()  # set when a reply reaches pause_after
        self.closed = threading.Event()  # set by close(): replies that would run forever stop
        self.gate = threading.Event()  # release() lets a paused reply go on
        self.hangups = 0  # held replies (Reply.hold) whose client closed the connection
        self.received = threading.Condition()
        self._lock = threading.Lock()
        self.server = _Server(("127.0.0.1", 0), _handler_for(self))
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    # Addresses to hand to the agent.
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self.replies.extend(replies)

    def route(self, key: str, *replies: Reply) -> None:
        """Replies for the conversation whose first user message contains key, in order."""
        with self._lock:
            self.routes.setdefault(key, []).extend(replies)

    @property
    def chat_requests(self) -> list[dict]:
        """Bodies of the chat-completion requests, in arrival order."""
        return [r["body"] for r in self.requests if r["path"].endswith("/chat/completions")]

    @property
    def remaining(self) -> int:
        return len(self.replies)

    def wait_requests(self, n: int, timeout: float = 30) -> None:
        """Block until at least n requests have arrived."""
        with self.received:
            if not self.received.wait_for(lambda: len(self.requests) >= n, timeout):
                raise TimeoutError(f"expected {n} requests, got {len(self.requests)}")

    def wait_paused(self, timeout: float = 30) -> None:
        if not self.paused.wait(timeout):
            raise TimeoutError("the reply never reached its pause point")

    def wait_hangups(self, n: int, timeout: float = 30) -> None:
        """Block until the clients of at least n held replies have closed their connections."""
        with self.received:
            if not self.received.wait_for(lambda: self.hangups >= n, timeout):
                raise TimeoutError(f"expected {n} held requests closed by the client, saw {self.hangups}")

    def release(self) -> None:
        self.gate.set()

    def close(self) -> None:
        self.closed.set()
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FakeProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Called by the handler.
    def _take(self, path: str, headers: dict, body: Any, raw: bytes) -> Reply | None:
        with self.received:
            self.requests.append({"path": path, "headers": headers, "body": body, "raw": raw, "refused": False})
            self.received.notify_all()
        if self.summary is not None and path.endswith("/chat/completions") and isinstance(body, dict):
            if "tools" not in body:
                return self.summary
        with self._lock:
            first = next((m.get("content") for m in _messages(body) if m.get("role") == "user"), None)
            for key, queue in self.routes.items():
                if isinstance(first, str) and key in first:
                    return queue.pop(0) if queue else None
            return self.replies.pop(0) if self.replies else None


def _messages(body: Any) -> list[dict]:
    messages = body.get("messages") if isinstance(body, dict) else None
    return [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away (killed, interrupted) is normal in these tests


def _handler_for(fp: FakeProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        provider = fp

    return Handler


class _Handler(BaseHTTPRequestHandler):
    provider: FakeProvider
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # keep test output quiet
        pass

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw.decode("utf-8", "replace")
        headers = {k.lower(): v for k, v in self.headers.items()}
        if self.provider.context_limit is not None and self._tokens(body, raw) > self.provider.context_limit:
            return self._too_long(headers, body, raw)
        reply = self.provider._take(self.path, headers, body, raw)
        if reply is not None and self.provider.measure:
            reply = dataclasses.replace(reply, prompt_tokens=len(raw) // 4)
        if reply is None:
            return self._json(500, {"error": {"message": "fake provider: no scripted reply", "type": "api_error"}})
        fp = self.provider
        with fp._lock:
            fp.in_flight += 1
            fp.most_in_flight = max(fp.most_in_flight, fp.in_flight)
        try:
            if reply.hold:
                return self._hold()
            if reply.delay:
                fp.closed.wait(reply.delay)
            self._answer(body, reply)
        finally:
            with fp._lock:
                fp.in_flight -= 1

    def _hold(self) -> None:
        """Answer nothing, not even the headers; count the client's hang-up (its end of file, or a reset)."""
        fp = self.provider
        self.close_connection = True
        while not fp.closed.is_set():
            if not select.select([self.connection], [], [], 0.05)[0]:
                continue
            try:
                if self.connection.recv(1, socket.MSG_PEEK):  # bytes, not a hang-up (no client sends more)
                    fp.closed.wait(0.05)
                    continue
            except OSError:
                pass
            with fp.received:
                fp.hangups += 1
                fp.received.notify_all()
            return

    def _answer(self, body: Any, reply: Reply) -> None:
        if reply.status != 200:
            return self._json(reply.status, reply.error_body or {}, reply.headers)
        if self.path.rstrip("/").endswith("/messages"):
            return self._anthropic(body, reply)
        if not self.path.rstrip("/").endswith("/chat/completions"):
            return self._json(404, {"error": {"message": f"unknown path {self.path}", "type": "not_found_error"}})
        if self.provider.validate and isinstance(body, dict):
            problem = sequence_error(body.get("messages", []), self.provider.thinking, self.provider.legacy_reasoner)
            if problem:
                err = {
                    "message": problem,
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "invalid_request_error",
                }
                return self._json(400, {"error": err}, {"x-should-retry": "false"})
        if isinstance(body, dict) and body.get("stream"):
            self._stream(body, reply)
        else:
            self._complete(body, reply)

    def _tokens(self, body: Any, raw: bytes) -> int:
        """What the request takes of the window: its size, and its max_tokens if limit_counts_reply."""
        reply = body.get("max_tokens") if self.provider.limit_counts_reply and isinstance(body, dict) else 0
        return len(raw) // 4 + (reply if isinstance(reply, int) else 0)

    def _too_long(self, headers: dict, body: Any, raw: bytes) -> None:
        """The refusal of a request over the context window, in the words of provider limit_style."""
        fp, tokens = self.provider, len(raw) // 4
        with fp.received:
            fp.requests.append({"path": self.path, "headers": headers, "body": body, "raw": raw, "refused": True})
            fp.received.notify_all()
        limit, reply = fp.context_limit, body.get("max_tokens", 0) if isinstance(body, dict) else 0
        error = {
            "deepseek": {
                "message": f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{tokens + reply} tokens ({tokens} in the messages, {reply} in the completion). Please reduce "
                "the length of the messages or completion.",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_request_error",
            },
            "openai": {
                "message": f"This model's maximum context length is {limit} tokens. However, your messages "
                f"resulted in {tokens} tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            },
            "kimi": {
                "message": f"Invalid request: Your request exceeded model token limit: {limit}",
                "type": "invalid_request_error",
            },
            "llamacpp": {
                "code": 400,
                "message": f"request ({tokens} tokens) exceeds the available context size ({limit} tokens), try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": tokens,
                "n_ctx": limit,
            },
            "unnamed": {"message": "the input length exceeds the context length", "type": "invalid_request_error"},
        }[fp.limit_style]
        self._json(400, {"error": error}, {"x-should-retry": "false"})

    # -- plain JSON responses

    def _json(self, status: int, payload: Any, headers: dict | None = None, prefix: bytes = b"") -> None:
        data = prefix + json.dumps(payload, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _usage(self, reply: Reply) -> dict:
        usage = {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": reply.cached_tokens},
        }
        if reply.usage_style == "deepseek":
            usage["prompt_cache_hit_tokens"] = reply.cached_tokens
            usage["prompt_cache_miss_tokens"] = reply.prompt_tokens - reply.cached_tokens
        return usage

    def _complete(self, body: Any, reply: Reply) -> None:
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.reasoning is not None:
            message["reasoning_content"] = reply.reasoning
        if reply.tool_calls:
            message["tool_calls"] = [
                {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
                for cid, name, args in reply.tool_calls
            ]
        payload: dict[str, Any] = {
            "id": "cmpl-fake",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "") if isinstance(body, dict) else "",
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": reply.finish}],
        }
        if reply.usage_style != "none":
            payload["usage"] = self._usage(reply)
        self._json(200, payload, reply.headers, prefix=b"\n" * reply.keepalive)

    def _anthropic(self, body: Any, reply: Reply) -> None:
        payload = {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "") if isinstance(body, dict) else "",
            "content": [{"type": "text", "text": reply.content or ""}],
            "stop_reason": reply.finish,
            "usage": {"input_tokens": reply.prompt_tokens, "output_tokens": reply.completion_tokens},
        }
        self._json(200, payload, reply.headers)

    # -- SSE streaming

    def _events(self, body: dict, reply: Reply) -> list[dict]:
        """The chunk objects of one streamed reply, in order."""
        model = body.get("model", "")
        wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        openai_usage = reply.usage_style == "openai" and wants_usage

        def chunk(delta: dict, finish: str | None = None) -> dict:
            c: dict[str, Any] = {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": 1764680764,
                "model": model,
                "system_fingerprint": "fp_fake",
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            }
            if openai_usage:
                c["usage"] = None
            return c

        events = [chunk({"role": "assistant", "content": ""})]
        if reply.reasoning:
            for piece in _split(reply.reasoning, reply.pieces):
                events.append(chunk({"content": None, "reasoning_content": piece}))
        if reply.content:
            for piece in _split(reply.content, reply.pieces):
                events.append(chunk({"content": piece}))
        for index, (cid, name, args) in enumerate(reply.tool_calls):
            if reply.tool_style.startswith("ollama"):
                frag: dict[str, Any] = {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
                if reply.tool_style == "ollama":
                    frag["index"] = index
                events.append(chunk({"tool_calls": [frag]}))
                continue
            first = {"index": index, "id": cid, "type": "function", "function": {"name": name, "arguments": ""}}
            events.append(chunk({"tool_calls": [first]}))
            for piece in _split(args, reply.pieces):
                events.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
        if reply.finish is not None:
            last = chunk({"content": ""}, reply.finish)
            if reply.usage_style == "deepseek":
                last["usage"] = self._usage(reply)
            elif reply.usage_style == "kimi":
                last["choices"][0]["usage"] = self._usage(reply)
            events.append(last)
            if openai_usage:
                tail = chunk({})
                tail["choices"] = []
                tail["usage"] = self._usage(reply)
                events.append(tail)
        return events

    def _stream(self, body: dict, reply: Reply) -> None:
        fp = self.provider
        events = self._events(body, reply)
        clean_close = reply.cut_after is not None and reply.cut_mode == "close"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        if clean_close:
            self.send_header("Connection", "close")
        else:
            self.send_header("Transfer-Encoding", "chunked")
        for k, v in reply.headers.items():
            self.send_header(k, v)
        self.end_headers()

        def send(data: bytes) -> None:
            if clean_close:
                self.wfile.write(data)
            else:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        try:
            if reply.raw is not None:
                for piece in reply.raw:
                    send(piece)
                send(b"")
                self.close_connection = True
                return
            for _ in range(reply.keepalive):
                send(b": keep-alive\n\n")
            for i, event in enumerate(events):
                if i == reply.keepalive_after:
                    while not fp.closed.is_set():  # the SDK's read timeout never strikes: bytes keep coming
                        send(b": keep-alive\n\n")
                        fp.closed.wait(0.05)
                    return
                if i == reply.cut_after:
                    return self._cut(reply.cut_mode)
                if i == reply.error_after:
                    err = {"error": {"message": "stream interrupted by the fake provider", "type": "api_error"}}
                    send(b"data: " + json.dumps(err).encode() + b"\n\n")
                    break
                if i == reply.pause_after:
                    fp.paused.set()
                    fp.gate.wait()
                send(b"data: " + json.dumps(event, ensure_ascii=False).encode() + b"\n\n")
            else:
                if reply.cut_after is not None and reply.cut_after >= len(events):
                    return self._cut(reply.cut_mode)
                if reply.pause_after is not None and reply.pause_after >= len(events):
                    fp.paused.set()
                    fp.gate.wait()
                send(b"data: [DONE]\n\n")
            send(b"")  # the zero-length chunk ends the body
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away (killed, interrupted): nothing to do
        self.close_connection = True

    def _cut(self, mode: str) -> None:
        """End the response mid-stream: broken chunked framing or a bare EOF."""
        if mode == "broken":
            try:
                self.wfile.write(b'40\r\ndata: {"trunc')  # a chunk that promises more than it gives
                self.wfile.flush()
            except OSError:
                pass
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _split(s: str, n: int) -> list[str]:
    """Split s into about n non-empty pieces (at arbitrary points, like a real stream)."""
    if not s:
        return []
    size = max(1, -(-len(s) // max(1, n)))
    return [s[i : i + size] for i in range(0, len(s), size)]
