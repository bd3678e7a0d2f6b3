"""Fixtures of the real-server tier: llama-server processes shared by a session, a proxy per test.

    python3 tests/real_server/setup.py && python3 -m pytest -n0 -m real_server tests/real_server

The tier needs what setup.py builds into the cache, and it runs only when it
is asked for: with -m real_server, or a path in this directory on the command
line. Otherwise every test here is skipped with one reason that names the
command: a plain `python3 -m pytest` never starts a server. -n0 runs it
serially, in one process: each xdist worker would start servers of its own.

The servers (started on first use, stopped at the end): a 4096-token one with
the tools template for agent.py and chapter 5, a smaller one with the same
template for the test that overflows it (its window sized from agent.py's
requests), and a 4096-token one with the plain chat template for chapters 1
to 3.

This directory is a package (__init__.py), so this file is imported as
real_server.conftest and `import conftest` in the tests still finds
tests/conftest.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tiers import select_tier

from . import setup as build
from .server import CHAT_TEMPLATE, TOOLS_TEMPLATE, LlamaServer, Proxy

HERE = Path(__file__).resolve().parent
COMMAND = f"{build.COMMAND} && python3 -m pytest -n0 -m real_server tests/real_server"
WINDOW = 4096  # the window of the server most tests use


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def missing() -> str | None:
        reason = build.missing()
        return reason and f"{reason}: run {COMMAND}"

    select_tier(config, items, HERE, "real_server", "real-server", COMMAND, missing)


@pytest.fixture(scope="session")
def llama_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[int, Path], LlamaServer]]:
    """llama_servers(ctx, template): the server with that window and template, started on first use."""
    servers: dict[tuple[int, Path], LlamaServer] = {}

    def get(ctx: int, template: Path = TOOLS_TEMPLATE) -> LlamaServer:
        if (ctx, template) not in servers:
            log = tmp_path_factory.mktemp(f"llama-server-{ctx}-{template.stem}") / "server.log"
            servers[ctx, template] = LlamaServer(ctx, log, template)
        return servers[ctx, template]

    yield get
    for server in servers.values():
        server.stop()


@pytest.fixture
def proxy(llama_servers: Callable[[int, Path], LlamaServer]) -> Iterator[Proxy]:
    """A proxy in front of the 4096-token server with the tools template."""
    with Proxy(llama_servers(WINDOW, TOOLS_TEMPLATE)) as p:
        yield p


@pytest.fixture
def small_proxy(llama_servers: Callable[[int, Path], LlamaServer]) -> Iterator[Callable[[int], Proxy]]:
    """small_proxy(window): a proxy in front of a server with that window and the tools template.
    The overflow test sizes the window from what agent.py's requests cost: every chapter
    that adds a tool or a line of the system prompt makes them longer."""
    proxies: list[Proxy] = []

    def make(window: int) -> Proxy:
        proxies.append(Proxy(llama_servers(window, TOOLS_TEMPLATE)).__enter__())
        return proxies[-1]

    yield make
    for proxy in proxies:
        proxy.__exit__(None, None, None)


@pytest.fixture
def chat_proxy(llama_servers: Callable[[int, Path], LlamaServer]) -> Iterator[Proxy]:
    """A proxy in front of the 4096-token server with the plain chat template."""
    with Proxy(llama_servers(WINDOW, CHAT_TEMPLATE)) as p:
        yield p


@pytest.fixture
def fresh_server(tmp_path: Path) -> Iterator[Callable[[], LlamaServer]]:
    """Servers of this test's own, to kill: fresh_server() starts one; all are stopped at the end."""
    started: list[LlamaServer] = []

    def start() -> LlamaServer:
        started.append(LlamaServer(WINDOW, tmp_path / f"server-{len(started)}.log"))
        return started[-1]

    yield start
    for server in started:
        server.stop()
