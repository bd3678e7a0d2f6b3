"""Chapter 21: orchestration by code, the workflow tool (exercises/ex21/agent.py), and agent.py,
which keeps it.

workflow(stages) runs a plan the model writes whole: a non-empty array of at
most 4 stages, each a non-empty array of at most 8 non-empty strings. The plan
is checked whole before any of it runs: a bad one is an error result ending
with a hint of the shape, and no child is started. The stages run in order,
the prompts of a stage in parallel (at most 4 at once), each a subagent with
neither sub_agent nor workflow among its tools. In a later stage's prompt,
{{results}} is replaced by the previous stage's results, in plan order, each
fenced between tags holding a random word, saying where it came from and
whether it failed (an "error:" result), each cut at 4 KiB. A later stage
without {{results}}, or a first stage with it, is warned about. Only the last
stage's result goes back to the model: a single prompt's answer as it is,
several fenced; capped at 16 KiB.

The programs run as subprocesses against the fake provider; each child's
replies are routed by a word of its prompt, and the timing is what the provider
records as requests arrive.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from conftest import run_agent
from fake_provider import FakeProvider, Reply, error, text
from helpers import (
    Live,
    assert_ok,
    calls,
    children,
    disk_messages,
    first_user,
    new_session_id,
    record_arrivals,
    requests_of,
    results,
    tool_names,
)

CHAPTER = 21
both = pytest.mark.parametrize("chapter", [CHAPTER, "final"])
TASK = "Use a workflow: one subtask per project, then a summary of which deprecates legacy_parse()"
FINAL = "Only projB deprecates it."
SHAPE = 'the shape is {"stages": [["prompt", "prompt"], ["prompt using {{results}}"]]}: an array of arrays of strings'
INTERRUPTED = "error: interrupted: the user stopped the run before this subagent finished"
FENCE = re.compile(r'<(result-\w+) from="stage (\d+), subtask (\d+)" status="(ok|failed)">\n(.*?)\n</\1>', re.DOTALL)


def look(name: str) -> str:
    """A stage-1 prompt, routed by f"{name}/README.md"."""
    return f"Look into {name}/README.md: does it deprecate legacy_parse()?"


def run(chapter: int | str, provider: FakeProvider, workdir: Path, stages: list, routes: dict[str, Reply]):
    """A new session whose model calls workflow(stages) once (call id "w"), then says FINAL;
    routes: the reply of the child whose prompt holds each key (no answer may hold a key)."""
    provider.script(calls(("w", "workflow", {"stages": stages})), text(FINAL))
    for key, reply in routes.items():
        provider.route(key, reply)
    result = run_agent(chapter, TASK, provider=provider, cwd=workdir)
    assert_ok(result, FINAL + "\n")
    return result


def fences(prompt: str) -> list[tuple[str, str, str, str]]:
    """(stage, subtask, status, text) of each fenced result in a prompt; all between one tag."""
    found = FENCE.findall(prompt)
    assert len({tag for tag, *_ in found}) <= 1, "the results of one stage are fenced by one tag"
    return [tuple(rest) for _tag, *rest in found]


# ---------------------------------------------------------------- a plan that runs


@both
def test_stage_two_gets_stage_one_s_results_fenced_in_plan_order_after_the_last_of_them(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    compare = "Compare these findings and name the project that deprecates it: {{results}}"
    stages = [[look("projA"), look("projB")], [compare]]
    arrivals = record_arrivals(provider)
    result = run(
        chapter,
        provider,
        workdir,
        stages,
        {
            "projA/README.md": text("projA: no, it still uses it.", delay=0.5),  # the first is the slowest
            "projB/README.md": text("projB: yes, since 2.0.", delay=0.1),
            "Compare these": text("projB deprecates it; projA does not."),
        },
    )
    assert not [line for line in result.stderr.splitlines() if line.startswith("warning:")], result.stderr

    # Stage 2's prompt: stage 1's results in plan order, fenced, each saying where it came from.
    (summary,) = requests_of(provider, "Compare these")
    prompt = first_user(summary)
    before, _, after = compare.partition("{{results}}")
    assert prompt.startswith(before) and prompt.endswith(after)
    assert fences(prompt) == [
        ("1", "1", "ok", "projA: no, it still uses it."),
        ("1", "2", "ok", "projB: yes, since 2.0."),
    ]
    tag = FENCE.search(prompt).group(1)
    assert tag != "result-" and tag not in json.dumps([look("projA"), look("projB")])
    if chapter == CHAPTER:
        assert re.fullmatch(r"result-[0-9a-f]{8}", tag)

    # Stage 1 in parallel; stage 2 only after the last of its replies, which took 0.5 s.
    at = {key: next(t for t, body in arrivals if look(key) == first_user(body)) for key in ("projA", "projB")}
    stage_2 = next(t for t, body in arrivals if "Compare these" in (first_user(body) or ""))
    assert at["projB"] - at["projA"] < 0.5 and at["projA"] - at["projB"] < 0.5  # neither waited for the other
    assert stage_2 - at["projA"] >= 0.5

    # Only the last stage's answer reaches the model, as it is.
    assert results(provider) == {"w": "projB deprecates it; projA does not."}
    parent = json.dumps(requests_of(provider, TASK))
    assert "projA: no" not in parent and "since 2.0" not in parent

    # The children: neither sub_agent nor workflow; a file each, naming the workflow's call.
    assert "workflow" in tool_names(provider.chat_requests[0]) and "sub_agent" in tool_names(provider.chat_requests[0])
    for body in provider.chat_requests:
        if first_user(body) != TASK:
            assert not {"sub_agent", "workflow"} & set(tool_names(body)), tool_names(body)
            assert len(body["messages"]) == 2 and body["messages"][0] == provider.chat_requests[0]["messages"][0]
    found = children(workdir, new_session_id(result.stderr))
    assert sorted(found) == ["stage 1, subtask 1", "stage 1, subtask 2", "stage 2, subtask 1"]
    assert all(header["call"] == "w" for header, _ in found.values())
    assert found["stage 2, subtask 1"][1][1] == {"role": "user", "content": prompt}


@both
def test_a_failed_subtask_is_marked_failed_and_several_last_prompts_come_back_fenced(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    stages = [[look("projA"), look("projB")], ["Report on A: {{results}}", "Report on B: {{results}}"]]
    run(
        chapter,
        provider,
        workdir,
        stages,
        {
            "projA/README.md": text("projA: no."),
            "projB/README.md": error(500, "Server Error"),
            "Report on A": text("A is fine."),
            "Report on B": text("B could not be checked."),
        },
    )
    for key in ("Report on A", "Report on B"):
        (body,) = requests_of(provider, key)
        (ok, failed) = fences(first_user(body))
        assert ok == ("1", "1", "ok", "projA: no.")
        assert failed[:3] == ("1", "2", "failed") and failed[3].startswith("error:") and "500" in failed[3]
    answer = results(provider)["w"]
    assert fences(answer) == [("2", "1", "ok", "A is fine."), ("2", "2", "ok", "B could not be checked.")]
    assert "projA: no." not in answer  # only the last stage


@both
def test_each_result_a_stage_is_given_is_cut_at_4_kib_and_the_workflow_s_at_16_kib(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    big = "".join(f"finding {n:05d}\n" for n in range(1000))  # 14,000 characters
    huge = "".join(f"conclusion {n:05d}\n" for n in range(3000))  # 51,000 characters
    stages = [[look("projA")], ["Conclude from {{results}}"]]
    run(chapter, provider, workdir, stages, {"projA/README.md": text(big), "Conclude from": text(huge)})
    ((_stage, _subtask, status, given),) = fences(first_user(requests_of(provider, "Conclude from")[0]))
    kept = len(os.path.commonprefix([given, big]))
    assert status == "ok" and 3_000 <= kept <= 4 * 1024 and len(given) <= 4 * 1024 + 200, (kept, len(given))
    assert given[kept:].strip(), "no marker where it was cut"
    if chapter == CHAPTER:
        assert given == big[: 4 * 1024] + "\n[... cut: longer than 4,096 characters ...]"
    answer = results(provider)["w"]
    kept = len(os.path.commonprefix([answer, huge]))
    assert 15_000 <= kept <= 16 * 1024 and len(answer) <= 16 * 1024 + 200, (kept, len(answer))
    assert answer[kept:].strip(), "no marker where it was cut"
    if chapter == CHAPTER:
        assert answer == huge[: 16 * 1024] + "\n[... the result was cut here: it is longer than 16,384 characters ...]"


@both
def test_warnings_for_a_later_stage_without_results_and_a_first_stage_with_them(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    first, second = "List the projects {{results}}", "Summarize the projects"
    result = run(chapter, provider, workdir, [[first], [second]], {"List the": text("A, B"), "Summarize": text("Two.")})
    warned = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warned) == 2, result.stderr
    assert "stage 1" in warned[0] and "{{results}}" in warned[0]
    assert "stage 2" in warned[1] and "{{results}}" in warned[1]
    notes = [
        "stage 1 uses {{results}}, but no stage comes before it",
        "stage 2 has no {{results}}: it does not see stage 1's results",
    ]
    assert warned == [f"warning: workflow {note}" for note in notes]
    # Both stages still run, each prompt as written; the model is told too, before the result.
    assert first_user(requests_of(provider, "List the")[0]) == first
    assert first_user(requests_of(provider, "Summarize")[0]) == second
    assert results(provider) == {"w": "".join(f"[note: {note}]\n" for note in notes) + "Two."}


@both
def test_a_plan_of_4_stages_and_8_prompts_runs(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    wide = [f"Check part {n} of the code" for n in range(1, 9)]
    stages = [wide, ["Merge {{results}}"], ["Review {{results}}"], ["Conclude {{results}}"]]
    routes = {f"Check part {n} ": text(f"part {n} is fine") for n in range(1, 9)}
    routes.update(Merge=text("all 8 fine"), Review=text("reviewed"), Conclude=text("concluded"))
    run(chapter, provider, workdir, stages, routes)
    assert len(provider.chat_requests) == 2 + 8 + 3
    assert provider.most_in_flight <= 4
    assert [n for _, n, _, _ in fences(first_user(requests_of(provider, "Merge")[0]))] == [str(n) for n in range(1, 9)]
    assert results(provider) == {"w": "concluded"}


@both
def test_a_sub_agent_child_has_neither_sub_agent_nor_workflow(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    provider.script(calls(("s", "sub_agent", {"description": "look", "prompt": look("projA")})), text(FINAL))
    provider.route("projA/README.md", text("projA: no."))
    assert_ok(run_agent(chapter, TASK, provider=provider, cwd=workdir), FINAL + "\n")
    parent, child = requests_of(provider, TASK)[0], requests_of(provider, "projA/README.md")[0]
    assert {"sub_agent", "workflow"} <= set(tool_names(parent))
    from test_ex19 import PARENT_ONLY  # nor any tool registered after them: one list, kept there

    assert tool_names(child) == [n for n in tool_names(parent) if n not in PARENT_ONLY]
    assert results(provider) == {"s": "projA: no."}


# ---------------------------------------------------------------- a plan that does not


BAD_PLANS = {
    "a string": "Investigate projA",
    "an object": {"stage 1": ["Investigate projA"]},
    "null": None,
    "empty": [],
    "a stage that is a string": ["Investigate projA"],
    "an empty stage": [["Investigate projA"], []],
    "a number in a stage": [["Investigate projA", 3]],
    "an empty prompt": [["Investigate projA", "  "]],
    "5 stages": [["Investigate projA"]] * 5,
    "9 prompts in a stage": [["Investigate projA"] * 9],
}


@both
def test_every_bad_plan_is_an_error_with_the_shape_and_starts_no_child(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    ids = {name: f"bad{n}" for n, name in enumerate(BAD_PLANS)}
    batch = [(ids[name], "workflow", {"stages": plan}) for name, plan in BAD_PLANS.items()]
    provider.script(calls(*batch, ("none", "workflow", {})), text(FINAL))
    provider.route("Investigate", text("should never be asked"))
    result = run_agent(chapter, TASK, provider=provider, cwd=workdir)
    assert_ok(result, FINAL + "\n")
    assert len(provider.chat_requests) == 2, "a child was started"
    assert not children(workdir, new_session_id(result.stderr))
    got = results(provider)
    for name, call_id in ids.items():
        assert got[call_id].startswith("error:") and got[call_id].endswith(SHAPE), (name, got[call_id])
    assert "4" in got[ids["5 stages"]] and "8" in got[ids["9 prompts in a stage"]]
    assert got["none"].startswith("error:") and "stages" in got["none"], got["none"]
    if chapter == CHAPTER:
        assert got[ids["5 stages"]] == f"error: a plan has at most 4 stages, this one 5; {SHAPE}"
        assert got[ids["9 prompts in a stage"]] == f"error: a stage has at most 8 prompts, stage 1 9; {SHAPE}"
        assert got[ids["an empty stage"]] == f"error: stage 2 must be a non-empty array of non-empty strings; {SHAPE}"
        assert got[ids["empty"]] == f"error: stages must be a non-empty array; {SHAPE}"
        assert got["none"] == "error: workflow needs 'stages', an array"


# ---------------------------------------------------------------- stopping a workflow


@both
def test_ctrl_c_during_a_workflow_stops_it_and_the_calls_after_it(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    (workdir / "a.txt").write_text("alpha\n")
    stages = [[look("projA"), look("projB")], ["Compare {{results}}"]]
    provider.script(calls(("w", "workflow", {"stages": stages}), ("r", "read_file", {"path": "a.txt"})))
    provider.route("projA/README.md", text("projA: no."))
    provider.route("projB/README.md", text("never sent", pause_after=1))
    provider.route("Compare", text("never asked for"))
    with Live(chapter, TASK, provider=provider, cwd=workdir) as live:
        live.wait_stderr('[sub "stage 1, subtask 1" finished')
        provider.wait_paused()
        live.signal(signal.SIGINT)
        code, _out, err = live.finish(timeout=30)
    assert code == 130 and "Traceback" not in err, (code, err)
    assert not requests_of(provider, "Compare"), "stage 2 started after the stop"
    assert "read_file(" not in err, "a call after the stopped workflow ran"
    assert 'sub "stage 2' not in err
    parent_id = new_session_id(err)
    assert sorted(children(workdir, parent_id)) == ["stage 1, subtask 1", "stage 1, subtask 2"]
    stored = disk_messages(workdir / ".sessions" / f"{parent_id}.jsonl")
    tools = {m["tool_call_id"]: m["content"] for m in stored if m["role"] == "tool"}
    # The call after the workflow never ran: "interrupted" (chapter 21), "not run: interrupted" (from chapter 24).
    assert list(tools) == ["w", "r"] and tools["w"].startswith("error: interrupted"), tools
    assert tools["r"].startswith(("error: interrupted", "error: not run: interrupted")), tools
    if chapter == CHAPTER:
        assert tools == {"w": INTERRUPTED, "r": INTERRUPTED}
