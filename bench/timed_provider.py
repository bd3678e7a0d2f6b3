"""The tests' fake provider with two timestamps added, for the latency benchmarks.

- `body_received`: when the last byte of a request body has been read, before
  the fake provider parses or validates it (that work is the provider's, not
  the agent's).
- `writes`: (time, bytes) of every write to a response socket, the time
  taken just before the write.

tests/fake_provider.py is used unchanged: its handler is subclassed here and
swapped in on the running server.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import fake_provider  # noqa: E402  (the path must be set first)
from fake_provider import FakeProvider, text, tool_call  # noqa: E402

__all__ = ["TimedProvider", "text", "tool_call"]


class _TimedReader:
    """Wraps a handler's rfile: a read() that returns the body notes the time."""

    def __init__(self, raw: Any, provider: TimedProvider) -> None:
        self._raw, self._provider = raw, provider

    def read(self, *args: Any) -> bytes:
        data = self._raw.read(*args)
        self._provider.body_received.append(time.perf_counter())
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
        provider = self

        class Handler(fake_provider._Handler):
            def setup(self) -> None:
                super().setup()
                self.rfile = _TimedReader(self.rfile, provider)
                self.wfile = _TimedWriter(self.wfile, provider)

        Handler.provider = self
        self.server.RequestHandlerClass = Handler  # read per connection, so this takes effect at once
