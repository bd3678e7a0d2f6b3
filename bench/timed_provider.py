"""The tests' fake provider with two timestamps added, for the latency benchmarks.

- `body_received`: when the last byte of a request body has been read, before
  the fake provider parses or validates it (that work is the provider's, not
  the agent's).
- `writes`: (time, bytes) of every write to a response socket, the time
  taken just before the write.
- `exchanges`: one `Exchange` per request answered, in the order the answers
  ended: when its body was read, when its answer's last byte was written, and
  the first user message of its conversation (a subagent's prompt), for the
  benchmarks of parallel subagents, whose requests overlap.

tests/fake_provider.py is used unchanged: its handler is subclassed here and
swapped in on the running server.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import fake_provider  # noqa: E402  (the path must be set first)
from fake_provider import FakeProvider, text, tool_call, tool_calls  # noqa: E402

__all__ = ["Exchange", "TimedProvider", "text", "tool_call", "tool_calls"]


@dataclass
class Exchange:
    """One request and its answer, timed by the fake provider (perf_counter())."""

    received: float  # the last byte of its body read
    answered: float  # the last byte of its answer written (after any Reply.delay)
    first_user: str | None  # the first user message of its conversation: which agent asked
    messages: int  # messages in the request


class _TimedReader:
    """Wraps a handler's rfile: a read() that returns the body notes the time."""

    def __init__(self, raw: Any, provider: TimedProvider) -> None:
        self._raw, self._provider = raw, provider

    def read(self, *args: Any) -> bytes:
        data = self._raw.read(*args)
        self.last = time.perf_counter()
        self._provider.body_received.append(self.last)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


class _TimedWriter:
    """Wraps a handler's wfile: every write() is noted with the time just before it."""

    def __init__(self, raw: Any, provider: TimedProvider) -> None:
        self._raw, self._provider = raw, provider

    def write(self, data: bytes) -> int:
        self._provider.writes.append((time.perf_counter(), bytes(data)))
        return self._raw.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


class TimedProvider(FakeProvider):
    def __init__(self) -> None:
        super().__init__()
        self.body_received: list[float] = []
        self.writes: list[tuple[float, bytes]] = []
        self.exchanges: list[Exchange] = []
        self._handling = threading.local()  # the request a handler thread is answering
        provider = self

        class Handler(fake_provider._Handler):
            def setup(self) -> None:
                super().setup()
                self.rfile = _TimedReader(self.rfile, provider)
                self.wfile = _TimedWriter(self.wfile, provider)

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                provider._handling.body = None
                super().do_POST()
                ended = time.perf_counter()
                body, provider._handling.body = provider._handling.body, None  # not kept: it may be 50 MB
                if isinstance(body, dict):
                    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
                    first = next((m.get("content") for m in messages if m.get("role") == "user"), None)
                    provider.exchanges.append(Exchange(self.rfile.last, ended, first, len(messages)))

        Handler.provider = self
        self.server.RequestHandlerClass = Handler  # read per connection, so this takes effect at once

    def _take(self, path: str, headers: dict, body: Any, raw: bytes) -> Any:
        self._handling.body = body  # for the handler's Exchange
        return super()._take(path, headers, body, raw)
