"""Chapter 20: parallel fan-out and its limit (exercises/ex20/agent.py), and agent.py, which keeps it.

A batch of two or more calls that are all sub_agent runs its children on
threads, at most 4 at once, announced by `[round N fan-out: K sub_agent calls,
at most 4 at once]`; the results come back in the order of the calls, however
the children finish. A batch with any other call runs serially, as before.

The children's questions go through one broker: one at a time on the terminal,
each saying which child asks (`⚠  sub "desc" wants to run: ...`); only what is
typed after a question can answer it (keys typed ahead are discarded); with no
terminal every question is refused.

Ctrl-C (and SIGTERM, SIGHUP, SIGQUIT) during a fan-out stops every child at
once: a request it waits on is cut, its bash command's process group killed, a
question it waits for woken. The batch is answered, the children that finished
with their answers and the others "error: interrupted: ...", saved, and the
program exits 130. A kill -9 leaves the calls without results on disk: a
resume answers them in memory only, and each child's file keeps what it did.

The programs run as subprocesses against the fake provider, whose replies are
routed by each child's prompt; the concurrency is what the provider counts
(most_in_flight), the timing what it records as requests arrive.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from conftest import run_agent, wait_for_file
from fake_provider import FakeProvider, Reply, sequence_error, text
from helpers import (
    Live,
    alive,
    appended,
    assert_ok,
    bash_calls,
    calls,
    children,
    disk_messages,
    first_user,
    kill_quietly,
    new_session_id,
    record_arrivals,
    requests_of,
    results,
    round_lines,
    session_file,
    shape,
    wait_dead,
    wait_until,
)

CHAPTER = 20
both = pytest.mark.parametrize("chapter", [CHAPTER, "final"])
TASK = "For each project, one subagent: which README deprecates legacy_parse()?"
FINAL = "Only projB deprecates it."
QUESTION = "allow? (y/N)"
NOBODY = "(no answer from a terminal: refused)"
INTERRUPTED = "error: interrupted: the user stopped the run before this subagent finished"
RUN_REFUSED = "error: permission denied — the user did not approve this command"


def prompt(name: str) -> str:
    """A child's prompt; its replies are routed by `name`, which no other prompt holds."""
    return f"Look into {name} and say whether its README deprecates legacy_parse()."


def sub(name: str) -> tuple[str, str, dict]:
    """The call of the child `name`: its id and its description are the name."""
    return (name, "sub_agent", {"description": name, "prompt": prompt(name)})


def fan_out(*names: str) -> Reply:
    return calls(*(sub(name) for name in names))


def fan_out_line(count: int, round_number: int = 1) -> str:
    return f"[round {round_number} fan-out: {count} sub_agent calls, at most 4 at once]"


def child_results(provider: FakeProvider, name: str) -> dict[str, str]:
    """The tool results in the child's last request, by call id."""
    last = requests_of(provider, prompt(name))[-1]
    return {m["tool_call_id"]: m["content"] for m in last["messages"] if m["role"] == "tool"}


def parent_id_of(live: Live) -> str:
    live.wait_stderr("[new session ")
    live.wait_stderr("]\n")
    return new_session_id(live.err.decode())


def cut(name: str) -> str:
    """What a child the stop cut says: its request's socket shut, or no request made after its command was killed.
    A child left behind instead (a reply not started) says nothing."""
    return f'[sub "{name}" failed: interrupted'  # agent.py goes on: "interrupted: the run is stopping"


def finished_order(stderr: str) -> list[str]:
    return [line.split('"')[1] for line in stderr.splitlines() if line.startswith('[sub "') and " finished" in line]


# ---------------------------------------------------------------- order and limit


@both
def test_results_come_back_in_call_order_when_the_first_child_is_the_slowest(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    provider.script(fan_out("projA", "projB", "projC"), text(FINAL))
    provider.route("projA", text("projA: no.", delay=0.6))
    provider.route("projB", text("projB: yes, since 2.0.", delay=0.3))
    provider.route("projC", text("projC: never mentions it."))
    result = run_agent(chapter, TASK, provider=provider, cwd=workdir)
    assert_ok(result, FINAL + "\n")
    assert fan_out_line(3) in result.stderr.splitlines()
    assert finished_order(result.stderr) == ["projC", "projB", "projA"]  # they ran at once
    expected = [("projA", "projA: no."), ("projB", "projB: yes, since 2.0."), ("projC", "projC: never mentions it.")]
    last = provider.chat_requests[-1]["messages"]
    assert [(m["tool_call_id"], m["content"]) for m in last if m["role"] == "tool"] == expected
    stored = disk_messages(session_file(workdir, result.stderr))
    assert [(m["tool_call_id"], m["content"]) for m in stored if m["role"] == "tool"] == expected
    assert [shape(m)[0] for m in stored[2:]] == ["assistant", "tool", "tool", "tool", "assistant"]
    # Each child in a file of its own, naming its call.
    found = children(workdir, new_session_id(result.stderr))
    assert {name: header["call"] for name, (header, _) in found.items()} == {n: n for n in ("projA", "projB", "projC")}


@both
def test_eight_children_run_at_most_four_at_once(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    names = [f"proj{n}" for n in range(1, 9)]
    provider.script(fan_out(*names), text(FINAL))
    for n, name in enumerate(names):
        provider.route(name, text(f"{name} answered", delay=0.3 if n % 2 else 0.2))
    result = run_agent(chapter, TASK, provider=provider, cwd=workdir)
    assert_ok(result, FINAL + "\n")
    assert provider.most_in_flight == 4
    assert fan_out_line(8) in result.stderr.splitlines()
    assert list(results(provider).items()) == [(name, f"{name} answered") for name in names]


@both
def test_a_fan_out_takes_about_one_child_s_time_and_a_mixed_batch_runs_serially(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    (workdir / "a.txt").write_text("alpha\n")
    names = ["projA", "projB", "projC", "projD"]
    again = [(f"{name}-2", "sub_agent", arguments) for name, _, arguments in map(sub, names)]  # ids of their own
    mixed = calls(again[0], ("r", "read_file", {"path": "a.txt"}), *again[1:])
    provider.script(fan_out(*names), mixed, text(FINAL))
    for name in names:
        provider.route(name, text(f"{name}: first", delay=0.5), text(f"{name}: second", delay=0.5))
    arrivals = record_arrivals(provider)
    result = run_agent(chapter, TASK, provider=provider, cwd=workdir)
    assert_ok(result, FINAL + "\n")
    parents = [at for at, body in arrivals if first_user(body) == TASK]
    assert len(parents) == 3
    parallel, serial = parents[1] - parents[0], parents[2] - parents[1]
    assert 0.5 <= parallel < 1.6, parallel  # four children of 0.5 s at once, not one after the other
    assert serial >= 2.0 and parallel < serial / 2, (parallel, serial)

    # The mixed batch: no fan-out, each call in its order, each child after the one before.
    lines = result.stderr.splitlines()
    assert [line for line in lines if "fan-out" in line] == [fan_out_line(4)]
    second = round_lines(result.stderr)[-5:]
    assert [line.split("(")[0] for line in second] == ["[round 2] sub_agent", "[round 2] read_file"] + [
        "[round 2] sub_agent"
    ] * 3
    starts = [at for at, body in arrivals if at > parents[1] and first_user(body) != TASK]
    assert len(starts) == 4 and all(b - a >= 0.5 for a, b in zip(starts, starts[1:], strict=False)), starts
    last = provider.chat_requests[-1]["messages"]
    assert [(m["tool_call_id"], m["content"]) for m in last if m["role"] == "tool"][4:] == [
        ("projA-2", "projA: second"),
        ("r", "alpha\n"),
        *((f"{name}-2", f"{name}: second") for name in names[1:]),
    ]


# ---------------------------------------------------------------- questions through one broker


@both
def test_two_children_ask_one_at_a_time_each_labelled_and_each_answer_reaches_its_own_command(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    commands = {"projA": "echo from A > a.out", "projB": "echo from B > b.out"}
    provider.script(fan_out(*commands), text(FINAL))
    for name, command in commands.items():
        provider.route(name, bash_calls(run=command), text(f"{name} is done."))
    with Live(chapter, TASK, provider=provider, cwd=workdir, answers="", hang_up=False) as live:
        terminal = live.terminal
        terminal.wait_for(QUESTION)
        # Both children have their calls now: the second waits for the first question's answer.
        wait_until(
            lambda: all(requests_of(provider, prompt(name)) for name in commands) and provider.in_flight == 0,
            "both children had their replies",
        )
        with pytest.raises(TimeoutError):
            terminal.wait_for(QUESTION, count=2, timeout=0.3)
        first = next(name for name in commands if f'sub "{name}"' in terminal.text)
        terminal.type("y\n")
        terminal.wait_for(QUESTION, count=2)
        terminal.type("n\n")
        code, out, err = live.finish()
    assert code == 0 and out == FINAL + "\n", err
    second = next(name for name in commands if name != first)
    shown = terminal.text.split(QUESTION)
    assert len(shown) == 3, terminal.text  # two questions
    for asked, name in zip(shown[:2], (first, second), strict=True):
        other = next(n for n in commands if n != name)
        assert f'⚠  sub "{name}" wants to run: {commands[name]}' in asked, asked
        assert f'sub "{other}"' not in asked.split("⚠")[-1]
    assert shown[1].startswith(" y\n") and shown[2].startswith(" n\n"), terminal.text

    assert (workdir / f"{first[-1].lower()}.out").read_text() == f"from {first[-1]}\n"
    assert not (workdir / f"{second[-1].lower()}.out").exists()
    assert child_results(provider, first)["run"] == "(command succeeded with no output)"
    assert child_results(provider, second)["run"] == RUN_REFUSED
    assert results(provider) == {name: f"{name} is done." for name in commands}


@both
def test_keys_typed_before_a_question_do_not_answer_it(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    provider.script(fan_out("projA", "projB"), text(FINAL))
    provider.route(
        "projA",
        calls(("run", "bash", {"command": "echo typed ahead > ahead.out"}), pause_after=1),
        text("projA is done."),
    )
    provider.route("projB", text("projB is done."))
    with Live(chapter, TASK, provider=provider, cwd=workdir, answers="", hang_up=False) as live:
        provider.wait_paused()  # projA's call is on its way: no question yet
        live.terminal.type("y\n")
        live.terminal.wait_for("y\r\n")  # in the terminal's input, echoed
        provider.release()
        live.terminal.wait_for(QUESTION)
        live.terminal.type("n\n")  # the answer to the question: no
        code, out, err = live.finish()
    assert code == 0 and out == FINAL + "\n", err
    assert live.terminal.text.count(QUESTION) == 1
    assert not (workdir / "ahead.out").exists()
    assert child_results(provider, "projA")["run"] == RUN_REFUSED


@both
def test_with_no_terminal_every_child_s_question_is_refused(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    commands = {"projA": "echo A > a.out", "projB": "echo B > b.out", "projC": "echo C > c.out"}
    provider.script(fan_out(*commands), text(FINAL))
    for name, command in commands.items():
        provider.route(name, bash_calls(run=command), text(f"{name} is done."))
    result = run_agent(chapter, TASK, provider=provider, cwd=workdir, stdin="y\ny\ny\n")
    assert_ok(result, FINAL + "\n")
    assert result.stderr.count(NOBODY) == 3
    for name in commands:
        assert child_results(provider, name)["run"] == RUN_REFUSED
    assert not list(workdir.glob("*.out"))


# ---------------------------------------------------------------- stopping a fan-out


STOPS = [
    pytest.param("\x03", id="ctrl-c"),
    pytest.param(signal.SIGTERM, id="sigterm"),
    pytest.param(signal.SIGHUP, id="sighup"),
    pytest.param("\x1c", id="ctrl-backslash"),
]


@pytest.mark.parametrize("stop", STOPS)
@both
def test_a_stop_during_a_fan_out_stops_every_child_and_saves_the_batch(
    provider: FakeProvider, workdir: Path, chapter: int | str, stop: int | str
) -> None:
    sleeper = "echo $$ > sleep.pid && exec sleep 60"
    provider.script(fan_out("projA", "projB", "projC"))
    provider.route("projA", text("projA: no."))  # done before the stop
    provider.route("projB", bash_calls(run=sleeper), text("never asked for"))  # allowed, then running
    provider.route("projC", text("never sent", pause_after=1))  # its reply on its way
    pid = None
    with Live(chapter, TASK, provider=provider, cwd=workdir, answers="y\n", hang_up=False) as live:
        try:
            parent_id = parent_id_of(live)
            live.wait_stderr('[sub "projA" finished')
            pid = int(wait_for_file(workdir / "sleep.pid"))
            provider.wait_paused()
            assert alive(pid)
            sent = len(provider.chat_requests)
            if isinstance(stop, str):
                live.terminal.type(stop)
            else:
                live.signal(stop)
            code, _out, err = live.finish(timeout=30)
            assert wait_dead(pid), "the child's command outlived the stop"
        finally:
            kill_quietly(pid)
    assert code == 130 and "Traceback" not in err, (code, err)
    assert cut("projB") in err and cut("projC") in err, err  # both stopped, neither left to run on
    assert len(provider.chat_requests) == sent, "a child made a request after the stop"
    stored = disk_messages(workdir / ".sessions" / f"{parent_id}.jsonl")
    assert [shape(m) for m in stored[2:]] == [
        ("assistant", None, None, ("projA", "projB", "projC")),
        *(("tool", "<result>", name, ()) for name in ("projA", "projB", "projC")),
    ]
    assert stored[3]["content"] == "projA: no."
    for message in stored[4:]:
        assert message["content"].startswith("error: interrupted"), message
        if chapter == CHAPTER:
            assert message["content"] == INTERRUPTED


@both
def test_ctrl_c_wakes_a_child_waiting_for_an_answer(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    provider.script(fan_out("projA", "projB"))
    provider.route("projA", bash_calls(run="echo A > a.out"), text("never asked for"))
    provider.route("projB", text("never sent", pause_after=1))
    with Live(chapter, TASK, provider=provider, cwd=workdir, answers="", hang_up=False) as live:
        parent_id = parent_id_of(live)
        live.terminal.wait_for(QUESTION)
        provider.wait_paused()
        sent = len(provider.chat_requests)
        live.terminal.type("\x03")
        code, _out, err = live.finish(timeout=30)
    assert code == 130 and "Traceback" not in err, (code, err)
    assert cut("projA") in err and cut("projB") in err, err  # the question woken, the reply cut
    assert len(provider.chat_requests) == sent, "a child made a request after the stop"
    assert not (workdir / "a.out").exists()
    stored = disk_messages(workdir / ".sessions" / f"{parent_id}.jsonl")
    tools = [m for m in stored if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tools] == ["projA", "projB"]
    assert all(m["content"].startswith("error: interrupted") for m in tools), tools


@both
def test_a_child_whose_reply_has_not_started_does_not_hold_the_stop_for_long(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    provider.script(fan_out("projA", "projB"))
    provider.route("projA", text("projA: no."))
    provider.route("projB", text("never sent", delay=60))  # no byte of its reply yet: nothing to cut
    with Live(chapter, TASK, provider=provider, cwd=workdir) as live:
        parent_id = parent_id_of(live)
        live.wait_stderr('[sub "projA" finished')
        wait_until(lambda: requests_of(provider, prompt("projB")), "projB's request")
        live.signal(signal.SIGINT)
        code, _out, err = live.finish(timeout=30)  # the reply would start in 60 s: the child is left behind
    assert code == 130 and "Traceback" not in err, (code, err)
    # Chapters 20-23 leave it behind, saying nothing; from chapter 24 its request, opened on a
    # thread of its own (stoppable_call), is given up at once, and the child says so.
    assert (cut("projB") in err) == (chapter == "final"), err
    stored = disk_messages(workdir / ".sessions" / f"{parent_id}.jsonl")
    assert [(m["tool_call_id"], m["content"][:18]) for m in stored if m["role"] == "tool"] == [
        ("projA", "projA: no."),
        ("projB", "error: interrupted"),
    ]


@both
def test_a_kill_during_a_fan_out_resumes_with_stand_ins_and_the_children_keep_what_they_did(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    (workdir / "a.txt").write_text("alpha\n")
    provider.script(fan_out("projA", "projB", "projC"))
    provider.route("projA", text("projA: no."))
    provider.route("projB", calls(("rb", "read_file", {"path": "a.txt"})), text("never sent", pause_after=1))
    provider.route("projC", text("never sent", pause_after=1))
    with Live(chapter, TASK, provider=provider, cwd=workdir) as live:
        parent_id = parent_id_of(live)
        live.wait_stderr('[sub "projA" finished')
        wait_until(lambda: len(provider.chat_requests) == 5 and provider.in_flight == 2, "two children held")
        live.kill()
        live.finish()
    path = workdir / ".sessions" / f"{parent_id}.jsonl"
    stored, before = disk_messages(path), path.read_bytes()
    assert [shape(m) for m in stored[2:]] == [("assistant", None, None, ("projA", "projB", "projC"))]
    kept = {
        name: [shape(m) for m in messages[1:]] for name, (_header, messages) in children(workdir, parent_id).items()
    }
    assert kept == {
        "projA": [("user", prompt("projA"), None, ()), ("assistant", "projA: no.", None, ())],
        "projB": [
            ("user", prompt("projB"), None, ()),
            ("assistant", None, None, ("rb",)),
            ("tool", "<result>", "rb", ()),
        ],
        "projC": [("user", prompt("projC"), None, ())],
    }
    files = {p: p.read_bytes() for p in (workdir / ".sessions" / parent_id).iterdir()}

    provider.script(text("Resumed."))
    again = run_agent(chapter, "-c", parent_id, "Go on.", provider=provider, cwd=workdir)
    assert_ok(again, "Resumed.\n")
    sent = provider.chat_requests[-1]["messages"]
    assert sequence_error(sent) is None, sequence_error(sent)
    assert sent[: len(stored)] == stored and sent[-1] == {"role": "user", "content": "Go on."}
    stand_ins = sent[len(stored) : -1]
    assert [(m["role"], m["tool_call_id"]) for m in stand_ins] == [("tool", n) for n in ("projA", "projB", "projC")]
    assert all(m["content"].startswith("error:") for m in stand_ins), stand_ins
    assert "projA: no." not in json.dumps(sent)  # a child's answer never saved to the parent stays out
    new = appended(before, path.read_bytes())
    assert [shape(r["message"]) for r in new] == [("user", "Go on.", None, ()), ("assistant", "Resumed.", None, ())]
    assert {p: p.read_bytes() for p in (workdir / ".sessions" / parent_id).iterdir()} == files
