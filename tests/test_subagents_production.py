"""Subagents in production (agent.py): what chapters 19-21 leave to the production layer.

The chapters' behaviour (isolation, the child's file, order, the limit of 4,
one question at a time, stopping a fan-out, workflows) is tested in
test_ex19.py, test_ex20.py and test_ex21.py, on agent.py too. Here is what
agent.py promises beyond them:

- what the children spent is shown: `[round N subagents T tokens]` after the
  round and `[subagents: T tokens in this run, beside this conversation's]`
  before the summary, T the sum of the children's usage; the parent's budget
  lines hold only its own conversation, which holds one result per child;
- a 429 or a 5xx is tried again as the provider asks (Retry-After in
  milliseconds, seconds or a date), at most twice, each retry shown; a status
  that will not change, x-should-retry: false, or a wait over 60 s is not;
  the parent's own request the same way;
- a child's stream has the parent's defences: STREAM_TIMEOUT for a stream of
  keep-alives and for a reply that never starts, a malformed stream, a reply
  past the turn cap; each fails that child alone, with an error result, and
  the parent's own stall handling still works once children have streamed;
- read-before-write holds across agents: a file a child changed must be read
  again by its parent;
- status lines from threads are whole lines and never come between a question
  and its answer;
- -list marks a session's subagents and lists no child as a session; -c last
  never resumes a child;
- a child's session file is closed when the child ends;
- a hostile description is shown escaped wherever it is shown.

agent.py runs as a subprocess over HTTP against the fake provider, each
child's replies routed by its prompt; the tests read what the user sees
(stderr, the terminal), what the provider received, and what is on disk.
"""

from __future__ import annotations

import email.utils
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import Terminal, hermetic_env, program, run_agent
from fake_provider import FakeProvider, Reply, chunk, raw, text
from helpers import (
    BUDGET_LINE,
    SESSION_ID_SHAPE,
    SUMMARY_CACHED,
    Live,
    assert_no_control,
    assert_ok,
    bash_calls,
    budget_lines,
    calls,
    children,
    disk_messages,
    error_lines,
    first_user,
    hint,
    new_session_id,
    requests_of,
    results,
    resumed,
    stderr_lines,
    wait_until,
)

TASK = "Look into each project with a subagent and report."  # holds no child's routing key
FINAL = "All reported."
QUESTION = "allow? (y/N)"
CHANGED = "error: {path} has changed since you last read it; read it again with read_file, then make your change"


def prompt(name: str) -> str:
    """A child's prompt; its replies are routed by `name`, which no other prompt holds."""
    return f"Look into {name} and report what you find."


def sub(name: str, description: str | None = None) -> tuple[str, str, dict]:
    """The call of the child `name`: its id is the name, and so is its description unless given."""
    return (name, "sub_agent", {"description": description or name, "prompt": prompt(name)})


def fan_out(*names: str, **kw: Any) -> Reply:
    return calls(*(sub(name) for name in names), **kw)


def echo_calls(commands: dict[str, str], **kw: Any) -> Reply:
    """One round of bash calls, keyed by call id, with the Reply's fields given (its usage)."""
    return calls(*((call_id, "bash", {"command": command}) for call_id, command in commands.items()), **kw)


def label(name: str) -> str:
    return f'[sub "{name}"'


def lines_of(stderr: str, name: str) -> list[str]:
    """The status lines of one child, in order."""
    return [line for line in stderr.splitlines() if line.startswith(label(name))]


def failure(status: int, message: str, **headers: str) -> Reply:
    """An HTTP error with a DeepSeek-shaped body and exactly the headers given."""
    body = {"error": {"message": message, "type": "api_error", "param": None, "code": "api_error"}}
    return Reply(status=status, error_body=body, headers=headers)


def no_progress(provider: FakeProvider, seconds: str) -> str:
    """What a stalled stream is reported as."""
    return (
        f"no progress from {provider.url} for {seconds} s (keep-alives and empty events do not count); "
        "try again, or raise STREAM_TIMEOUT"
    )


def hold(provider: FakeProvider, key: str) -> tuple[threading.Event, threading.Event]:
    """The first request whose first user message holds key waits at the fake provider,
    before it takes its reply, until the second event is set; the first is set once it
    waits. (An instrument on the fake server: the agent sees a reply that is late.)"""
    held, go = threading.Event(), threading.Event()
    take = provider._take

    def holding(path: str, headers: dict, body: Any, raw_body: bytes) -> Reply | None:
        if isinstance(body, dict) and key in (first_user(body) or "") and not held.is_set():
            held.set()
            go.wait(60)
        return take(path, headers, body, raw_body)

    provider._take = holding
    return held, go


# ---------------------------------------------------------------- what the children spent


def test_the_status_lines_give_the_children_s_tokens_and_the_budget_only_the_parent_s(
    provider: FakeProvider, workdir: Path
) -> None:
    # Round 1: a fan-out; round 2: one child alone; round 3: no child; then the answer.
    provider.script(
        fan_out("projA", "projB", "projC", "projE", prompt_tokens=100, completion_tokens=10),
        calls(sub("projD"), prompt_tokens=200, completion_tokens=10),
        echo_calls({"e": "echo done"}, prompt_tokens=300, completion_tokens=10),
        text(FINAL, prompt_tokens=400, completion_tokens=10),
    )
    provider.route("projA", text("A: fine.", prompt_tokens=1000, completion_tokens=200))  # 1,200
    provider.route(
        "projB",
        echo_calls({"b": "echo b"}, prompt_tokens=300, completion_tokens=30),
        text("B: fine.", prompt_tokens=400, completion_tokens=40),
    )  # 770
    provider.route("projC", text("C: fine.", prompt_tokens=4, completion_tokens=6, usage_style="openai"))  # 10
    # A child that spends, then fails: what it spent is spent.
    provider.route(
        "projE",
        echo_calls({"e": "echo e"}, prompt_tokens=50, completion_tokens=5),
        failure(400, "Bad Request", **{"x-should-retry": "false"}),
    )  # 55
    provider.route("projD", text("D: fine.", prompt_tokens=2000, completion_tokens=500))  # 2,500
    result = run_agent("final", TASK, provider=provider, cwd=workdir)
    assert_ok(result, FINAL + "\n")
    lines = result.stderr.splitlines()

    assert [line for line in lines if re.fullmatch(r"\[round \d+ subagents .*\]", line)] == [
        "[round 1 subagents 2,035 tokens]",
        "[round 2 subagents 2,500 tokens]",
    ]
    assert lines.index("[round 1 subagents 2,035 tokens]") > max(
        lines.index(line) for line in lines if line.startswith('[sub "') and line.split('"')[1] != "projD"
    )
    for name, tokens in {"projA": "1,200", "projB": "770", "projC": "10", "projD": "2,500"}.items():
        assert lines_of(result.stderr, name)[-1].startswith(f"{label(name)} finished: {tokens} tokens inside;")
    assert lines_of(result.stderr, "projE")[-1].startswith(f"{label('projE')} failed: HTTP 400")

    total = "[subagents: 4,535 tokens in this run, beside this conversation's]"
    assert lines.count(total) == 1
    closing = lines.index(total)
    assert SUMMARY_CACHED.match(lines[closing + 2]) and lines[closing + 1] == "", lines[closing:]
    assert lines[closing - 1].startswith("[budget ")

    # The parent's window holds its own conversation: each budget line is its own request's
    # count and reply, never grown by what the children spent.
    assert [budget.used for budget in budget_lines(result.stderr)] == [110, 210, 310, 410]
    assert not any(budget.estimated for budget in budget_lines(result.stderr))
    second = requests_of(provider, TASK)[1]["messages"]
    assert [m["role"] for m in second[2:]] == ["assistant", "tool", "tool", "tool", "tool"]  # one result per child


def test_a_run_with_no_subagents_says_nothing_of_them(provider: FakeProvider, workdir: Path) -> None:
    provider.script(bash_calls(e="echo hi"), text(FINAL))
    result = run_agent("final", TASK, provider=provider, cwd=workdir)
    assert_ok(result, FINAL + "\n")
    assert "subagents" not in result.stderr, result.stderr


# ---------------------------------------------------------------- retries of a child's request


RATE_LIMITED = "HTTP 429: Slow down (rate limited: wait a moment and try again)"
OVERLOADED = "HTTP 503: Overloaded (the provider failed; try again later)"


@pytest.mark.parametrize(
    "headers, wait",
    [
        pytest.param(lambda: {"retry-after-ms": "250"}, "0.25", id="retry-after-ms"),
        pytest.param(lambda: {"retry-after": "1"}, "1", id="retry-after seconds"),
        pytest.param(
            lambda: {"retry-after": email.utils.formatdate(time.time() + 2, usegmt=True)}, None, id="retry-after a date"
        ),
    ],
)
def test_a_rate_limited_child_waits_as_asked_says_so_and_gets_its_answer(
    provider: FakeProvider, workdir: Path, headers: Callable[[], dict], wait: str | None
) -> None:
    provider.script(fan_out("projA", "projB", "projC"), text(FINAL))
    provider.route("projA", failure(429, "Slow down", **headers()), text("A: fine."))
    provider.route("projB", text("B: fine."))
    provider.route("projC", text("C: fine."))
    result = run_agent("final", TASK, provider=provider, cwd=workdir)
    assert_ok(result, FINAL + "\n")
    retries = [line for line in result.stderr.splitlines() if "trying again" in line]
    assert len(retries) == 1, result.stderr
    shown = re.fullmatch(
        rf'\[sub "projA": {re.escape(RATE_LIMITED)}; trying again in (\d+(?:\.\d+)?) s \(1/2\)\]', retries[0]
    )
    assert shown, retries
    if wait is not None:
        assert shown.group(1) == wait
    else:
        assert 0 <= float(shown.group(1)) <= 3, retries  # what was left of the date's two seconds
    assert results(provider) == {"projA": "A: fine.", "projB": "B: fine.", "projC": "C: fine."}
    assert [len(requests_of(provider, prompt(name))) for name in ("projA", "projB", "projC")] == [2, 1, 1]
    lines = result.stderr.splitlines()
    assert lines.index(retries[0]) < lines.index(lines_of(result.stderr, "projA")[-1])  # shown before its answer


def test_a_child_failing_three_times_is_retried_twice_then_fails_alone(provider: FakeProvider, workdir: Path) -> None:
    busy = failure(503, "Overloaded", **{"retry-after-ms": "10"})
    provider.script(fan_out("projA", "projB", "projC"), text(FINAL))
    provider.route("projA", busy, busy, busy, text("never asked for"))
    provider.route("projB", text("B: fine."))
    provider.route("projC", text("C: fine."))
    result = run_agent("final", TASK, provider=provider, cwd=workdir)
    assert_ok(result, FINAL + "\n")
    assert lines_of(result.stderr, "projA")[1:] == [
        f'[sub "projA": {OVERLOADED}; trying again in 0.01 s (1/2)]',
        f'[sub "projA": {OVERLOADED}; trying again in 0.01 s (2/2)]',
        f'[sub "projA" failed: {OVERLOADED}]',
    ]
    assert len(requests_of(provider, prompt("projA"))) == 3
    assert results(provider) == {
        "projA": f"error: the subagent failed: {OVERLOADED}",
        "projB": "B: fine.",
        "projC": "C: fine.",
    }
    assert [line for line in result.stderr.splitlines() if "trying again" in line and "projA" not in line] == []


def failed_at_once(provider: FakeProvider, workdir: Path, reply: Reply) -> tuple[str, str]:
    """A fan-out whose child projA gets `reply` and no retry, projB its answer: (projA's failed line, its result)."""
    provider.script(fan_out("projA", "projB"), text(FINAL))
    provider.route("projA", reply, text("never asked for"))
    provider.route("projB", text("B: fine."))
    result = run_agent("final", TASK, provider=provider, cwd=workdir)
    assert_ok(result, FINAL + "\n")
    assert "trying again" not in result.stderr, result.stderr
    assert len(requests_of(provider, prompt("projA"))) == 1
    assert results(provider)["projB"] == "B: fine."
    failed, answer = lines_of(result.stderr, "projA")[-1], results(provider)["projA"]
    assert failed.startswith('[sub "projA" failed: ') and answer.startswith("error: the subagent failed: "), failed
    return failed, answer


@pytest.mark.parametrize(
    "reply, said",
    [
        pytest.param(
            failure(503, "Overloaded", **{"x-should-retry": "false", "retry-after-ms": "10"}),
            OVERLOADED,
            id="x-should-retry false",
        ),
        pytest.param(failure(400, "Bad Request", **{"retry-after-ms": "10"}), "HTTP 400: Bad Request", id="400"),
    ],
)
def test_a_child_s_request_the_server_says_not_to_retry_fails_at_once(
    provider: FakeProvider, workdir: Path, reply: Reply, said: str
) -> None:
    failed, answer = failed_at_once(provider, workdir, reply)
    assert failed == f'[sub "projA" failed: {said}]' and answer == f"error: the subagent failed: {said}"


@pytest.mark.parametrize(
    "headers, asked",
    [
        pytest.param({"retry-after": "120"}, ["120"], id="retry-after 120"),
        pytest.param({"retry-after-ms": "90000"}, ["90", "90000"], id="retry-after-ms 90000"),
    ],
)
def test_a_wait_longer_than_60_s_is_not_waited_for_and_the_error_says_so(
    provider: FakeProvider, workdir: Path, headers: dict, asked: list[str]
) -> None:
    """LONGEST_WAIT: "a provider that asks for a longer wait gets an error instead, which says so".
    The error must name the wait asked for (in seconds or as sent); "wait a moment" says nothing of it."""
    failed, answer = failed_at_once(provider, workdir, failure(429, "Slow down", **headers))
    for shown in (failed, answer):
        assert "HTTP 429" in shown and re.search(rf"\b({'|'.join(asked)})(\.0+)?\b", shown), shown


def test_the_parent_s_own_request_is_retried_the_same_way(provider: FakeProvider, workdir: Path) -> None:
    provider.script(failure(429, "Slow down", **{"retry-after-ms": "20"}), text(FINAL))
    result = run_agent("final", TASK, provider=provider, cwd=workdir)
    assert_ok(result, FINAL + "\n")
    assert [line for line in result.stderr.splitlines() if "trying again" in line] == [
        f"[request: {RATE_LIMITED}; trying again in 0.02 s (1/2)]"
    ]
    assert len(provider.chat_requests) == 2
    assert provider.chat_requests[0]["messages"] == provider.chat_requests[1]["messages"]  # the same request again


def test_the_parent_s_request_failing_three_times_ends_the_run_with_one_error(
    provider: FakeProvider, workdir: Path
) -> None:
    busy = failure(503, "Overloaded", **{"retry-after-ms": "10"})
    provider.script(busy, busy, busy, text("never asked for"))
    result = run_agent("final", TASK, provider=provider, cwd=workdir)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert [line for line in result.stderr.splitlines() if "trying again" in line] == [
        f"[request: {OVERLOADED}; trying again in 0.01 s (1/2)]",
        f"[request: {OVERLOADED}; trying again in 0.01 s (2/2)]",
    ]
    assert error_lines(result.stderr) == [f"error: {OVERLOADED}"]
    assert stderr_lines(result.stderr)[-1] == hint(new_session_id(result.stderr))
    assert len(provider.chat_requests) == 3


# ---------------------------------------------------------------- a child's stream: timeouts, malformed, huge


def test_a_child_that_stalls_is_given_up_on_and_reported_and_the_others_go_on(
    provider: FakeProvider, workdir: Path
) -> None:
    """STREAM_TIMEOUT=2: one child's stream sends only keep-alives after its first event (each
    resets the SDK's read timeout), another's server takes the request and says nothing for
    longer than that (the SDK's read timeout is STREAM_TIMEOUT too)."""
    provider.script(fan_out("projK", "projD", "projA"), text(FINAL))
    provider.route("projK", text("an answer that never comes", keepalive_after=1))
    provider.route("projD", text("too late", delay=20))
    provider.route("projA", text("A: fine."))
    result = run_agent("final", TASK, provider=provider, cwd=workdir, timeout=60, STREAM_TIMEOUT="2")
    assert_ok(result, FINAL + "\n")
    stalled = no_progress(provider, "2")
    assert results(provider) == {
        "projK": f"error: the subagent failed: {stalled}",
        "projD": f"error: the subagent failed: {stalled}",
        "projA": "A: fine.",
    }
    for name in ("projK", "projD"):
        assert lines_of(result.stderr, name)[-1] == f'[sub "{name}" failed: {stalled}]'
    assert lines_of(result.stderr, "projA")[-1].startswith('[sub "projA" finished')
    assert len(provider.chat_requests) == 5  # no child tried again: a stall is not a rate limit


TEXT = chunk({"role": "assistant", "content": "partial "})
END = chunk({}, "stop") + b"data: [DONE]\n\n"
BROKEN = {
    "projJ": (raw(TEXT, b"data: {not json\n\n", END), "the server sent a malformed stream (a line that is not JSON"),
    "projT": (raw(TEXT, chunk({"content": 5}), END), "the server sent a malformed stream (content is int); try again"),
    "projH": (
        raw(*[chunk({"content": "a" * 100_000})] * 11, END),
        "the reply passed 1,000,000 characters, more than any answer can be; try again",
    ),
    "projS": (raw(TEXT), "the stream ended before the answer was finished; try again"),
}


def test_a_child_fed_a_malformed_or_huge_stream_fails_cleanly_and_the_others_go_on(
    provider: FakeProvider, workdir: Path
) -> None:
    provider.script(fan_out(*BROKEN, "projA"), text(FINAL))
    for name, (reply, _said) in BROKEN.items():
        provider.route(name, reply)
    provider.route("projA", text("A: fine."))
    result = run_agent("final", TASK, provider=provider, cwd=workdir, timeout=60)
    assert_ok(result, FINAL + "\n")
    assert_no_control("stderr", result.stderr)
    got = results(provider)
    assert got.pop("projA") == "A: fine."
    for name, (_reply, said) in BROKEN.items():
        assert got[name].startswith(f"error: the subagent failed: {said}"), got[name][:300]
        assert lines_of(result.stderr, name)[-1].startswith(f'[sub "{name}" failed: {said}')
    assert max(len(line) for line in result.stderr.splitlines()) < 2048  # the megabyte is shown nowhere
    assert len(json.dumps(provider.chat_requests[-1])) < 100_000  # nor sent back to the model


def test_the_parent_s_own_keep_alive_stream_is_stopped_after_children_have_streamed(
    provider: FakeProvider, workdir: Path
) -> None:
    """One watchdog watches every stream: after a fan-out's streams have come and gone, it still
    stops the parent's. The round of the fan-out stays saved."""
    provider.script(fan_out("projA", "projB"), text("half an answer", keepalive_after=2))
    provider.route("projA", text("A: fine."))
    provider.route("projB", text("B: fine."))
    result = run_agent("final", TASK, provider=provider, cwd=workdir, timeout=60, STREAM_TIMEOUT="2")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert error_lines(result.stderr) == [f"error: {no_progress(provider, '2')}"]
    session_id = new_session_id(result.stderr)
    assert stderr_lines(result.stderr)[-1] == hint(session_id)
    stored = disk_messages(workdir / ".sessions" / f"{session_id}.jsonl")
    assert [(m["role"], m.get("tool_call_id"), m.get("content")) for m in stored[2:]] == [
        ("assistant", None, None),
        ("tool", "projA", "A: fine."),
        ("tool", "projB", "B: fine."),
    ]


# ---------------------------------------------------------------- read-before-write across agents


def test_a_file_a_child_changed_must_be_read_again_by_its_parent(provider: FakeProvider, workdir: Path) -> None:
    (workdir / "a.txt").write_text("alpha\n")
    provider.script(
        calls(("p1", "read_file", {"path": "a.txt"})),
        calls(sub("projA")),
        calls(("p2", "edit_file", {"path": "a.txt", "old_string": "alpha", "new_string": "parent"})),
        calls(("p3", "read_file", {"path": "a.txt"})),
        calls(("p4", "edit_file", {"path": "a.txt", "old_string": "child", "new_string": "parent"})),
        text(FINAL),
    )
    provider.route(
        "projA",
        calls(("c1", "read_file", {"path": "a.txt"})),
        calls(("c2", "edit_file", {"path": "a.txt", "old_string": "alpha", "new_string": "child"})),
        text("A: changed alpha to child."),
    )
    result = run_agent("final", TASK, provider=provider, cwd=workdir)
    assert_ok(result, FINAL + "\n")
    last = requests_of(provider, prompt("projA"))[-1]["messages"]
    child = {m["tool_call_id"]: m["content"] for m in last if m["role"] == "tool"}
    assert child["c1"] == "alpha\n" and child["c2"].startswith("edited a.txt: replaced 1 occurrence"), child
    got = results(provider)
    assert got["p1"] == "alpha\n"
    assert got["p2"] == CHANGED.format(path="a.txt")
    assert got["p3"] == "child\n"  # the refused edit left the child's change in place
    assert got["p4"].startswith("edited a.txt: replaced 1 occurrence"), got["p4"]
    assert (workdir / "a.txt").read_text() == "parent\n"


# ---------------------------------------------------------------- status lines from threads


def shapes(names: list[str]) -> list[re.Pattern]:
    """Every line a fan-out of these children with echo calls may print."""
    who = "|".join(map(re.escape, names))
    child_file = rf"\.sessions/{SESSION_ID_SHAPE}/{SESSION_ID_SHAPE}\.jsonl"
    return [
        re.compile(rf"\[new session {SESSION_ID_SHAPE}\]"),
        BUDGET_LINE,
        re.compile(r"\[round \d+ input \d+ tokens, \d+ cached\]"),
        re.compile(r"\[round 1 fan-out: \d+ sub_agent calls, at most 4 at once\]"),
        re.compile(rf'\[round 1\] sub_agent\(\{{"description": "({who})", "prompt": "[^"\[\]]*"\}}\)'),
        re.compile(rf'\[sub "({who})" started: it sees only its prompt · {child_file}\]'),
        re.compile(rf'\[sub "({who})" round \d+\] bash\(\{{"command": "echo [a-z0-9 ]*"\}}\)'),
        re.compile(rf'\[sub "({who})" finished: [\d,]+ tokens inside; the parent receives ~[\d,]+\]'),
        re.compile(r"\[round \d+ subagents [\d,]+ tokens\]"),
        re.compile(r"\[subagents: [\d,]+ tokens in this run, beside this conversation's\]"),
        SUMMARY_CACHED,
        re.compile(rf"\[session {SESSION_ID_SHAPE} — continue with: -c {SESSION_ID_SHAPE}\]"),
        re.compile(""),
    ]


def test_lines_from_children_printing_at_once_are_each_whole(provider: FakeProvider, workdir: Path) -> None:
    names = ["projA", "projB", "projC", "projD"]
    rounds, width = 5, 3
    provider.script(fan_out(*names), text(FINAL))
    for name in names:
        replies = [
            echo_calls({f"{name}{r}{n}": f"echo {name.lower()} {r} {n}" for n in range(width)}, pieces=1)
            for r in range(rounds)
        ]
        provider.route(name, *replies, text(f"{name}: fine.", pieces=1))
    result = run_agent("final", TASK, provider=provider, cwd=workdir)
    assert_ok(result, FINAL + "\n")
    known = shapes(names)
    for line in result.stderr.split("\n"):
        assert sum(bool(pattern.fullmatch(line)) for pattern in known) == 1, f"not one whole line: {line!r}"
    for name in names:
        mine = lines_of(result.stderr, name)
        assert len(mine) == 1 + rounds * width + 1, mine
        assert " started: " in mine[0] and " finished: " in mine[-1]
        assert mine[1:-1] == [
            f'[sub "{name}" round {r + 1}] bash({{"command": "echo {name.lower()} {r} {n}"}})'
            for r in range(rounds)
            for n in range(width)
        ]


class AtTerminal:
    """agent.py at a Terminal that is its stderr too, as in a person's shell: the status lines and
    the questions share the screen. Nobody answers on their own (type() does). projA's first
    request is held (held, go)."""

    def __init__(self, provider: FakeProvider, workdir: Path) -> None:
        self.held, self.go = hold(provider, prompt("projA"))
        self.terminal = Terminal("", hang_up=False)
        self.proc = subprocess.Popen(
            self.terminal.argv([sys.executable, str(program("final")), TASK]),
            cwd=workdir,
            env=hermetic_env(provider, workdir.parent),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self.terminal.slave,
        )

    def __enter__(self) -> AtTerminal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.go.set()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=30)
        self.terminal.close()

    def finish(self) -> tuple[int, str, str]:
        """(exit code, stdout, all the terminal showed)."""
        out, _ = self.proc.communicate(timeout=60)
        self.terminal.close()
        return self.proc.returncode, out.decode(), self.terminal.text


def assert_nothing_inside_a_question(shown: str, answers: list[str]) -> None:
    """Each question is followed on the screen by its answer (the echo of what was typed), nothing else."""
    after = shown.split(QUESTION)[1:]
    assert len(after) == len(answers), shown
    for text_, answer in zip(after, answers, strict=True):
        assert text_.startswith(f" {answer}\n"), f"between a question and its answer: {text_[:200]!r}"


def question_while_paused(provider: FakeProvider, run: AtTerminal) -> None:
    """projA's question on the terminal, another child's reply paused on its way: projA's
    first reply waits until that reply is paused, so the other child is past its start."""
    try:
        assert run.held.wait(30), "projA's request never came"
        provider.wait_paused()
    finally:
        run.go.set()
    run.terminal.wait_for(QUESTION)


def test_no_status_line_comes_between_a_question_and_its_answer(provider: FakeProvider, workdir: Path) -> None:
    (workdir / "b.txt").write_text("beta\n")
    provider.script(fan_out("projA", "projB"), text(FINAL))
    provider.route("projA", bash_calls(run="echo A > a.out"), text("A: done."))
    provider.route("projB", calls(("rb", "read_file", {"path": "b.txt"}), pieces=1, pause_after=1), text("B: done."))
    with AtTerminal(provider, workdir) as run:
        question_while_paused(provider, run)
        provider.release()
        # projB has its call and goes on (a read asks nothing); its lines wait for the answer.
        wait_until(lambda: len(requests_of(provider, prompt("projB"))) == 2, "projB's second request")
        wait_until(lambda: provider.in_flight == 0, "projB's last reply was sent")
        with pytest.raises(TimeoutError):
            run.terminal.wait_for('[sub "projB" round 1]', timeout=0.5)
        run.terminal.type("y\n")
        code, out, shown = run.finish()
    assert code == 0 and out == FINAL + "\n", shown
    assert (workdir / "a.out").read_text() == "A\n"
    assert_nothing_inside_a_question(shown, ["y"])
    assert '[sub "projB" round 1] read_file({"path": "b.txt"})' in shown.split(QUESTION)[1]
    assert results(provider) == {"projA": "A: done.", "projB": "B: done."}


def test_a_child_that_starts_while_a_question_waits_sends_its_request(provider: FakeProvider, workdir: Path) -> None:
    """A status line waits for the question's answer; the child that would write it does not.
    projE starts only once a slot is free, after the question is up; waiting to say that it
    started, it would never send its request, and the person would wait for nothing."""
    names = ("projA", "projB", "projC", "projD", "projE")
    provider.script(fan_out(*names), text(FINAL))
    provider.route("projA", bash_calls(run="echo A > a.out"), text("A: done."))
    for name in names[1:4]:
        provider.route(name, text(f"{name[-1]}: done.", pause_after=1))  # each holds its slot until release()
    provider.route("projE", text("E: done."))
    with AtTerminal(provider, workdir) as run:
        question_while_paused(provider, run)
        provider.release()
        wait_until(lambda: requests_of(provider, prompt("projE")), "projE's request while the question waits")
        wait_until(lambda: provider.in_flight == 0, "projE's reply was sent")
        run.terminal.type("y\n")
        code, out, shown = run.finish()
    assert code == 0 and out == FINAL + "\n", shown
    assert_nothing_inside_a_question(shown, ["y"])
    assert '[sub "projE" started' in shown.split(QUESTION)[1]
    assert results(provider) == {name: f"{name[-1]}: done." for name in names}


def test_a_child_s_cut_off_warning_waits_for_another_child_s_question(provider: FakeProvider, workdir: Path) -> None:
    """The warning for a reply cut off by max_tokens is a status line from a thread like the others."""
    provider.script(fan_out("projA", "projB"), text(FINAL))
    provider.route("projA", bash_calls(run="echo A > a.out"), text("A: done."))
    provider.route(
        "projB", calls(("rb", "read_file", {"path": "b.txt"}), finish="length", pause_after=1), text("B: done.")
    )
    with AtTerminal(provider, workdir) as run:
        question_while_paused(provider, run)
        provider.release()
        # If projB goes on while the question waits, its second request shows it; if it waits, it does not come.
        try:
            wait_until(lambda: len(requests_of(provider, prompt("projB"))) == 2, "projB's second request", timeout=2)
        except TimeoutError:
            pass
        run.terminal.type("y\n")
        code, out, shown = run.finish()
    assert code == 0 and out == FINAL + "\n", shown
    assert "warning: the reply was cut off by max_tokens; its tool calls were not run" in shown
    assert_nothing_inside_a_question(shown, ["y"])


# ---------------------------------------------------------------- -list and -c last


def ran(provider: FakeProvider, workdir: Path, task: str) -> str:
    """A new session run to its answer; its ID."""
    result = run_agent("final", task, provider=provider, cwd=workdir)
    assert_ok(result, FINAL + "\n")
    return new_session_id(result.stderr)


def test_list_marks_subagents_lists_no_child_and_continue_last_never_picks_one(
    provider: FakeProvider, workdir: Path
) -> None:
    provider.script(fan_out("projA", "projB", "projC"), text(FINAL))
    for name in ("projA", "projB", "projC"):
        provider.route(name, text(f"{name}: fine."))
    three = ran(provider, workdir, TASK)
    kids = list((workdir / ".sessions" / three).glob("*.jsonl"))
    assert len(kids) == 3

    # A child's file newer than every session: -c last still resumes the parent.
    future = time.time() + 3600
    for kid in kids:
        os.utime(kid, (future, future))
    count = len(disk_messages(workdir / ".sessions" / f"{three}.jsonl"))
    provider.script(text("Resumed."))
    again = run_agent("final", "-c", "last", "Go on.", provider=provider, cwd=workdir)
    assert_ok(again, "Resumed.\n")
    assert resumed(again.stderr) == (three, count)

    provider.script(calls(sub("projD")), text(FINAL))
    provider.route("projD", text("projD: fine."))
    one = ran(provider, workdir, TASK)
    provider.script(text(FINAL))
    none = ran(provider, workdir, "Just answer.")

    listed = run_agent("final", "-list", provider=None, cwd=workdir)
    assert listed.returncode == 0 and listed.stderr == "", listed.stderr
    lines = listed.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [three, one, none]  # the sessions, and only they
    assert lines[0].endswith(f"{TASK}  [3 subagents]"), lines[0]
    assert lines[1].endswith(f"{TASK}  [1 subagent]"), lines[1]
    assert lines[2].endswith("Just answer."), lines[2]
    for kid in [*kids, *(workdir / ".sessions" / one).glob("*.jsonl")]:
        assert kid.stem not in listed.stdout


# ---------------------------------------------------------------- a child's file descriptor


def open_fds(pid: int) -> list[str]:
    """What a process has open, by what each descriptor names."""
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            found.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:  # closed meanwhile
            pass
    return found


def test_a_child_s_session_file_is_closed_when_the_child_ends(provider: FakeProvider, workdir: Path) -> None:
    """Twelve children one after the other (the batch has another call, so it runs serially):
    while the first and while the last waits for its reply, the process has as many
    descriptors open; the eleven children in between left none open."""
    names = [f"proj{n:02d}" for n in range(1, 13)]
    provider.script(calls(*(sub(name) for name in names), ("e", "bash", {"command": "echo done"})), text(FINAL))
    for name in names:
        provider.route(name, text(f"{name}: fine."))
    first_held, first_go = hold(provider, prompt(names[0]))
    last_held, last_go = hold(provider, prompt(names[-1]))
    with Live("final", TASK, provider=provider, cwd=workdir) as live:
        try:
            assert first_held.wait(30), "the first child's request never came"
            at_first = open_fds(live.proc.pid)
            first_go.set()
            assert last_held.wait(30), "the last child's request never came"
            at_last = open_fds(live.proc.pid)
        finally:
            first_go.set()
            last_go.set()
        result = live.completed()
    assert_ok(result, FINAL + "\n")
    parent_id = new_session_id(result.stderr)
    kids = [path for path in at_last if f"/.sessions/{parent_id}/" in path]
    assert len(kids) == 1, kids  # the last child's own file, and no earlier child's
    assert len(at_last) <= len(at_first) + 1, (at_first, at_last)
    assert len(children(workdir, parent_id)) == 12
    assert list(results(provider).values()) == [f"{name}: fine." for name in names] + ["done\n"]


# ---------------------------------------------------------------- hostile descriptions


ASKS = "evil\x1b[2J\x07 one\u202e\r"
ASKS_SHOWN = r"evil\x1b[2J\x07 one\u202e\r"
FAILS = "\x9bsecond\x1b]52;c;aGk=\x07"
FAILS_SHOWN = r"\x9bsecond\x1b]52;c;aGk=\x07"


def test_control_characters_in_a_description_are_shown_escaped_everywhere(
    provider: FakeProvider, workdir: Path
) -> None:
    provider.script(calls(sub("projA", ASKS), sub("projB", FAILS)), text(FINAL))
    provider.route("projA", bash_calls(run="echo A > a.out"), text("A: done."))
    provider.route(
        "projB",
        failure(429, "Slow down", **{"retry-after-ms": "10"}),
        failure(503, "Overloaded", **{"x-should-retry": "false"}),
    )
    result = run_agent("final", TASK, provider=provider, cwd=workdir, answers="y\n")
    assert_ok(result, FINAL + "\n")
    assert_no_control("stderr", result.stderr)
    assert_no_control("the terminal", result.terminal)
    assert (workdir / "a.out").read_text() == "A\n"
    assert f'⚠  sub "{ASKS_SHOWN}" wants to run: echo A > a.out' in result.terminal, result.terminal
    assert lines_of(result.stderr, ASKS_SHOWN) == [
        f'[sub "{ASKS_SHOWN}" started: it sees only its prompt · {child_path(workdir, result.stderr, ASKS)}]',
        f'[sub "{ASKS_SHOWN}" round 1] bash({{"command": "echo A > a.out"}})',
        f'[sub "{ASKS_SHOWN}" finished: 36 tokens inside; the parent receives ~2]',
    ]
    assert lines_of(result.stderr, FAILS_SHOWN)[1:] == [
        f'[sub "{FAILS_SHOWN}": {RATE_LIMITED}; trying again in 0.01 s (1/2)]',
        f'[sub "{FAILS_SHOWN}" failed: HTTP 503: Overloaded (the provider failed; try again later)]',
    ]
    assert results(provider)["projA"] == "A: done."


def child_path(workdir: Path, stderr: str, description: str) -> str:
    """Where the child described so is, as its start line names it."""
    found = children(workdir, new_session_id(stderr))
    return f".sessions/{new_session_id(stderr)}/{found[description][0]['id']}.jsonl"
