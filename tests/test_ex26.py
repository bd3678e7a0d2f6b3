"""Chapter 26: schedule_wakeup, the model wakes itself (exercises/ex26/agent.py).

In the resident conversation the model gets one more tool, schedule_wakeup(delay_seconds,
prompt, reason, repeat, cancel): "in N seconds, tell me X", once or every N seconds. When it
is due at the prompt the agent starts a turn by itself (`[wake-up due; starting a new
turn]`), whose user message is a `<system-reminder>` and then the prompt (origin `wakeup` in
its record); when it is due during a turn it goes in as a steer before the next request.
One wake-up at a time: a new one replaces the old, and a generation number drops the tick
of a replaced or cancelled one wherever it waits; a repeat re-arms before its tick is
handled and at most one tick waits; no delay outlives the loop's lifetime, and the last
tick says the lifetime ended. Ctrl-C at the prompt stops the loop and keeps the agent;
Ctrl-C in a turn cancels it. Each arm and cancel appends a `wakeup` record, and a resume
of a session whose last one is armed says that wake-up was dropped. One-shot runs and
subagents never get the tool.

The Waker class is checked in-process on the loaded chapter (module attributes such as
LIFETIME set by the test, real timers of a fraction of a second, the module's own EVENTS
queue read with bounded waits); everything else runs the real program at a pseudo-terminal
(tests/resident.py) with AGENT_TEST_WAKEUP_MIN_DELAY=1 where a test needs a short delay.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from resident import Resident

from conftest import run_agent
from fake_provider import FakeProvider, sequence_error, text
from helpers import (
    SESSION_ID,
    assert_ok,
    calls,
    file_records,
    header_line,
    hint,
    message_line,
    new_session_id,
    put_session,
    resumed,
    shape,
    tool_names,
    wait_until,
    warnings,
)

PROGRAMS = [26, 27, 30, "final"]
each = pytest.mark.parametrize("chapter", PROGRAMS)
units = pytest.mark.parametrize("loaded", PROGRAMS, indirect=True)

FAST = {"AGENT_TEST_WAKEUP_MIN_DELAY": "1"}  # delays of a second; the chapter's minimum is 5
SLOW = 10  # seconds the fake provider waits before a delayed reply nobody should see
DUE_IDLE = "[wake-up due; starting a new turn]"
DUE_IN_TURN = "[wake-up due while the turn runs; it goes in as a steer]"
CANCELLED = "[wake-up loop cancelled]"
STOPPED_AT_PROMPT = "[wake-up loop stopped; the agent is still here: Ctrl-C again or /exit to leave]"
KEPT = "[turn interrupted; the conversation is kept]"
DROPPED = "[a wake-up did not survive the last run and was dropped: "


# ---------------------------------------------------------------- helpers


def wakeup(call_id: str, **arguments: object) -> tuple[str, str, dict]:
    return (call_id, "schedule_wakeup", arguments)


def is_reminder(content: object, prompt: str) -> bool:
    """A wake-up's user message: a system reminder that it is due, then a blank line, then the prompt."""
    return (
        isinstance(content, str)
        and content.startswith("<system-reminder>")
        and "wake-up is due" in content.split("</system-reminder>")[0]
        and content.endswith("</system-reminder>\n\n" + prompt)
    )


def session_path(workdir: Path, shown: str) -> Path:
    return workdir / ".sessions" / f"{new_session_id(shown)}.jsonl"


def kinds(path: Path, kind: str) -> list[dict]:
    """The records of one type in a session file, read independently of the agent."""
    return [record for record in file_records(path) if record["type"] == kind]


def wakeup_records(path: Path) -> list[dict]:
    return [{key: r[key] for key in ("armed", "prompt", "reason")} for r in kinds(path, "wakeup")]


def tool_results(body: dict) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in body["messages"] if m["role"] == "tool"}


def quiet_for(provider: FakeProvider, terminal: Resident, seconds: float) -> None:
    """Absence has no event to wait for: nothing reaches the server for this long, the agent still runs."""
    before = len(provider.chat_requests)
    time.sleep(seconds)
    assert len(provider.chat_requests) == before, provider.chat_requests[before:]
    assert terminal.process.poll() is None, terminal.text


def tick(program: ModuleType, timeout: float = 30) -> tuple[int, str]:
    """The next event of the loaded program's queue, which must be a tick: (generation, prompt)."""
    kind, value = program.EVENTS.get(timeout=timeout)
    assert kind == "tick", (kind, value)
    return value


def no_event(program: ModuleType, seconds: float) -> None:
    with pytest.raises(queue.Empty):
        program.EVENTS.get(timeout=seconds)


def armed(waker: object) -> bool:
    """Whether a wake-up is pending: chapter 27 asks the Waker; 26 has no armed(), only its timer."""
    pending = waker.timer is not None
    if hasattr(waker, "armed"):
        assert waker.armed() is pending
    return pending


@pytest.fixture
def waker(loaded: ModuleType) -> Iterator[object]:
    """A fresh Waker of the loaded chapter, cancelled when the test ends (no timer outlives it)."""
    made = loaded.Waker()
    yield made
    made.cancel()


# ---------------------------------------------------------------- the Waker, in-process


@units
def test_arming_after_the_lifetime_has_passed_fails_stops_the_old_timer_and_ends_the_loop(
    loaded: ModuleType, waker: object
) -> None:
    assert waker.arm(0.2, "old", "r", True).startswith("scheduled in 0.2 s, repeating")
    assert armed(waker)
    waker.started = time.monotonic() - 31 * 60  # the loop began 31 minutes ago; its lifetime is 30
    result = waker.arm(0.1, "new", "r", False)
    assert result.startswith("error:") and "lifetime of 1800 s" in result, result
    assert not armed(waker)
    no_event(loaded, 0.6)  # neither the old repeat (every 0.2 s) nor the refused one
    # The loop has ended: arming again at once is refused too (the book's reset let a model go
    # on for ever, one refusal a lifetime); once the turn is over, a new loop gets its whole one.
    assert waker.arm(60, "again", "r", False).startswith("error:")
    waker.turn_ended()
    assert waker.started is None
    assert waker.arm(60, "again", "r", False) == "scheduled in 60 s; you may end this turn"


@units
def test_re_arming_replaces_the_timer_and_nothing_of_the_old_one_is_ever_due(loaded: ModuleType, waker: object) -> None:
    waker.arm(0.1, "old", "r", True)
    old = waker.timer
    waker.arm(0.3, "new", "r", False)
    assert waker.timer is not old and old.finished.is_set()  # cancelled, not left to run
    generation, prompt = tick(loaded)
    assert prompt == "new" and waker.due(generation)
    no_event(loaded, 0.5)  # the old repeat would have fired four times by now

    # The old timer fires while the replacement waits for the lock: whichever of the two gets
    # it first, no tick of the old generation counts, and the new one's does.
    waker.arm(0.05, "old again", "r", True)
    with waker.lock:
        replacing = threading.Thread(target=waker.arm, args=(0.2, "new again", "r", False))
        replacing.start()
        time.sleep(0.3)  # the old timer is due meanwhile: its thread waits for the lock too
    replacing.join(30)
    seen = []
    while not seen or seen[-1][1] != "new again":
        seen.append(tick(loaded))
    assert all(not waker.due(generation) for generation, prompt in seen[:-1]), seen
    assert all(prompt == "old again" for _, prompt in seen[:-1]), seen
    assert waker.due(seen[-1][0])
    no_event(loaded, 0.4)


@units
def test_nothing_fires_after_cancel_and_a_tick_queued_before_it_is_not_due(loaded: ModuleType, waker: object) -> None:
    waker.arm(0.1, "p", "r", True)
    generation, _ = tick(loaded)  # in the queue, not yet handled
    assert waker.cancel() is True
    assert not armed(waker)
    assert not waker.due(generation)
    no_event(loaded, 0.5)

    waker.arm(0.1, "q", "r", False)
    assert waker.cancel() is True  # before it fired
    no_event(loaded, 0.4)
    assert waker.cancel() is False  # nothing was pending


@units
def test_a_repeat_whose_ticks_nobody_handles_leaves_one_tick_waiting(loaded: ModuleType, waker: object) -> None:
    waker.arm(0.05, "p", "r", True)
    timers = [waker.timer]

    def rearmed() -> bool:  # each tick re-arms with a new timer before it is handled
        if waker.timer is not None and waker.timer is not timers[-1]:
            timers.append(waker.timer)
        return len(timers) >= 6

    wait_until(rearmed, "five ticks of the repeat")
    generation, prompt = loaded.EVENTS.get_nowait()[1]
    assert prompt == "p"
    assert loaded.EVENTS.empty()  # five ticks came, one waits
    assert waker.due(generation)
    assert tick(loaded)[1] == "p"  # handled: the next one is posted again


@units
def test_a_delay_is_clamped_to_what_is_left_of_the_lifetime(
    loaded: ModuleType, waker: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(loaded, "LIFETIME", 2)
    waker.started = time.monotonic() - 0.5  # 1.5 s left
    assert waker.arm(60, "p", "soon", False) == "scheduled in 1 s; you may end this turn"
    assert "[wake-up scheduled: in 1 s (soon)]" in capsys.readouterr().err
    assert waker.timer.interval == 1
    generation, prompt = tick(loaded)  # well before the 60 s asked for
    assert prompt == "p" and waker.due(generation)
    assert not armed(waker)


@units
def test_at_the_lifetime_s_end_the_last_tick_says_so_and_nothing_follows(
    loaded: ModuleType, waker: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(loaded, "LIFETIME", 2)
    waker.arm(0.3, "poll", "r", True)
    last = "poll\n\n(This was the last wake-up of this loop: it reached its lifetime of 2 s.)"
    prompts = []
    while not prompts or prompts[-1] == "poll":
        assert len(prompts) < 20, prompts
        generation, prompt = tick(loaded)
        assert waker.due(generation)
        prompts.append(prompt)
    assert prompts[-1] == last and len(prompts) >= 2, prompts
    assert not armed(waker)
    assert "[wake-up loop ended: it reached its lifetime of 2 s]" in capsys.readouterr().err
    no_event(loaded, 0.6)


@units
def test_turn_ended_resets_the_lifetime_once_a_one_shot_has_fired(
    loaded: ModuleType, waker: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loaded, "LIFETIME", 3)
    waker.arm(60, "p", "r", True)
    started = waker.started
    waker.turn_ended()  # a loop still armed keeps its lifetime
    assert waker.started == started
    waker.cancel()

    began = waker.started = time.monotonic() - 1.8  # 1.2 s left of this loop
    waker.arm(0.1, "once", "r", False)
    generation, prompt = tick(loaded)
    assert prompt == "once" and waker.due(generation)
    assert waker.started == began  # the fire alone does not reset it
    waker.turn_ended()
    assert waker.started is None
    scheduled = re.fullmatch(r"scheduled in (\d+) s; you may end this turn", waker.arm(60, "next", "r", False))
    assert scheduled and int(scheduled.group(1)) >= 2  # a whole new lifetime, not the 1 s the old one had left


# ---------------------------------------------------------------- wake-ups in the conversation


@each
def test_a_repeat_starts_turns_by_itself_until_the_model_cancels_it(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    prompt = "Check whether ready.txt exists yet."
    provider.script(
        calls(wakeup("arm", delay_seconds=1, prompt=prompt, reason="waiting for ready.txt", repeat=True)),
        text("I will look every second."),
        calls(("look1", "read_file", {"path": "ready.txt"})),
        text("Not there yet."),
        calls(("look2", "read_file", {"path": "ready.txt"})),
        calls(wakeup("stop", cancel=True)),
        text("ready.txt is there; I stopped the loop."),
    )
    terminal = resident(chapter, provider=provider, cwd=workdir, **FAST)
    terminal.wait_prompt(1)
    terminal.line("Tell me when ready.txt appears.")
    terminal.wait_for("[wake-up scheduled: every 1 s (waiting for ready.txt)]")
    terminal.wait_prompt(2)
    terminal.wait_for(DUE_IDLE)
    provider.wait_requests(4)  # the woken turn's second request, with the failed read: then the file comes
    (workdir / "ready.txt").write_text("ready\n")
    terminal.wait_for("ready.txt is there; I stopped the loop.")
    terminal.wait_for(CANCELLED)
    terminal.wait_prompt(4)
    quiet_for(provider, terminal, 3.5)  # three intervals of the cancelled repeat
    assert terminal.count(DUE_IDLE) == 2, terminal.text
    terminal.line("/exit")
    assert terminal.wait_exit() == 0, terminal.text
    assert "Traceback" not in terminal.text

    requests = provider.chat_requests
    assert len(requests) == 7
    assert tool_results(requests[1]) == {"arm": "scheduled in 1 s, repeating; you may end this turn"}
    for woken in (requests[2], requests[4]):  # each woken turn starts with the reminder, after the last answer
        assert sequence_error(woken["messages"]) is None
        assert woken["messages"][-2]["role"] == "assistant"
        assert woken["messages"][-1]["role"] == "user" and is_reminder(woken["messages"][-1]["content"], prompt)
    assert tool_results(requests[3])["look1"].startswith("error:")
    assert tool_results(requests[5])["look2"] == "ready\n"
    assert tool_results(requests[6])["stop"].startswith("cancelled")

    path = session_path(workdir, terminal.text)
    users = [
        (r.get("origin"), r["message"]["content"]) for r in kinds(path, "message") if r["message"]["role"] == "user"
    ]
    assert [origin for origin, _ in users] == [None, "wakeup", "wakeup"], users
    assert all(is_reminder(content, prompt) for _, content in users[1:])
    assert wakeup_records(path) == [
        {"armed": True, "prompt": prompt, "reason": "waiting for ready.txt"},
        {"armed": False, "prompt": "", "reason": "cancelled"},
    ]


@each
def test_a_one_shot_countdown_arms_once_per_woken_turn_and_stops_when_the_model_does(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    two, one = "Countdown: 2 to go.", "Countdown: 1 to go."
    provider.script(
        calls(wakeup("c3", delay_seconds=1, prompt=two, reason="countdown")),
        text("Counting down."),
        calls(wakeup("c2", delay_seconds=1, prompt=one, reason="countdown")),
        text("Two to go."),
        text("Countdown finished."),
    )
    terminal = resident(chapter, provider=provider, cwd=workdir, **FAST)
    terminal.wait_prompt(1)
    terminal.line("Count down with wake-ups.")
    terminal.wait_for("Countdown finished.")
    terminal.wait_prompt(4)
    quiet_for(provider, terminal, 2)  # two intervals: nothing was armed again
    assert terminal.count(DUE_IDLE) == 2 and terminal.count("[wake-up scheduled: in 1 s (countdown)]") == 2
    terminal.line("/exit")
    assert terminal.wait_exit() == 0, terminal.text

    requests = provider.chat_requests
    assert len(requests) == 5
    assert tool_results(requests[1]) == {"c3": "scheduled in 1 s; you may end this turn"}
    assert is_reminder(requests[2]["messages"][-1]["content"], two)
    assert is_reminder(requests[4]["messages"][-1]["content"], one)
    path = session_path(workdir, terminal.text)
    assert [r.get("origin") for r in kinds(path, "message") if r["message"]["role"] == "user"] == [
        None,
        "wakeup",
        "wakeup",
    ]
    # Armed, then disarmed by its own fire, twice: the last record says nothing is pending.
    assert wakeup_records(path) == [
        {"armed": True, "prompt": two, "reason": "countdown"},
        {"armed": False, "prompt": two, "reason": "countdown"},
        {"armed": True, "prompt": one, "reason": "countdown"},
        {"armed": False, "prompt": one, "reason": "countdown"},
    ]


@each
def test_a_wake_up_due_during_a_slow_turn_goes_in_as_a_steer_before_the_next_request(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    """Every 2 s; the turn's second request takes 3 s: the first tick comes during it, and the
    turn's third request (about 3 s in) carries it; the model cancels before the next (4 s)."""
    (workdir / "notes.txt").write_text("build started\n")
    prompt = "Poll the build."
    provider.script(
        calls(wakeup("arm", delay_seconds=2, prompt=prompt, reason="build watch", repeat=True)),
        calls(("slow", "read_file", {"path": "notes.txt"}), delay=3),
        calls(wakeup("stop", cancel=True)),
        text("The build is still running; loop stopped."),
    )
    terminal = resident(chapter, provider=provider, cwd=workdir, **FAST)
    terminal.wait_prompt(1)
    terminal.line("Watch the build while you read the notes.")
    terminal.wait_for(DUE_IN_TURN)
    terminal.wait_for("[steer entered this turn: 1]")
    terminal.wait_for("The build is still running; loop stopped.")
    terminal.wait_prompt(2)
    shown = terminal.text
    assert shown.index(DUE_IN_TURN) < shown.index("[steer entered this turn: 1]") < shown.index(CANCELLED), shown
    assert DUE_IDLE not in shown and "arrived late" not in shown, shown
    assert terminal.count(DUE_IN_TURN) == 1, shown

    requests = provider.chat_requests
    assert len(requests) == 4  # one turn, no turn of the wake-up's own
    third = requests[2]["messages"]
    assert sequence_error(third) is None
    assert [m["role"] for m in third[-3:]] == ["assistant", "tool", "user"], third[-3:]
    assert third[-2]["tool_call_id"] == "slow" and third[-2]["content"] == "build started\n"
    assert is_reminder(third[-1]["content"], prompt)
    path = session_path(workdir, terminal.text)
    woken = [r for r in kinds(path, "message") if r.get("origin") == "wakeup"]
    assert len(woken) == 1 and is_reminder(woken[0]["message"]["content"], prompt)
    terminal.line("/exit")
    assert terminal.wait_exit() == 0, terminal.text


def reminders(body: dict) -> list[str]:
    """The wake-up reminders among a request's user messages."""
    return [
        m["content"] for m in body["messages"] if m["role"] == "user" and m["content"].startswith("<system-reminder>")
    ]


@each
def test_ticks_that_fall_due_during_one_long_request_reach_the_next_one_once(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    """Every second, in a loop of 3 s; the turn's second request is held until the loop's last tick
    has fallen due (two or three ticks inside it, and none after): the next request has one reminder,
    the newest, which tells the model that the loop has ended."""
    (workdir / "notes.txt").write_text("build started\n")
    prompt = "Poll the build."
    provider.script(
        calls(wakeup("arm", delay_seconds=1, prompt=prompt, reason="build watch", repeat=True)),
        calls(("slow", "read_file", {"path": "notes.txt"}), pause_after=0),
        text("Still building."),
    )
    terminal = resident(chapter, provider=provider, cwd=workdir, AGENT_TEST_WAKEUP_LIFETIME="3", **FAST)
    terminal.wait_prompt(1)
    terminal.line("Watch the build while you read the notes.")
    provider.wait_paused()
    terminal.wait_for("[wake-up loop ended: it reached its lifetime of 3 s]")
    provider.release()
    terminal.wait_for("Still building.")
    terminal.wait_prompt(2)

    requests = provider.chat_requests
    assert len(requests) == 3, terminal.text
    third = reminders(requests[2])
    last = f"{prompt}\n\n(This was the last wake-up of this loop: it reached its lifetime of 3 s.)"
    assert len(third) == 1 and is_reminder(third[0], last), third
    assert tool_results(requests[2])["slow"] == "build started\n"
    assert terminal.count(DUE_IN_TURN) >= 2 and "[steer entered this turn: 1]" in terminal.text, terminal.text
    terminal.line("/exit")
    assert terminal.wait_exit() == 0, terminal.text


@each
def test_a_tick_that_fell_due_before_the_model_cancelled_its_loop_never_reaches_it(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    """Every second; the turn's second request is held until a tick has fallen due inside it, and
    its reply cancels the loop: the tick that waits for the next request goes with the loop."""
    provider.script(
        calls(wakeup("arm", delay_seconds=1, prompt="Poll the build.", reason="build watch", repeat=True)),
        calls(wakeup("stop", cancel=True), pause_after=0),
        text("Loop stopped."),
    )
    terminal = resident(chapter, provider=provider, cwd=workdir, **FAST)
    terminal.wait_prompt(1)
    terminal.line("Watch the build, then stop.")
    provider.wait_paused()
    terminal.wait_for(DUE_IN_TURN)  # it waits in the inbox for the request after the held one
    provider.release()
    terminal.wait_for("Loop stopped.")
    terminal.wait_prompt(2)

    requests = provider.chat_requests
    assert len(requests) == 3, terminal.text  # no turn of the wake-up's own after the cancel either
    assert tool_results(requests[2])["stop"].startswith("cancelled")
    assert reminders(requests[2]) == []
    assert "[steer entered this turn" not in terminal.text and "arrived late" not in terminal.text, terminal.text
    path = session_path(workdir, terminal.text)
    assert not [r for r in kinds(path, "message") if r.get("origin") == "wakeup"]
    terminal.line("/exit")
    assert terminal.wait_exit() == 0, terminal.text


@each
def test_ctrl_c_at_the_prompt_stops_the_loop_keeps_the_agent_and_a_second_one_ends_it(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    provider.script(
        calls(wakeup("arm", delay_seconds=30, prompt="Check the queue.", reason="queue watch", repeat=True)),
        text("Watching the queue."),
    )
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line("Watch the queue every half minute.")
    terminal.wait_for("[wake-up scheduled: every 30 s (queue watch)]")
    terminal.wait_prompt(2)
    terminal.type("\x03")  # the moment the prompt shows: readline's start is no blind spot
    terminal.wait_for(STOPPED_AT_PROMPT)
    terminal.wait_prompt(3)
    path = session_path(workdir, terminal.text)
    assert wakeup_records(path)[-1] == {"armed": False, "prompt": "", "reason": "cancelled"}
    quiet_for(provider, terminal, 2)
    assert len(provider.chat_requests) == 2

    assert terminal.interrupt_to_exit() == 130, terminal.text
    tail = terminal.text.rsplit(STOPPED_AT_PROMPT, 1)[1]
    assert "interrupted" in tail and tail.endswith(hint(new_session_id(terminal.text)) + "\n"), tail
    assert "Traceback" not in terminal.text


@each
def test_ctrl_c_during_a_turn_cancels_the_armed_wake_up(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    provider.script(
        calls(wakeup("arm", delay_seconds=1, prompt="Ping.", reason="ping", repeat=True)),
        text("too late", delay=SLOW),
    )
    terminal = resident(chapter, provider=provider, cwd=workdir, **FAST)
    terminal.wait_prompt(1)
    terminal.line("Ping me every second, then think for long.")
    provider.wait_requests(2)
    terminal.type("\x03")
    terminal.wait_for(CANCELLED)
    terminal.wait_prompt(2)
    assert KEPT in terminal.text, terminal.text
    quiet_for(provider, terminal, 2.5)  # the repeat would have ticked twice
    assert DUE_IDLE not in terminal.text, terminal.text
    path = session_path(workdir, terminal.text)
    assert wakeup_records(path)[-1] == {"armed": False, "prompt": "", "reason": "cancelled"}
    assert not [r for r in kinds(path, "message") if r.get("origin") == "wakeup"]
    terminal.line("/exit")
    assert terminal.wait_exit() == 0, terminal.text


@each
def test_bad_arguments_are_error_results_and_a_short_delay_is_raised_to_the_minimum(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    provider.script(
        calls(
            wakeup("empty", delay_seconds=10, prompt="  ", reason="nothing to say"),
            wakeup("missing", delay_seconds=10),
            wakeup("half", delay_seconds=2.5, prompt="Look again.", reason="a float"),
            wakeup("string", delay_seconds="10", prompt="Look again.", reason="a string"),
            wakeup("bool", delay_seconds=True, prompt="Look again.", reason="a boolean"),
            wakeup("short", delay_seconds=1, prompt="Look again.", reason="a quick look"),
        ),
        text("Scheduled."),
    )
    terminal = resident(chapter, provider=provider, cwd=workdir)  # the chapter's own minimum: 5 s
    terminal.wait_prompt(1)
    terminal.line("Look again in a second.")
    terminal.wait_for("Scheduled.")
    terminal.wait_prompt(2)
    results = tool_results(provider.chat_requests[1])
    for call_id in ("empty", "missing", "half", "string", "bool"):
        assert results[call_id].startswith("error:"), (call_id, results[call_id])
    assert "prompt" in results["empty"] and "prompt" in results["missing"]
    assert all("delay_seconds" in results[call_id] for call_id in ("half", "string", "bool")), results
    assert results["short"] == "scheduled in 5 s; you may end this turn"
    assert terminal.count("[wake-up scheduled:") == 1
    assert "[wake-up scheduled: in 5 s (a quick look)]" in terminal.text
    path = session_path(workdir, terminal.text)
    assert wakeup_records(path) == [{"armed": True, "prompt": "Look again.", "reason": "a quick look"}]
    terminal.line("/exit")  # before the 5 s are up
    assert terminal.wait_exit() == 0, terminal.text
    assert DUE_IDLE not in terminal.text


@each
def test_a_one_shot_run_does_not_offer_schedule_wakeup(provider: FakeProvider, workdir: Path, chapter: int) -> None:
    provider.script(text("Hello."))
    assert_ok(run_agent(chapter, "Say hello.", provider=provider, cwd=workdir), "Hello.\n")
    (body,) = provider.chat_requests
    assert "read_file" in tool_names(body) and "schedule_wakeup" not in tool_names(body)


@each
def test_a_subagent_is_not_offered_schedule_wakeup_its_parent_is(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    provider.route("project-x", text("Nothing in project-x."))
    provider.script(
        calls(("kid", "sub_agent", {"description": "scout", "prompt": "Scout project-x and report."})),
        text("The scout reported."),
    )
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line("Send a scout.")
    terminal.wait_for("The scout reported.")
    terminal.wait_prompt(2)
    parent = [body for body in provider.chat_requests if "project-x" not in body["messages"][1]["content"]]
    child = [body for body in provider.chat_requests if "project-x" in body["messages"][1]["content"]]
    assert len(parent) == 2 and len(child) == 1
    assert all("schedule_wakeup" in tool_names(body) for body in parent)
    assert "read_file" in tool_names(child[0]) and "schedule_wakeup" not in tool_names(child[0])
    assert tool_results(parent[1]) == {"kid": "Nothing in project-x."}
    terminal.line("/exit")
    assert terminal.wait_exit() == 0, terminal.text


# ---------------------------------------------------------------- wake-up records and a resume


@each
def test_after_a_kill_9_with_a_wake_up_armed_a_resume_says_it_was_dropped(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    provider.script(
        calls(wakeup("arm", delay_seconds=30, prompt="Is the deploy done?", reason="watch the deploy", repeat=True)),
        text("Armed."),
    )
    terminal = resident(chapter, provider=provider, cwd=workdir)
    terminal.wait_prompt(1)
    terminal.line("Watch the deploy.")
    terminal.wait_prompt(2)
    os.kill(terminal.process.pid, signal.SIGKILL)
    assert terminal.wait_exit(30) == -signal.SIGKILL
    session_id = new_session_id(terminal.text)
    path = session_path(workdir, terminal.text)
    assert wakeup_records(path)[-1]["armed"] is True

    provider.script(text("Nothing new."))
    result = run_agent(chapter, "-c", session_id, "Anything new?", provider=provider, cwd=workdir)
    assert_ok(result, "Nothing new.\n")
    assert DROPPED + "watch the deploy]" in result.stderr.splitlines(), result.stderr
    assert resumed(result.stderr)[0] == session_id
    users = [m["content"] for m in provider.chat_requests[-1]["messages"] if m["role"] == "user"]
    assert users == ["Watch the deploy.", "Anything new?"]


def by_hand(*wakeups: dict) -> bytes:
    """A session file written by hand: a short exchange, then these wakeup records."""
    return (
        header_line()
        + message_line({"role": "system", "content": "You are a coding agent."})
        + message_line({"role": "user", "content": "Watch it."})
        + message_line({"role": "assistant", "content": "Watching."})
        + b"".join(json.dumps({"type": "wakeup", **record}).encode() + b"\n" for record in wakeups)
    )


ARMED = {"armed": True, "prompt": "Is it done?", "reason": "the nightly job"}


@each
@pytest.mark.parametrize(
    ("records", "shown"),
    [
        ([ARMED], DROPPED + "the nightly job]"),
        ([{**ARMED, "reason": ""}], DROPPED + "Is it done?]"),  # no reason: the prompt says which
        ([ARMED, {"armed": False, "prompt": "", "reason": "cancelled"}], None),
        ([ARMED, {**ARMED, "armed": False}], None),  # a one-shot that fired: nothing was pending
    ],
    ids=["armed", "armed_without_reason", "cancelled", "fired"],
)
def test_a_resume_reports_a_dropped_wake_up_only_if_the_last_record_is_armed(
    provider: FakeProvider, workdir: Path, chapter: int | str, records: list[dict], shown: str | None
) -> None:
    put_session(workdir, by_hand(*records))
    provider.script(text("Still here."))
    result = run_agent(chapter, "-c", SESSION_ID, "Go on.", provider=provider, cwd=workdir)
    assert_ok(result, "Still here.\n")
    assert resumed(result.stderr) == (SESSION_ID, 3)
    dropped = [line for line in result.stderr.splitlines() if line.startswith(DROPPED)]
    assert dropped == ([shown] if shown else []), result.stderr


@each
def test_a_damaged_wakeup_line_is_reported_by_number_and_the_session_resumes(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    earlier = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Watch it."},
        {"role": "assistant", "content": "Watching."},
    ]
    later = [{"role": "user", "content": "Still?"}, {"role": "assistant", "content": "Still watching."}]
    damaged = b'{"type": "wakeup", "armed": true, "prompt": "Is it do\n'  # line 5: cut, then a newline
    data = header_line() + b"".join(map(message_line, earlier)) + damaged + b"".join(map(message_line, later))
    path = put_session(workdir, data)
    provider.script(text("Yes."))
    result = run_agent(chapter, "-c", SESSION_ID, "And now?", provider=provider, cwd=workdir)
    assert_ok(result, "Yes.\n")
    assert warnings(result.stderr) == [
        f"warning: skipped damaged line(s) 5 of {SESSION_ID}.jsonl; they stay in the file"
    ], result.stderr
    assert DROPPED not in result.stderr
    assert resumed(result.stderr) == (SESSION_ID, 5)
    question = {"role": "user", "content": "And now?"}
    assert [shape(m) for m in provider.chat_requests[0]["messages"]] == [shape(m) for m in [*earlier, *later, question]]
    assert path.read_bytes().startswith(data)  # the damaged line stays


@each
def test_chapter_25_still_resumes_a_session_holding_wakeup_records(
    provider: FakeProvider, workdir: Path, resident: Callable[..., Resident], chapter: int | str
) -> None:
    provider.script(
        calls(wakeup("arm", delay_seconds=30, prompt="Check the mail.", reason="mail", repeat=True)),
        text("I will check."),
        calls(wakeup("stop", cancel=True)),
        text("Stopped."),
        calls(wakeup("again", delay_seconds=30, prompt="Check the mail.", reason="mail")),
        text("Once more, then."),
    )
    terminal = resident(chapter, provider=provider, cwd=workdir)
    for number, line in enumerate(["Check the mail every half minute.", "Stop that.", "Check once."], 1):
        terminal.wait_prompt(number)
        terminal.line(line)
    terminal.wait_prompt(4)
    terminal.line("/exit")
    assert terminal.wait_exit() == 0, terminal.text
    session_id = new_session_id(terminal.text)
    path = session_path(workdir, terminal.text)
    assert [r["armed"] for r in kinds(path, "wakeup")] == [True, False, True]
    stored = [r["message"] for r in kinds(path, "message")]

    provider.script(text("No new mail."))
    result = run_agent(25, "-c", session_id, "Any mail?", provider=provider, cwd=workdir)
    assert_ok(result, "No new mail.\n")  # it may warn about lines it does not know, no more
    assert all(line.startswith("warning: skipped damaged line(s)") for line in warnings(result.stderr)), result.stderr
    assert resumed(result.stderr) == (session_id, len(stored))
    question = {"role": "user", "content": "Any mail?"}
    assert [shape(m) for m in provider.chat_requests[-1]["messages"]] == [shape(m) for m in [*stored, question]]
