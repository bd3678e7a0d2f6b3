"""Chapter 31, the finale: the agent reads its own source with grep (exercises/ex31/README.md).

Chapter 31 adds no code. Its run asks the finished program to count its own tools; here a
scripted model does what the book's model did: grep the program for the lines that define
a tool, in count mode and in content mode. What the model is sent must be exact, since
the finale's point is that a cap or a filter that changed a count without saying so would
mislead it: the count is checked against a count of our own, and the names against the
tools the same run offered the model.
"""

from __future__ import annotations

import re
import shutil

import pytest

from conftest import program, run_agent
from fake_provider import text
from helpers import calls, results

PROGRAMS = [30, "final"]  # the last chapter's program and agent.py: the whole book
each = pytest.mark.parametrize("chapter", PROGRAMS)

# A tool's definition, by the helper every chapter writes. One tool is a literal instead
# (schedule_wakeup's, whose integer parameter the helper cannot spell), and MCP's are made at run time.
DEFINED = r"^[A-Z_]+ = definition\("


@each
def test_the_agent_counts_its_own_tools_with_grep(chapter, provider, workdir) -> None:
    source = program(chapter).read_text(encoding="utf-8")
    shutil.copy(program(chapter), workdir / "agent.py")
    provider.script(
        calls(
            ("count", "grep", {"pattern": DEFINED, "path": "agent.py", "mode": "count"}),
            ("lines", "grep", {"pattern": DEFINED, "path": "agent.py"}),
        ),
        text("It is an agent: one loop, and these tools."),
    )
    done = run_agent(
        chapter, "Count your own tools in agent.py with grep, and list them.", provider=provider, cwd=workdir
    )
    assert done.returncode == 0, done.stderr
    got = results(provider)
    expected = [line for line in source.splitlines() if re.match(DEFINED, line)]
    assert got["count"] == str(len(expected))
    shown = [line.split(":", 1)[1] for line in got["lines"].splitlines()]  # "N:line" for one file
    assert shown == expected
    # The definitions grep found are the tools the run offered, and those offered only where they
    # belong: web_search with a key, skill with skills, the goal's three in a conversation.
    offered = {tool["function"]["name"] for tool in provider.chat_requests[0]["tools"]}
    names = {re.search(r'"([a-z_]+)"', source[source.index(line) :]).group(1) for line in expected}
    assert offered <= names, offered - names
    assert names - offered == {"web_search", "skill", "get_goal", "create_goal", "update_goal"}
    assert len(expected) == 18
