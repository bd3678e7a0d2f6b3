"""Chapter 19: the first subagent (exercises/ex19/agent.py), and agent.py, which keeps it.

sub_agent(description, prompt) is one more tool. Its call runs a child agent
whose conversation starts with the session's system prompt and the prompt,
nothing else of the parent's; it has the tools registered before sub_agent
(never sub_agent itself) and a read-before-write record of its own. It makes
at most 6 requests with tools, then one more with none (the `tools` key left
out) after a user message asking what it found, and the answer is marked
"[incomplete: ...]"; so is an answer cut off by max_tokens. The parent's
history gains one tool message, the answer, capped at 16 KiB with a marker.
Each call of the child is shown on stderr as `[sub "desc" round N] name(args)`,
between a start and a finish line; its text is not printed. An empty prompt is
an error result, and no child request is made.

A child's conversation is a session file of its own,
.sessions/<parent ID>/<child ID>.jsonl, with "parent", "call" and
"description" in its header, written as the child goes; none of it goes into
the parent's file. The parent's calls are saved before they run and their
results after: a crash in between leaves calls without results, which a
resume answers with a stand-in "error:" result in memory only.

The programs run as subprocesses against the fake provider; each child's
replies are routed by its prompt (FakeProvider.route).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from conftest import run_agent
from fake_provider import FakeProvider, Reply, error, sequence_error, text, tool_call
from helpers import (
    Live,
    appended,
    assert_ok,
    bash_calls,
    calls,
    children,
    disk_messages,
    file_records,
    new_session_id,
    put_skill,
    requests_of,
    results,
    round_lines,
    session_file,
    shape,
    tool_names,
)

CHAPTER = 19
# What a child never has: the tools registered from sub_agent on (agent.py: chapter 28's terminal tools and the browser too).
PARENT_ONLY = ("sub_agent", "workflow", "terminal_output", "terminal_input", "terminal_kill", "browser")
both = pytest.mark.parametrize("chapter", [CHAPTER, "final"])
TASK = "Which of the notes in notes/ is about signing? Use a subagent to read them."
KEY = "notes/a.txt and notes/b.txt"  # in the child's prompt only: its replies are routed by it
PROMPT = f"Read {KEY}, and say which one is about signing releases."
DESCRIPTION = "read the notes"
ANSWER = "notes/b.txt is about signing: it says to sign every tag with the release key."
FINAL = "b.txt is the one about signing."
WRAP_UP = "You have no requests with tools left. Do not call tools: say what you found, and what is still open."
LIMIT = 6


def sub(call_id: str = "s1", prompt: str = PROMPT, description: str = DESCRIPTION) -> tuple[str, str, dict]:
    return (call_id, "sub_agent", {"description": description, "prompt": prompt})


def notes(workdir: Path) -> None:
    (workdir / "notes").mkdir()
    (workdir / "notes" / "a.txt").write_text("Deploy on Fridays only after the smoke test.\n")
    (workdir / "notes" / "b.txt").write_text("Sign every tag with the release key.\n")


def run(chapter: int | str, provider: FakeProvider, workdir: Path, *child: Reply, parent: Reply | None = None):
    """A new session whose model gives one sub_agent call (or `parent`), then FINAL; the
    child's replies are `child`."""
    provider.script(parent or calls(sub()), text(FINAL))
    provider.route(KEY, *child)
    result = run_agent(chapter, TASK, provider=provider, cwd=workdir)
    assert_ok(result, FINAL + "\n")  # the child's text is not printed: only the parent's answer
    return result


def reads() -> Reply:
    return calls(("r1", "read_file", {"path": "notes/a.txt"}), ("r2", "read_file", {"path": "notes/b.txt"}))


# ---------------------------------------------------------------- isolation


@both
def test_a_child_starts_with_the_system_prompt_and_its_prompt_and_has_no_sub_agent(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    notes(workdir)
    result = run(chapter, provider, workdir, reads(), text(ANSWER))
    parent, child = requests_of(provider, TASK), requests_of(provider, KEY)
    assert len(parent) == 2 and len(child) == 2 and len(provider.chat_requests) == 4
    system = parent[0]["messages"][0]
    assert system["role"] == "system"
    assert child[0]["messages"] == [system, {"role": "user", "content": PROMPT}]
    assert TASK not in json.dumps([body["messages"] for body in child])  # nothing of the parent's conversation

    assert "sub_agent" in tool_names(parent[0])
    for body in child:
        assert "sub_agent" not in tool_names(body)
        assert body["tools"] == [t for t in parent[0]["tools"] if t["function"]["name"] not in PARENT_ONLY]
    if chapter == CHAPTER:
        assert tool_names(child[0]) == ["read_file", "write_file", "edit_file", "bash"]

    # The child works with its tools: its second request has its reads' results.
    assert {m["tool_call_id"]: m["content"] for m in child[1]["messages"] if m["role"] == "tool"} == {
        "r1": "Deploy on Fridays only after the smoke test.\n",
        "r2": "Sign every tag with the release key.\n",
    }

    # The parent's next request is its first, plus the call and exactly one tool message: the answer.
    before, after = parent[0]["messages"], parent[1]["messages"]
    assert after[: len(before)] == before and len(after) == len(before) + 2
    assert [c["id"] for c in after[-2]["tool_calls"]] == ["s1"]
    assert after[-1] == {"role": "tool", "tool_call_id": "s1", "content": ANSWER}

    # What the user sees: the parent's call, the child's start, each of its calls, its finish.
    assert round_lines(result.stderr) == [f"[round 1] sub_agent({json.dumps(sub()[2])})"]
    label = f'[sub "{DESCRIPTION}"'
    mine = [line for line in result.stderr.splitlines() if line.startswith(label)]
    assert mine[0].startswith(f"{label} started") and mine[-1].startswith(f"{label} finished"), mine
    assert mine[1:-1] == [
        f'{label} round 1] read_file({{"path": "notes/a.txt"}})',
        f'{label} round 1] read_file({{"path": "notes/b.txt"}})',
    ]
    assert ANSWER not in result.stderr


@both
def test_a_child_has_a_read_before_write_record_of_its_own(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    (workdir / "a.txt").write_text("alpha\n")
    (workdir / "b.txt").write_text("beta\n")
    provider.script(
        calls(("p1", "read_file", {"path": "a.txt"})),
        calls(sub(prompt=f"Use {KEY}: rewrite a.txt and b.txt.")),
        calls(
            ("p2", "write_file", {"path": "b.txt", "content": "parent\n"}),
            ("p3", "write_file", {"path": "a.txt", "content": "parent\n"}),
        ),
        text(FINAL),
    )
    provider.route(
        KEY,
        calls(("c1", "write_file", {"path": "a.txt", "content": "child\n"})),
        calls(("c2", "read_file", {"path": "b.txt"})),
        calls(("c3", "write_file", {"path": "b.txt", "content": "child\n"})),
        text(ANSWER),
    )
    assert_ok(run_agent(chapter, TASK, provider=provider, cwd=workdir), FINAL + "\n")
    child = {m["tool_call_id"]: m["content"] for m in requests_of(provider, KEY)[-1]["messages"] if m["role"] == "tool"}
    parent = results(provider)
    # The parent's read does not count for the child, nor the child's for the parent.
    assert child["c1"].startswith("error:") and "read" in child["c1"], child["c1"]
    assert child["c3"].startswith("wrote"), child["c3"]
    assert parent["p2"].startswith("error:") and "read" in parent["p2"], parent["p2"]
    assert parent["p3"].startswith("wrote"), parent["p3"]
    assert (workdir / "a.txt").read_text() == "parent\n" and (workdir / "b.txt").read_text() == "child\n"


SKILL = """\
---
name: changelog
description: Adds an entry to CHANGELOG.md under Unreleased. Use it when a change has shipped.
---

Add one line under `## Unreleased`, in the past tense.
"""


@both
def test_a_child_of_a_session_that_lists_skills_has_the_skill_tool(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    put_skill(workdir, "changelog", SKILL)
    result = run(chapter, provider, workdir, calls(("k", "skill", {"name": "changelog"})), text(ANSWER))
    parent, child = requests_of(provider, TASK), requests_of(provider, KEY)
    assert "skill" in tool_names(parent[0]) and "skill" in tool_names(child[0])
    assert "sub_agent" not in tool_names(child[0])
    loaded = next(m["content"] for m in child[1]["messages"] if m["role"] == "tool")
    assert "Add one line under `## Unreleased`" in loaded
    ((header, _messages),) = children(workdir, new_session_id(result.stderr)).values()
    assert header["skills"] == ["changelog"]


# ---------------------------------------------------------------- the child's file, and the parent's


@both
def test_the_child_is_a_session_file_under_its_parent_and_the_parent_file_holds_none_of_it(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    notes(workdir)
    result = run(chapter, provider, workdir, reads(), text(ANSWER))
    parent_id = new_session_id(result.stderr)
    found = children(workdir, parent_id)
    assert list(found) == [DESCRIPTION]
    header, messages = found[DESCRIPTION]
    assert header["parent"] == parent_id and header["call"] == "s1" and header["description"] == DESCRIPTION
    directory = workdir / ".sessions" / parent_id
    path = directory / f"{header['id']}.jsonl"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(directory.stat().st_mode) == 0o700

    # The child's messages, exactly as it saw them, then its answer.
    last = requests_of(provider, KEY)[-1]["messages"]
    assert messages[: len(last)] == last and len(messages) == len(last) + 1
    assert messages[-1]["role"] == "assistant" and messages[-1]["content"] == ANSWER

    # The parent's file: its own conversation, one tool message for the whole child.
    stored = disk_messages(session_file(workdir, result.stderr))
    assert [shape(m) for m in stored] == [
        ("system", stored[0]["content"], None, ()),
        ("user", TASK, None, ()),
        ("assistant", None, None, ("s1",)),
        ("tool", "<result>", "s1", ()),
        ("assistant", FINAL, None, ()),
    ]
    assert stored[3]["content"] == ANSWER
    assert PROMPT not in json.dumps(stored[3:]) and '"r1"' not in json.dumps(stored)


@both
def test_the_child_file_is_written_as_it_goes_and_the_parent_call_is_saved_before_it_runs(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    notes(workdir)
    provider.script(calls(sub()), text(FINAL))
    provider.route(KEY, reads(), text(ANSWER, pause_after=1))
    with Live(chapter, TASK, provider=provider, cwd=workdir) as live:
        provider.wait_paused()  # the child's second request, its reads done
        live.wait_stderr("[new session ")
        live.wait_stderr("\n")
        parent_id = new_session_id(live.err.decode())
        parent_file = workdir / ".sessions" / f"{parent_id}.jsonl"
        stored = disk_messages(parent_file)
        assert [shape(m) for m in stored[1:]] == [("user", TASK, None, ()), ("assistant", None, None, ("s1",))]
        ((header, messages),) = children(workdir, parent_id).values()
        assert header["call"] == "s1"  # the call it names is on disk already
        assert [shape(m) for m in messages[1:]] == [
            ("user", PROMPT, None, ()),
            ("assistant", None, None, ("r1", "r2")),
            ("tool", "<result>", "r1", ()),
            ("tool", "<result>", "r2", ()),
        ]
        provider.release()
        code, out, err = live.finish()
    assert code == 0 and out == FINAL + "\n", err
    stored = disk_messages(parent_file)
    assert stored[3] == {"role": "tool", "tool_call_id": "s1", "content": ANSWER}  # right after its call


@both
def test_a_crash_while_a_child_runs_resumes_with_a_stand_in_result_in_memory_only(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    notes(workdir)
    provider.script(calls(sub()))
    provider.route(KEY, reads(), text(ANSWER, pause_after=1))
    with Live(chapter, TASK, provider=provider, cwd=workdir) as live:
        provider.wait_paused()
        live.kill()
        _code, _out, err = live.finish()
    parent_id = new_session_id(err)
    path = workdir / ".sessions" / f"{parent_id}.jsonl"
    stored, before = disk_messages(path), path.read_bytes()
    assert stored[-1]["tool_calls"][0]["id"] == "s1"  # a call the file leaves without a result
    ((header, did),) = children(workdir, parent_id).values()
    child_before = (workdir / ".sessions" / parent_id / f"{header['id']}.jsonl").read_bytes()
    assert [m["role"] for m in did] == ["system", "user", "assistant", "tool", "tool"]  # what it did stays

    provider.script(text("Resumed."))
    again = run_agent(chapter, "-c", parent_id, "Go on.", provider=provider, cwd=workdir)
    assert_ok(again, "Resumed.\n")
    sent = provider.chat_requests[-1]["messages"]
    assert sequence_error(sent) is None, sequence_error(sent)
    stand_in = sent[len(stored)]
    assert sent[: len(stored)] == stored and len(sent) == len(stored) + 2
    assert stand_in["role"] == "tool" and stand_in["tool_call_id"] == "s1"
    assert stand_in["content"].startswith("error:"), stand_in
    assert sent[-1] == {"role": "user", "content": "Go on."}
    assert ANSWER not in json.dumps(sent)  # the child is never replayed into the parent
    # On disk only what happened: the old bytes untouched, the stand-in nowhere.
    new = appended(before, path.read_bytes())
    assert [shape(r["message"]) for r in new] == [("user", "Go on.", None, ()), ("assistant", "Resumed.", None, ())]
    assert (workdir / ".sessions" / parent_id / f"{header['id']}.jsonl").read_bytes() == child_before


# ---------------------------------------------------------------- limits


@both
def test_a_child_that_keeps_calling_tools_gets_6_requests_with_tools_then_one_without(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    rounds = [bash_calls(**{f"b{n}": f"echo round {n}"}) for n in range(1, LIMIT + 1)]
    found = "I found rounds 1 to 6; what they mean is still open."
    result = run(chapter, provider, workdir, *rounds, text(found))
    child = requests_of(provider, KEY)
    assert len(child) == LIMIT + 1
    assert all("tools" in body for body in child[:LIMIT])
    last = child[-1]
    assert "tools" not in last, "the last request must offer no tools: the key left out"
    assert sequence_error(last["messages"]) is None
    asked = last["messages"][-1]
    assert asked["role"] == "user" and "found" in asked["content"]
    previous = child[-2]["messages"]  # then the 6th call and its result, then the question
    assert last["messages"][: len(previous)] == previous and len(last["messages"]) == len(previous) + 3
    assert [m["tool_call_id"] for m in last["messages"] if m["role"] == "tool"] == [f"b{n}" for n in range(1, 7)]
    if chapter == CHAPTER:
        assert asked["content"] == WRAP_UP
    answer = results(provider)["s1"]
    assert answer.startswith("[incomplete") and answer.endswith(found), answer
    label = f'[sub "{DESCRIPTION}" round'
    assert [line for line in result.stderr.splitlines() if line.startswith(label)] == [
        f'{label} {n}] bash({{"command": "echo round {n}"}})' for n in range(1, LIMIT + 1)
    ]


@both
def test_an_answer_cut_off_by_max_tokens_is_marked_incomplete(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    run(chapter, provider, workdir, text("notes/b.txt is about sign", finish="length"))
    answer = results(provider)["s1"]
    assert answer.startswith("[incomplete") and answer.endswith("notes/b.txt is about sign"), answer
    if chapter == CHAPTER:
        assert answer == "[incomplete: the answer was cut off by max_tokens]\n\nnotes/b.txt is about sign"


@both
def test_an_answer_over_16_kib_reaches_the_parent_cut_with_a_marker_and_whole_in_the_child_file(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    huge = "".join(f"line {n:05d} of the findings\n" for n in range(2000))  # 52,000 characters
    result = run(chapter, provider, workdir, text(huge))
    answer = results(provider)["s1"]
    kept = len(os.path.commonprefix([answer, huge]))
    assert 15_000 <= kept <= 16 * 1024 and len(answer) <= 16 * 1024 + 200, (kept, len(answer))
    marker = answer[kept:]
    assert "cut" in marker or "truncat" in marker, marker
    if chapter == CHAPTER:
        assert answer == huge[: 16 * 1024] + "\n[... the answer was cut here: it is longer than 16,384 characters ...]"
    ((_header, messages),) = children(workdir, new_session_id(result.stderr)).values()
    assert messages[-1]["content"] == huge  # the cap is the parent's: the child's file has it all


@both
def test_an_empty_or_missing_prompt_is_an_error_and_no_child_is_started(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    parent = calls(
        sub("e1", prompt=""),
        sub("e2", prompt="  \n\t"),
        ("e3", "sub_agent", {"description": "no prompt"}),
    )
    result = run(chapter, provider, workdir, parent=parent)
    assert len(provider.chat_requests) == 2, "no child request"
    got = results(provider)
    for call_id in ("e1", "e2", "e3"):
        assert got[call_id].startswith("error:") and "prompt" in got[call_id], got[call_id]
    assert not children(workdir, new_session_id(result.stderr))
    assert "started" not in result.stderr


@both
def test_a_child_whose_request_fails_is_an_error_result_and_the_parent_goes_on(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    run(chapter, provider, workdir, error(500, "Server Error"))
    answer = results(provider)["s1"]
    assert answer.startswith("error:") and "500" in answer, answer
    if chapter == CHAPTER:
        assert answer.startswith("error: the subagent failed: ")


@both
def test_two_children_one_after_the_other_each_name_their_call(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    other = "Count the lines of notes/a.txt."
    parent = [calls(sub("s1")), calls(sub("s2", prompt=other, description="count")), text(FINAL)]
    provider.script(*parent)
    provider.route(KEY, text(ANSWER))
    provider.route(other, tool_call("read_file", {"path": "notes/a.txt"}), text("One line."))
    notes(workdir)
    result = run_agent(chapter, TASK, provider=provider, cwd=workdir)
    assert_ok(result, FINAL + "\n")
    found = children(workdir, new_session_id(result.stderr))
    assert {name: header["call"] for name, (header, _) in found.items()} == {DESCRIPTION: "s1", "count": "s2"}
    assert found["count"][1][1] == {"role": "user", "content": other}
    assert results(provider) == {"s1": ANSWER, "s2": "One line."}


@both
def test_a_call_cut_off_by_max_tokens_is_saved_with_empty_arguments_before_anything_runs(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    """A call is saved before it runs (chapter 19); one cut off mid-arguments is never run, and goes to
    disk, and back to the server, as {}: half-written JSON is refused by strict servers. In the
    parent and in a child alike."""
    cut = Reply(tool_calls=[("cut", "write_file", '{"path": "x.txt", "content": "unfini')], finish="length")
    child_cut = Reply(tool_calls=[("ccut", "write_file", '{"path": "y.txt", "cont')], finish="length")
    provider.script(cut, calls(sub(prompt="Write y.txt")), text(FINAL))
    provider.route("Write y.txt", child_cut, text("could not"))
    result = run_agent(chapter, TASK, provider=provider, cwd=workdir)
    assert_ok(result, FINAL + "\n")
    assert not (workdir / "x.txt").exists() and not (workdir / "y.txt").exists()
    parent = disk_messages(session_file(workdir, result.stderr))
    child_file = next((workdir / ".sessions" / new_session_id(result.stderr)).glob("*.jsonl"))
    child = [r["message"] for r in file_records(child_file) if r["type"] == "message"]
    for messages, call_id in ((parent, "cut"), (child, "ccut")):
        [call] = [c for m in messages for c in m.get("tool_calls") or [] if c["id"] == call_id]
        assert call["function"]["arguments"] == "{}", call
    for request in provider.chat_requests:
        for message in request["messages"]:
            for call in message.get("tool_calls") or []:
                json.loads(call["function"]["arguments"])  # never half-written JSON
