"""Chapter 25: steer (exercises/ex25/agent.py), and the chapters after it, which keep it.

One thread reads the terminal; what it reads and what the turn's thread asks go to one
queue, which the main thread handles in order. A line typed while a turn runs is a steer:
`[steer: goes in before the next request]`, and at the top of the next round, after the
last tool results and before the request, it goes in as a user message of its own, its
record on disk marked `"origin": "steer"` beside the message (never inside it: the model
is sent plain messages), and `[steer entered this turn: K]` is shown. A steer that comes
after the turn's last request is folded into one follow-up turn (`[steer arrived late:
...]`, the steers joined by blank lines). A line starting `/q ` waits for the turn to end
and runs as a turn of its own (`[starting the queued line]`, origin `queued`), one at a
time, in order.

Questions are shown by the main thread, one at a time; only `y`, `yes`, `n` or `no` (any
case) typed after a question answer it: a line typed before it, or any other line typed at
it, is a steer, and the question is shown again. Ctrl-C answers a pending question no and
drops what was waiting (`[dropped what was waiting: ...]`); end of input answers it no
(`[input closed; nobody can answer: refused]`) and the agent exits after the turn; `/exit`
typed during a turn stops it and ends the agent (status 0, the hint). With stdin piped,
lines still reach the model, and never answer a question.

Each program runs at a pseudo-terminal of its own (tests/resident.py), or with piped stdin
(conftest.run_agent). What is checked is what the terminal shows, what reaches the fake
provider, and what is on disk. A command that must still be running when the test types
is `cat` of a named pipe (a read the chapter allows without a question), which ends when
the test opens the pipe: no sleeping, no race.
"""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from resident import Resident

from conftest import run_agent
from fake_provider import FakeProvider, Reply, sequence_error, text
from helpers import (
    appended,
    assert_ok,
    bash_calls,
    calls,
    conversation,
    hint,
    new_session_id,
    requests_of,
    round_lines,
    shape,
    wait_until,
)

PROGRAMS = [25, 26, 27, 30, "final"]
each = pytest.mark.parametrize("chapter", PROGRAMS)

TASK = "Tidy up the build scripts."
QUESTION = "allow? (y/N) "
STEER = "[steer: goes in before the next request]"
QUEUED = "[queued: runs as its own turn after this one]"
STARTING_QUEUED = "[starting the queued line]"
INPUT_CLOSED = "[input closed; nobody can answer: refused]"
KEPT = "[turn interrupted; the conversation is kept]"
STOPPED_NOTE = "[this turn did not finish: interrupted by the user]"
REFUSED = "error: permission denied — the user did not approve this command"
NOT_RUN = "error: not run: interrupted by the user"
SUCCEEDED = "(command succeeded with no output)"
NOBODY = "(no answer from a terminal: refused)"
API_KEYS = {"role", "content", "tool_calls", "tool_call_id", "reasoning_content", "name"}
SLOW = 10  # seconds the fake provider waits before a delayed reply's first byte
SETTLE = 0.5  # seconds; see settle()
QUICK = 5  # the bound for "at once": generous for a loaded CI machine, well within SLOW


def entered(count: int) -> str:
    return f"[steer entered this turn: {count}]"


def late(count: int) -> str:
    return f"[steer arrived late: the turn had finished; {count} folded into a follow-up turn]"


# ---------------------------------------------------------------- helpers


class Gate:
    """A named pipe in the working directory: `cat` of it (which the chapter runs without a
    question) stays running until the test opens the pipe, so a line can be typed while a
    tool runs, and the round goes on only when the test says so."""

    def __init__(self, directory: Path, name: str = "gate.fifo") -> None:
        self.path = directory / name
        os.mkfifo(self.path)
        self.command = f"cat {name}"

    def open(self, timeout: float = 30) -> None:
        """Let the command end: it reads "go" and its end of file. Polls until `cat` has opened
        the pipe (nothing else announces it); bounded."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as failure:  # ENXIO: no reader yet
                if failure.errno != errno.ENXIO or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
                continue
            os.write(fd, b"go\n")
            os.close(fd)
            return


def settle() -> None:
    """Before a Ctrl-C: give the agent's main thread a moment to get back to its wait for the next
    event once it has printed what the test just saw (a notice, a question). Nothing announces
    that it has, so this is a pause, not a wait. A Ctrl-C that lands while the main thread is
    still on its way there falls outside the `try` around that wait, and ends the agent (130)
    instead of stopping the turn: a race of the chapter's, not what these tests are about."""
    time.sleep(SETTLE)


def finish(terminal: Resident, code: int = 0) -> str:
    """/exit at the prompt; the agent ends with status code, the hint last and no traceback.
    Returns everything the terminal showed."""
    terminal.line("/exit")
    return ended(terminal, code)


def ended(terminal: Resident, code: int = 0) -> str:
    assert terminal.wait_exit() == code, terminal.text
    shown = terminal.text
    assert shown.endswith(hint(new_session_id(shown)) + "\n"), shown[-2000:]
    assert "Traceback" not in shown, shown
    return shown


def session_path(workdir: Path, shown: str) -> Path:
    return workdir / ".sessions" / f"{new_session_id(shown)}.jsonl"


def records(path: Path) -> list[dict]:
    """Every record of a session file, read independently of the agent: whole lines, a header first."""
    data = path.read_bytes()
    assert data.endswith(b"\n"), data[-200:]
    found = [json.loads(line) for line in data.split(b"\n")[:-1]]
    assert found and found[0]["type"] == "meta" and found[0]["id"] == path.stem, found[:1]
    return found


def said(path: Path) -> list[tuple[tuple, str | None]]:
    """(shape, origin) of each message record after the system prompt, in file order; a record
    has only type, message and, for a message nobody typed at the prompt, origin."""
    found = []
    for record in records(path):
        if record["type"] == "message":
            assert set(record) <= {"type", "message", "origin"}, record
            assert "origin" not in record["message"], record
            found.append((shape(record["message"]), record.get("origin")))
    assert found and found[0][0][0] == "system", found[:1]
    return found[1:]


def sent(chapter: int | str, body: dict) -> list[dict]:
    """A request's messages without the system prompt, checked valid for the provider."""
    messages = body["messages"]
    assert sequence_error(messages) is None, (sequence_error(messages), messages)
    return conversation(chapter, messages)


def tool_results(messages: list[dict]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}


def user(content: str) -> tuple:
    return ("user", content, None, ())


def answer(content: str) -> tuple:
    return ("assistant", content, None, ())


def asks(*ids: str) -> tuple:
    return ("assistant", None, None, ids)


def result(call_id: str) -> tuple:
    return ("tool", "<result>", call_id, ())


def up_to_prompt(terminal: Resident, prompts: int) -> str:
    """What the terminal showed before the prompts-th prompt."""
    return "\n> ".join(terminal.text.split("\n> ")[:prompts])


def in_order(shown: str, *needles: str) -> bool:
    """Each needle shown, each after the one before."""
    at = 0
    for needle in needles:
        at = shown.find(needle, at)
        if at < 0:
            return False
        at += len(needle)
    return True


def paused(*specs: tuple[str, str, dict]) -> Reply:
    """Tool calls whose reply holds after its first chunk until provider.release()."""
    return calls(*specs, pause_after=1)


# ---------------------------------------------------------------- steers


@each
def test_a_steer_typed_while_a_tool_runs_goes_in_after_its_result_and_before_the_next_request(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    gate = Gate(workdir)
    provider.script(
        bash_calls(c1="echo one"),
        bash_calls(c2="echo two"),
        bash_calls(c3=gate.command),
        bash_calls(c4="echo four"),
        text("Five rounds, done."),
    )
    steer = "Also keep the Makefile target names."
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line(TASK)
    terminal.wait_for(f"[round 3] bash({json.dumps({'command': gate.command})})")  # its command is running
    terminal.line(steer)
    terminal.wait_for(STEER)
    assert len(provider.chat_requests) == 3
    gate.open()
    terminal.wait_prompt(2)
    shown = finish(terminal)

    requests = provider.chat_requests
    assert len(requests) == 5
    assert all(steer not in json.dumps(body) for body in requests[:3])
    fourth, fifth = (sent(chapter, body) for body in requests[3:])
    history = [user(TASK), asks("c1"), result("c1"), asks("c2"), result("c2"), asks("c3"), result("c3")]
    assert [shape(m) for m in fourth] == [*history, user(steer)]  # right after the last result
    assert tool_results(fourth)["c3"] == "go\n"
    assert [shape(m) for m in fifth] == [*history, user(steer), asks("c4"), result("c4")]  # and before later calls
    assert shown.count(entered(1)) == 1 and "[steer entered" not in shown.replace(entered(1), "")
    assert in_order(shown, "[round 3] bash(", steer, STEER, entered(1), "[round 4] bash(", "Five rounds, done.")

    on_disk = said(session_path(workdir, shown))
    assert on_disk == [
        *((s, None) for s in history),
        (user(steer), "steer"),
        (asks("c4"), None),
        (result("c4"), None),
        (answer("Five rounds, done."), None),
    ]


@each
def test_steers_typed_during_the_last_request_become_one_follow_up_turn(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    provider.script(text("The scripts are tidy.", pause_after=1), text("The tests pass too."))
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line(TASK)
    provider.wait_paused()  # the turn's last request: its answer is on its way
    terminal.line("Run the tests as well.")
    terminal.wait_for(STEER)
    terminal.line("And say how long they took.")
    terminal.wait_for(STEER, count=2)
    provider.release()
    terminal.wait_for(late(2))
    terminal.wait_prompt(2)
    assert in_order(up_to_prompt(terminal, 2), "The scripts are tidy.", late(2), "The tests pass too.")
    shown = finish(terminal)

    requests = provider.chat_requests
    assert len(requests) == 2  # one follow-up turn for both
    assert [shape(m) for m in sent(chapter, requests[0])] == [user(TASK)]
    joined = "Run the tests as well.\n\nAnd say how long they took."
    assert [shape(m) for m in sent(chapter, requests[1])] == [user(TASK), answer("The scripts are tidy."), user(joined)]
    assert "[steer entered" not in shown
    assert said(session_path(workdir, shown)) == [
        (user(TASK), None),
        (answer("The scripts are tidy."), None),
        (user(joined), "steer"),
        (answer("The tests pass too."), None),
    ]


# ---------------------------------------------------------------- queued lines


@each
def test_queued_lines_stay_out_of_the_turn_and_then_run_one_by_one_in_order(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    provider.script(
        paused(("c1", "bash", {"command": "echo one"})),
        text("Turn one done."),
        text("Second done."),
        text("Third done."),
    )
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line(TASK)
    provider.wait_paused()
    terminal.line("/q Now update the changelog.")
    terminal.wait_for(QUEUED)
    terminal.line("/q Then bump the version.")
    terminal.wait_for(QUEUED, count=2)
    provider.release()
    terminal.wait_prompt(2)  # both ran before the prompt came back
    before = up_to_prompt(terminal, 2)
    assert in_order(before, "Turn one done.", STARTING_QUEUED, "Second done.", STARTING_QUEUED, "Third done."), before
    shown = finish(terminal)

    requests = provider.chat_requests
    assert len(requests) == 4
    for body in requests[:2]:  # the turn they were typed in: neither is a steer of it
        assert "update the changelog" not in json.dumps(body) and "bump the version" not in json.dumps(body)
    first_turn = [user(TASK), asks("c1"), result("c1"), answer("Turn one done.")]
    assert [shape(m) for m in sent(chapter, requests[1])] == first_turn[:3]
    assert [shape(m) for m in sent(chapter, requests[2])] == [*first_turn, user("Now update the changelog.")]
    assert [shape(m) for m in sent(chapter, requests[3])] == [
        *first_turn,
        user("Now update the changelog."),
        answer("Second done."),
        user("Then bump the version."),
    ]
    assert STEER not in shown and "[steer entered" not in shown and "[steer arrived late" not in shown
    assert said(session_path(workdir, shown))[4:] == [
        (user("Now update the changelog."), "queued"),
        (answer("Second done."), None),
        (user("Then bump the version."), "queued"),
        (answer("Third done."), None),
    ]


# ---------------------------------------------------------------- questions


@each
def test_a_y_typed_before_the_question_is_a_steer_and_so_is_any_other_line_typed_at_it(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    command = "echo typed > typed.out"
    provider.script(paused(("w", "bash", {"command": command})), text("Written."))
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line(TASK)
    provider.wait_paused()  # the call is on its way: no question yet
    terminal.line("y")
    terminal.wait_for(STEER)
    provider.release()
    terminal.wait_for(QUESTION)
    assert f"⚠  the model wants to run: {command}\n{QUESTION}" in terminal.text
    terminal.line("wait, is that safe?")  # no answer: a steer, and the question is shown again
    terminal.wait_for(STEER, count=2)
    terminal.wait_for(QUESTION, count=2)
    assert not (workdir / "typed.out").exists()  # neither line answered it
    assert len(provider.chat_requests) == 1
    assert terminal.text.rsplit(STEER, 1)[1].lstrip("\n").startswith("\x1b[0m\n⚠  the model wants to run: ")
    terminal.line("y")
    terminal.wait_prompt(2)
    shown = finish(terminal)

    assert (workdir / "typed.out").read_text() == "typed\n"
    assert shown.count(QUESTION) == 2 and shown.count(STEER) == 2
    second = sent(chapter, provider.chat_requests[1])
    assert [shape(m) for m in second] == [user(TASK), asks("w"), result("w"), user("y"), user("wait, is that safe?")]
    assert tool_results(second) == {"w": SUCCEEDED}
    assert in_order(shown, QUESTION, "y\n", entered(2), "Written.")
    assert said(session_path(workdir, shown))[3:5] == [(user("y"), "steer"), (user("wait, is that safe?"), "steer")]


@each
def test_yes_and_no_answer_a_question_in_any_case(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    typed = {"a": "yes", "b": "YES", "c": "n", "d": "No"}
    commands = {name: f"echo {name} > {name}.out" for name in typed}
    provider.script(bash_calls(**commands), text("Two of four."))
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line(TASK)
    for number, (name, reply) in enumerate(typed.items(), 1):
        terminal.wait_for(QUESTION, count=number)
        assert terminal.text.rsplit("⚠  ", 1)[1].startswith(f"the model wants to run: {commands[name]}\n")
        terminal.line(reply)
    terminal.wait_prompt(2)
    shown = finish(terminal)

    assert shown.count(QUESTION) == 4 and STEER not in shown
    assert sorted(p.name for p in workdir.glob("*.out")) == ["a.out", "b.out"]
    assert tool_results(provider.chat_requests[-1]["messages"]) == {
        "a": SUCCEEDED,
        "b": SUCCEEDED,
        "c": REFUSED,
        "d": REFUSED,
    }


FINAL = "Both subagents reported."


def child_prompt(name: str) -> str:
    """A child's prompt; its replies are routed by `name`, which no other prompt holds."""
    return f"Look into {name} and write down what you found."


def child_results(provider: FakeProvider, name: str) -> dict[str, str]:
    return tool_results(requests_of(provider, child_prompt(name))[-1]["messages"])


@each
def test_two_children_ask_one_at_a_time_and_each_answer_reaches_its_own_command(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    commands = {"projA": "echo from A > a.out", "projB": "echo from B > b.out"}
    provider.script(
        calls(*((name, "sub_agent", {"description": name, "prompt": child_prompt(name)}) for name in commands)),
        text(FINAL),
    )
    for name, command in commands.items():
        provider.route(name, bash_calls(run=command), text(f"{name} is done."))
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line("For each project, one subagent.")
    terminal.wait_for(QUESTION)
    for name, command in commands.items():  # both children are at their question now
        if chapter == "final":  # which holds the other child's status lines while a question is up
            wait_until(lambda name=name: requests_of(provider, child_prompt(name)), f"{name}'s request")
        else:
            terminal.wait_for(f'[sub "{name}" round 1] bash({json.dumps({"command": command})})')
    with pytest.raises(TimeoutError):
        terminal.wait_for(QUESTION, count=2, timeout=0.5)  # the second waits for the first's answer
    first = next(name for name in commands if f'⚠  sub "{name}" wants to run: {commands[name]}\n' in terminal.text)
    second = next(name for name in commands if name != first)
    terminal.line("y")
    terminal.wait_for(QUESTION, count=2)
    assert terminal.text.rsplit("⚠  ", 1)[1].startswith(f'sub "{second}" wants to run: {commands[second]}\n')
    terminal.line("n")
    terminal.wait_prompt(2)
    shown = finish(terminal)

    assert shown.count(QUESTION) == 2 and STEER not in shown
    assert (workdir / f"{first[-1].lower()}.out").read_text() == f"from {first[-1]}\n"
    assert not (workdir / f"{second[-1].lower()}.out").exists()
    assert child_results(provider, first) == {"run": SUCCEEDED}
    assert child_results(provider, second) == {"run": REFUSED}
    assert tool_results(provider.chat_requests[-1]["messages"]) == {name: f"{name} is done." for name in commands}


@each
def test_ctrl_c_closes_the_children_s_requests_the_server_has_not_answered_and_sends_them_no_more(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    names = ("projA", "projB")
    provider.script(
        calls(*((name, "sub_agent", {"description": name, "prompt": child_prompt(name)}) for name in names)),
        text("Starting over."),
    )
    for name in names:
        provider.route(name, Reply(hold=True))  # never answered, not even its headers
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line("For each project, one subagent.")
    provider.wait_requests(3)  # the parent's, then both children's
    terminal.type("\x03")
    provider.wait_hangups(2, timeout=QUICK)  # the agent closed both children's requests
    terminal.wait_prompt(2)
    assert KEPT in up_to_prompt(terminal, 2)
    # The SDK tries a broken connection again by itself: a stopped child's request must not be sent again.
    with provider.received:
        provider.received.wait_for(lambda: len(provider.requests) > 3, 2)
    assert len(provider.requests) == 3, provider.chat_requests[3:]

    terminal.line("What now?")
    terminal.wait_for("Starting over.")
    terminal.wait_prompt(3)
    assert len(provider.requests) == 4
    interrupted = "error: interrupted: the user stopped the run before this subagent finished"
    assert tool_results(sent(chapter, provider.chat_requests[3])) == dict.fromkeys(names, interrupted)


@each
def test_ctrl_c_at_a_question_refuses_it_and_brings_the_prompt_back_at_once(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    provider.script(bash_calls(a="echo a > a.out", b="echo b"), text("Starting over."))
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line(TASK)
    terminal.wait_for(QUESTION)
    settle()
    typed = time.monotonic()
    terminal.type("\x03")
    took = terminal.wait_prompt(2) - typed
    assert took < QUICK, took
    assert KEPT in up_to_prompt(terminal, 2)
    terminal.line("What now?")
    terminal.wait_prompt(3)
    shown = finish(terminal)

    assert not (workdir / "a.out").exists()
    assert len(round_lines(shown)) == 1  # the asked call; the other was not run
    assert len(provider.chat_requests) == 2
    after = sent(chapter, provider.chat_requests[1])
    assert [shape(m) for m in after] == [
        user(TASK),
        asks("a", "b"),
        result("a"),
        result("b"),
        answer(STOPPED_NOTE),
        user("What now?"),
    ]
    assert tool_results(after) == {"a": REFUSED, "b": NOT_RUN}


@each
def test_end_of_input_at_a_question_refuses_it_and_the_ones_after_and_the_agent_exits_after_the_turn(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    provider.script(bash_calls(a="echo a > a.out"), bash_calls(b="echo b > b.out"), text("Nobody is there; I stop."))
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line(TASK)
    terminal.wait_for(QUESTION)
    terminal.type("\x04")
    shown = ended(terminal, 0)

    assert shown.count(INPUT_CLOSED) == 1
    assert shown.count(QUESTION) == 1  # the second question refused at once, never shown
    assert terminal.prompts() == 1  # no prompt after the turn: the agent left
    assert in_order(shown, QUESTION, INPUT_CLOSED, "[round 2] bash(", "Nobody is there; I stop.", "[session ")
    assert not list(workdir.glob("*.out"))
    assert len(provider.chat_requests) == 3
    assert tool_results(sent(chapter, provider.chat_requests[2])) == {"a": REFUSED, "b": REFUSED}
    assert said(session_path(workdir, shown))[-1] == (answer("Nobody is there; I stop."), None)


@each
def test_exit_typed_during_a_request_stops_the_turn_and_ends_the_agent(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    provider.script(text("never shown", delay=SLOW))
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line(TASK)
    wait_until(lambda: provider.chat_requests, "the turn's request")
    typed = time.monotonic()
    terminal.line("/exit")
    shown = ended(terminal, 0)
    took = time.monotonic() - typed
    assert took < QUICK, took  # the request was not waited for

    assert KEPT in shown and STEER not in shown and "never shown" not in shown
    assert terminal.prompts() == 1
    assert len(provider.chat_requests) == 1
    assert said(session_path(workdir, shown)) == [(user(TASK), None), (answer(STOPPED_NOTE), None)]


@each
def test_ctrl_c_drops_the_steer_and_the_queued_line_that_were_waiting(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    provider.script(text("never shown", delay=SLOW), text("A fresh start."))
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line(TASK)
    wait_until(lambda: provider.chat_requests, "the turn's request")
    terminal.line("Keep it short.")
    terminal.wait_for(STEER)
    terminal.line("/q Then run the linter.")
    terminal.wait_for(QUEUED + "\r\n")
    settle()
    terminal.type("\x03")
    terminal.wait_prompt(2)
    before = up_to_prompt(terminal, 2)
    assert "[dropped what was waiting: Keep it short. | Then run the linter.]" in before, before
    assert KEPT in before
    terminal.line("Start again.")
    terminal.wait_prompt(3)
    shown = finish(terminal)

    assert STARTING_QUEUED not in shown and "[steer entered" not in shown and "[steer arrived late" not in shown
    assert len(provider.chat_requests) == 2
    assert [shape(m) for m in sent(chapter, provider.chat_requests[1])] == [
        user(TASK),
        answer(STOPPED_NOTE),
        user("Start again."),
    ]
    data = session_path(workdir, shown).read_text()
    assert "Keep it short." not in data and "linter" not in data


# ---------------------------------------------------------------- piped input


@each
def test_piped_lines_reach_the_model_in_order_without_a_terminal(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    provider.script(text("Answer one."), text("Answer two."))
    run = run_agent(chapter, provider=provider, cwd=workdir, stdin="line one\nline two\n")
    assert_ok(run, "Answer one.\nAnswer two.\n")
    assert run.stderr.endswith(hint(new_session_id(run.stderr)) + "\n"), run.stderr
    requests = provider.chat_requests
    assert len(requests) == 2
    assert [shape(m) for m in sent(chapter, requests[0])] == [user("line one")]
    assert [shape(m) for m in sent(chapter, requests[1])] == [user("line one"), answer("Answer one."), user("line two")]


@each
def test_a_piped_y_never_answers_a_question_and_with_no_terminal_it_is_refused(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    provider.script(bash_calls(a="echo a > a.out"), text("Refused, fine."), text("Noted."))
    run = run_agent(chapter, provider=provider, cwd=workdir, stdin=f"{TASK}\ny\n")
    assert run.returncode == 0 and "Traceback" not in run.stderr, (run.returncode, run.stderr)
    assert run.stderr.count(NOBODY) == 1 and QUESTION not in run.stderr
    assert not (workdir / "a.out").exists()
    last = sent(chapter, provider.chat_requests[-1])
    assert tool_results(last) == {"a": REFUSED}
    assert user("y") in [shape(m) for m in last]  # the piped y reached the model as a line, nothing more


@each
def test_with_stdin_piped_a_question_goes_to_the_controlling_terminal(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    provider.script(bash_calls(a="echo a > a.out"), text("Refused, fine."), text("Noted."))
    run = run_agent(chapter, provider=provider, cwd=workdir, stdin=f"{TASK}\ny\n", answers="n\n")
    assert run.returncode == 0 and "Traceback" not in run.stderr, (run.returncode, run.stderr)
    assert run.terminal.count(QUESTION) == 1 and "⚠  the model wants to run: echo a > a.out" in run.terminal
    assert NOBODY not in run.stderr
    assert not (workdir / "a.out").exists()  # the person said n; the piped y did not count
    assert tool_results(sent(chapter, provider.chat_requests[-1])) == {"a": REFUSED}


@each
def test_with_stderr_in_a_file_a_question_goes_to_the_terminal_its_answer_is_typed_at(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    command = "echo asked > asked.out"
    provider.script(bash_calls(a=command), text("Written."))
    log = workdir.parent / "err.log"
    with log.open("wb") as stderr:  # `python agent.py 2>err.log`: nobody watches the file
        terminal = resident(chapter, provider=provider, cwd=workdir, stderr=stderr)
    wait_until(lambda: "[one turn a line" in log.read_text(), "the banner in err.log")
    terminal.line(TASK)
    terminal.wait_for(QUESTION)  # on the old code the question went to err.log, and the turn waited for ever
    assert f"⚠  the model wants to run: {command}\n{QUESTION}" in terminal.text
    terminal.line("y")
    terminal.wait_for("Written.")
    terminal.line("/exit")
    assert terminal.wait_exit() == 0, terminal.text

    assert (workdir / "asked.out").read_text() == "asked\n"
    assert len(provider.chat_requests) == 2
    assert tool_results(sent(chapter, provider.chat_requests[1])) == {"a": SUCCEEDED}
    assert QUESTION not in log.read_text() and "Traceback" not in log.read_text()


# ---------------------------------------------------------------- the origin on disk only


@each
def test_the_origin_stays_on_disk_and_an_older_chapter_resumes_the_file(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    gate = Gate(workdir)
    provider.script(bash_calls(c1=gate.command), text("Done with it."), text("Queued one done."))
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line(TASK)
    terminal.wait_for("[round 1] bash(")
    terminal.line("Mind the tabs.")
    terminal.wait_for(STEER)
    terminal.line("/q Now the docs.")
    terminal.wait_for(QUEUED)
    gate.open()
    terminal.wait_for(STARTING_QUEUED)
    terminal.wait_prompt(2)
    shown = finish(terminal)

    requests = provider.chat_requests
    assert len(requests) == 3
    for request in provider.requests:
        assert b'"origin"' not in request["raw"]
        for message in request["body"]["messages"]:
            assert set(message) <= API_KEYS, message
    path = session_path(workdir, shown)
    origins = [origin for _, origin in said(path)]
    assert origins == [None, None, None, "steer", None, "queued", None]
    stored = [r["message"] for r in records(path) if r["type"] == "message"]
    assert requests[-1]["messages"] == stored[:-1]  # the same messages, without what is beside them

    # Chapter 23 reads the file, origins and all, and sends what it holds.
    before = path.read_bytes()
    provider.script(text("Resumed by chapter 23."))
    session_id = new_session_id(shown)
    again = run_agent(23, "-c", session_id, "Next step.", provider=provider, cwd=workdir)
    assert_ok(again, "Resumed by chapter 23.\n")
    assert provider.chat_requests[-1]["messages"] == [*stored, {"role": "user", "content": "Next step."}]
    assert [r["message"]["content"] for r in appended(before, path.read_bytes())] == [
        "Next step.",
        "Resumed by chapter 23.",
    ]
