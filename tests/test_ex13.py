"""Chapter 13: compaction (exercises/ex13/agent.py), and agent.py, which keeps it.

When a round leaves the conversation at 75% of the window or more, the model
summarizes the older part, in a request with no tools, before the next request;
the recent tail stays word for word. On disk the compaction is one appended
record: the folded messages stay in the file, and a crash at any byte of that
write resumes as the session before or after it. A failed summary is a warning.

The programs run as subprocesses against the fake provider. Three checks go
through every case in-process, on the programs' own functions: where the tail
starts (split_point), every byte at which the compaction's write can stop, and
compaction records the history cannot take (the loader).
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest

from conftest import load_program, run_agent
from fake_provider import FakeProvider, Reply, error, sequence_error, text, tool_call
from helpers import (
    ANSWER,
    EARLIER,
    QUESTION,
    SESSION_ID,
    SUMMARY_TEXT,
    TODO,
    appended,
    assert_ok,
    call,
    complete_lines,
    crossing_run,
    crossing_window,
    file_records,
    first_request_tokens,
    message_line,
    put_session,
    replayed,
    resumed,
    session_bytes,
    shape,
    summary_message,
    summary_requests,
    turn_requests,
    warnings,
)

CHAPTER = 13
both = pytest.mark.parametrize("chapter", [CHAPTER, "final"])
WINDOW = 4000
# The round crossing_run scripts, as the history and the file keep it.
ROUND = [
    {"role": "assistant", "content": None, "tool_calls": [call("call_todo", "read_file", '{"path": "todo.txt"}')]},
    {"role": "tool", "tool_call_id": "call_todo", "content": TODO},
]
WHOLE = [*EARLIER, QUESTION, *ROUND]  # the conversation when the compaction comes
AFTER = [EARLIER[0], summary_message(SUMMARY_TEXT), QUESTION, *ROUND]  # and after it


def folded_and_after(chapter: int | str) -> tuple[int, list[dict]]:
    """How many of EARLIER's messages a crossing run folds, and the conversation after it.
    agent.py's window is larger (crossing_window(): room for its tools), and so is the 30%
    kept word for word: EARLIER's last question and answer stay too."""
    if chapter != "final":
        return 4, AFTER
    return 2, [EARLIER[0], summary_message(SUMMARY_TEXT), *EARLIER[3:], QUESTION, *ROUND]


def tokens(messages: list[dict]) -> float:
    """A rough count, independent of the programs: 4 characters of JSON a token."""
    return len(json.dumps(messages)) / 4


# ---------------------------------------------------------------- compaction at the threshold


@both
def test_a_round_past_75_percent_is_followed_by_a_summary_then_the_compacted_request(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    _path, _before, result = crossing_run(chapter, provider, workdir, text(SUMMARY_TEXT))
    assert_ok(result, ANSWER + "\n")
    lines = result.stderr.splitlines()
    window, counted = crossing_window(chapter)
    share = (counted + 7) / window  # the reply's 7 tokens count too
    crossing = lines.index(f"[budget {counted + 7:,}/{window:,} tokens · {share:.1%}]")
    folded, after_shape = folded_and_after(chapter)
    compacting = lines.index(f"[compacting: the model summarizes {folded} older messages]")
    assert (
        lines[crossing + 1]
        == f"warning: the conversation fills {share:.0%} of the model's window; soon it will not fit"
    )
    assert crossing < compacting and lines[compacting + 1] == f"[compacted: {folded} messages folded into a summary]"

    # The round, the summary request, the request after it: in this order.
    first, summary, after = provider.chat_requests
    assert "tools" in first and "tools" in after
    assert "tools" not in summary, "the summary request must offer no tools: the model can only write"
    (asked,) = summary["messages"]
    assert asked["role"] == "user" and "summary" in asked["content"].lower()
    for message in EARLIER[1 : 1 + folded]:  # what is folded goes to the summary, and only that
        assert message["content"][:60] in asked["content"]
    assert QUESTION["content"] not in asked["content"] and TODO not in asked["content"]
    assert summary["max_tokens"] <= window // 4

    # After it: the system prompt, the summary, the tail; not one folded message.
    sent = after["messages"]
    assert sent[:2] == [EARLIER[0], summary_message(SUMMARY_TEXT)]
    assert [shape(m) for m in sent] == [shape(m) for m in after_shape]
    assert sent[2]["role"] == "user"  # the tail starts at a request
    assert all(message["content"][:60] not in json.dumps(sent) for message in EARLIER[1 : 1 + folded])
    assert sequence_error(sent) is None
    # The tail kept word for word: 30% of the window at most (under half the 75% trigger).
    assert tokens(sent[2:]) <= 0.30 * window


@both
def test_the_compaction_is_one_appended_record_and_a_resume_sends_the_compacted_view(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    path, before, result = crossing_run(chapter, provider, workdir, text(SUMMARY_TEXT))
    assert_ok(result)
    new = appended(before, path.read_bytes())  # the folded messages stay in the file, their bytes untouched
    assert [r["type"] for r in new] == ["message"] * 3 + ["compaction", "message"]
    # agent.py's record also carries the wake-up and goal records in force (none here).
    carried = {"carried": []} if chapter == "final" else {}
    folded, after_shape = folded_and_after(chapter)
    kept = len(after_shape) - 2
    assert new[3] == {"type": "compaction", "summary": SUMMARY_TEXT, "kept": kept, **carried}
    assert [shape(r["message"]) for r in new if r["type"] == "message"] == [
        shape(m) for m in [QUESTION, *ROUND, {"role": "assistant", "content": ANSWER}]
    ]

    provider.script(text("Lin has two of them."))
    again = run_agent(chapter, "-c", SESSION_ID, "Who has the most?", provider=provider, cwd=workdir)
    assert_ok(again, "Lin has two of them.\n")
    view = replayed(file_records(path)[:-2])  # the file as the resume read it
    assert resumed(again.stderr) == (SESSION_ID, 3 + kept) and len(view) == 3 + kept
    sent = provider.chat_requests[-1]["messages"]
    assert sent == [*view, {"role": "user", "content": "Who has the most?"}]
    assert [shape(m) for m in sent[: 2 + kept]] == [shape(m) for m in after_shape]


# ---------------------------------------------------------------- where the kept tail starts


def histories(seed: int, count: int) -> list[list[dict]]:
    """Valid conversations of every shape: requests, rounds of parallel tool calls with
    results from a few bytes to 12 KB, answers."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        history, calls = [{"role": "system", "content": "You are a coding agent."}], 0
        for _turn in range(rng.randint(1, 6)):
            history.append({"role": "user", "content": "please " * rng.randint(1, 300)})
            for _round in range(rng.choice([0, 0, 1, 2, 5])):
                ids = [f"call_{calls + i}" for i in range(rng.randint(1, 3))]
                calls += len(ids)
                history.append({"role": "assistant", "content": None, "tool_calls": [call(i) for i in ids]})
                history += [{"role": "tool", "tool_call_id": i, "content": "x" * rng.randint(0, 12_000)} for i in ids]
            history.append({"role": "assistant", "content": "done " * rng.randint(1, 400)})
        out.append(history)
    return out


@pytest.mark.parametrize("loaded", [CHAPTER, "final"], indirect=True)
def test_the_tail_starts_as_early_as_its_budget_allows_at_a_request(loaded, request: pytest.FixtureRequest) -> None:
    """Exhaustively: the tail fits 30% of the window (never more than half the trigger),
    starts at a user message (agent.py: at an assistant message when no user message
    will do, and, after a refusal, at the last round when nothing fits), and is the
    longest that does; what remains is a valid conversation, and a record of it is one
    the loader takes."""
    final = request.node.callspec.params["loaded"] == "final"
    checked = folded = last_only = 0
    for history in histories(seed=13, count=150):
        tail = list(itertools.accumulate(loaded.estimate([m]) for m in reversed(history)))[::-1]  # of history[j:]
        for window in (1000, 2000, 4000, 32_000):
            budget = min(0.30, 0.75 / 2) * window
            fits = [j for j in range(2, len(history)) if tail[j] <= budget]  # history[1], the task, is always folded
            users = [j for j in fits if history[j]["role"] == "user"]
            rounds = [j for j in fits if history[j]["role"] == "assistant"] if final else []
            expected = min(users or rounds, default=None)
            split = loaded.split_point(history, window)
            assert split == expected, (window, [m["role"] for m in history], tail)
            if final and split is None:  # after a refusal: the last round alone, all else folded
                last = [j for j in range(2, len(history)) if history[j]["role"] in ("user", "assistant")][-1]
                split = loaded.split_point(history, window, last_resort=True)
                assert split == last, (window, [m["role"] for m in history], tail)
            checked += 1
            if split is None:
                continue
            folded += 1
            last_only += split not in fits
            after = loaded.folded(history, "a summary", len(history) - split)
            assert after[2:] == history[split:] and after[1] == summary_message("a summary")
            assert sequence_error(after) is None, after
            assert loaded.valid_compaction({"summary": "a summary", "kept": len(history) - split}, history)
    assert checked == 600 and 100 < folded <= 600
    # Both outcomes were tried: nothing to fold (the chapter), or only the last round kept (agent.py).
    assert (last_only > 50) if final else (folded < 600 and last_only == 0), (folded, last_only)


# ---------------------------------------------------------------- a crash at any byte of the compaction's write


def compaction_line(data: bytes) -> tuple[int, int]:
    """(start, end) of the one compaction record's line, its newline included."""
    start = data.index(b'\n{"type": "compaction"') + 1
    return start, data.index(b"\n", start) + 1


@both
def test_a_crash_at_any_byte_of_the_compaction_resumes_the_session_before_or_after_it(
    provider: FakeProvider, workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chapter: int | str
) -> None:
    path, _before, result = crossing_run(chapter, provider, workdir, text(SUMMARY_TEXT))
    assert_ok(result)
    data = path.read_bytes()
    start, end = compaction_line(data)
    before_view = replayed(complete_lines(data[:start])[0])
    after_view = replayed(complete_lines(data[:end])[0])
    assert before_view == WHOLE and [shape(m) for m in after_view] == [shape(m) for m in folded_and_after(chapter)[1]]

    # Every length the file can have while the record is written, through the program's own loader.
    inproc = tmp_path / "inproc"
    inproc.mkdir()
    agent = load_program(chapter, inproc, monkeypatch)
    views = []
    for cut in range(start, end + 1):
        put_session(inproc, data[:cut])
        session = agent.open_session(SESSION_ID)
        views.append(session.history)
        if hasattr(session, "fd"):  # agent.py keeps the session open and locked
            agent.os.close(session.fd)
    # Only the whole line, with or without its newline, is the compaction; nothing is ever lost.
    assert views[-2:] == [after_view, after_view]
    assert all(view == before_view for view in views[:-2]), "a torn compaction must leave the session as before"

    # One of those cuts, end to end: the torn bytes go, and the session goes on whole.
    torn = data[: (start + end) // 2]
    path.write_bytes(torn)
    warning = f"warning: dropped an incomplete last line ({len(torn) - start} bytes) left by an interrupted write"
    assert_resumes_whole(chapter, provider, path, data[:start], warning)


def assert_resumes_whole(chapter: int | str, provider: FakeProvider, path: Path, kept: bytes, warning: str) -> None:
    """-c on the session file as it is now: the one warning, and every message of WHOLE goes
    out again; the file is `kept` and then the new question and answer."""
    provider.script(text("Three."))
    result = run_agent(chapter, "-c", SESSION_ID, "How many?", provider=provider, cwd=path.parent.parent)
    assert_ok(result, "Three.\n")
    assert warnings(result.stderr) == [warning]
    assert resumed(result.stderr) == (SESSION_ID, len(WHOLE))
    assert provider.chat_requests[-1]["messages"] == [*WHOLE, {"role": "user", "content": "How many?"}]
    assert [r["type"] for r in appended(kept, path.read_bytes())] == ["message", "message"]


# ---------------------------------------------------------------- a compaction record the history cannot take

HAND_MADE = session_bytes(*WHOLE)  # lines 1 to 9; the compaction record is line 10
RECORD = {"type": "compaction", "summary": SUMMARY_TEXT, "kept": 3}
# name -> (line 10, the programs that take it)
RECORDS = {
    "valid": (RECORD, {CHAPTER, "final"}),
    "kept nothing": ({**RECORD, "kept": 0}, {CHAPTER, "final"}),
    "kept from the model's round": ({**RECORD, "kept": 2}, {"final"}),  # agent.py's fallback tail
    "kept from a tool result": ({**RECORD, "kept": 1}, set()),
    "kept all": ({**RECORD, "kept": len(WHOLE)}, set()),
    "kept negative": ({**RECORD, "kept": -1}, set()),
    "kept as text": ({**RECORD, "kept": "3"}, set()),
    "kept true": ({**RECORD, "kept": True}, set()),
    "kept missing": ({"type": "compaction", "summary": SUMMARY_TEXT}, set()),
    "summary not text": ({**RECORD, "summary": 42}, set()),
    "not JSON": (b'{"type": "compaction", "summary": "x", "kept": 3', set()),
}


def record_bytes(record: dict | bytes) -> bytes:
    return record + b"\n" if isinstance(record, bytes) else json.dumps(record).encode() + b"\n"


@pytest.mark.parametrize("case", list(RECORDS))
@both
def test_a_compaction_record_is_replayed_only_if_the_history_can_take_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, chapter: int | str, case: str
) -> None:
    record, takers = RECORDS[case]
    latest = {"role": "assistant", "content": ANSWER}
    agent = load_program(chapter, tmp_path, monkeypatch)
    put_session(tmp_path, HAND_MADE + record_bytes(record) + message_line(latest))
    capsys.readouterr()
    session = agent.open_session(SESSION_ID)
    if hasattr(session, "fd"):
        agent.os.close(session.fd)
    if chapter in takers:
        kept = record["kept"]
        assert session.history == [WHOLE[0], summary_message(SUMMARY_TEXT), *WHOLE[len(WHOLE) - kept :], latest]
        assert capsys.readouterr().err == ""
    else:  # a damaged line like any other: named, skipped, every message loaded
        assert session.history == [*WHOLE, latest]
        assert capsys.readouterr().err.startswith("warning: skipped damaged line(s) 10 of ")


@both
def test_a_damaged_compaction_record_stays_in_the_file_and_the_session_goes_on_whole(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    path = put_session(workdir, HAND_MADE + record_bytes({**RECORD, "kept": 1}))  # would part a result from its call
    warning = f"warning: skipped damaged line(s) 10 of {SESSION_ID}.jsonl; they stay in the file"
    assert_resumes_whole(chapter, provider, path, path.read_bytes(), warning)


# ---------------------------------------------------------------- when the summary fails


@pytest.mark.parametrize(
    ("failure", "reason"),
    [(error(500), "HTTP 500"), (text(""), "the summary came back empty")],
    ids=["HTTP 500", "empty summary"],
)
@both
def test_a_failed_summary_is_a_warning_and_the_turn_goes_on_whole(
    provider: FakeProvider, workdir: Path, chapter: int | str, failure: Reply, reason: str
) -> None:
    path, before, result = crossing_run(chapter, provider, workdir, failure)
    assert_ok(result, ANSWER + "\n")
    (warned,) = [w for w in warnings(result.stderr) if "compaction" in w]
    assert warned.startswith("warning: compaction failed (") and reason in warned, warned
    assert warned.endswith("going on with the whole conversation")
    assert "[compacted" not in result.stderr
    assert len(summary_requests(provider)) == 1
    assert turn_requests(provider)[-1]["messages"] == WHOLE  # nothing folded, nothing lost
    new = appended(before, path.read_bytes())
    assert [r["type"] for r in new] == ["message"] * 4  # no compaction record


# ---------------------------------------------------------------- the summary request fits any window

BIG = "HEAD-OF-THE-RESULT " + "lorem ipsum dolor sit amet " * 7_600 + " TAIL-OF-THE-RESULT"  # 200 KB


@both
def test_the_summary_request_fits_a_small_window_with_the_head_and_tail_of_a_huge_result(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    read = {"role": "assistant", "content": None, "tool_calls": [call("call_big", "read_file", '{"path": "big.txt"}')]}
    earlier = [
        EARLIER[0],
        {"role": "user", "content": "Read big.txt"},
        read,
        {"role": "tool", "tool_call_id": "call_big", "content": BIG},
        {"role": "assistant", "content": "It is lorem ipsum."},
    ]
    put_session(workdir, session_bytes(*earlier))
    provider.script(text(SUMMARY_TEXT), text("Nothing."))
    result = run_agent(chapter, "-c", SESSION_ID, "What next?", provider=provider, cwd=workdir, CONTEXT_WINDOW="1000")
    assert_ok(result, "Nothing.\n")
    assert "[compacted: 4 messages folded into a summary]" in result.stderr.splitlines()

    summary, after = provider.requests
    assert "tools" not in summary["body"]
    content = summary["body"]["messages"][0]["content"]
    assert "HEAD-OF-THE-RESULT" in content and "TAIL-OF-THE-RESULT" in content and "characters cut" in content
    # The request fits the window with room for its reply, as the server counts it (4 bytes a token).
    assert len(summary["raw"]) // 4 + summary["body"]["max_tokens"] <= 1000
    assert summary["body"]["max_tokens"] <= 1000 // 4
    question = {"role": "user", "content": "What next?"}
    assert after["body"]["messages"] == [EARLIER[0], summary_message(SUMMARY_TEXT), question]


# ---------------------------------------------------------------- one long task


@both
def test_one_long_task_folds_only_in_agent_py_which_keeps_a_tail_from_a_round(
    provider: FakeProvider, workdir: Path, tmp_path: Path, chapter: int | str
) -> None:
    """The chapter's tail starts only at a user message, and a single task has none to
    cut before; agent.py starts it at a round of the model's instead."""
    window = first_request_tokens(chapter, tmp_path) + 2440  # 3,000 for chapter 13: room for its prompt and tools
    for name in "abc":
        (workdir / f"{name}.txt").write_text(f"{name} " * 1200)  # 600 tokens each
    provider.measure = True  # each round's count is the request's own size
    provider.summary = text(SUMMARY_TEXT)
    provider.script(*[tool_call("read_file", {"path": f"{name}.txt"}, call_id=f"call_{name}") for name in "abc"])
    provider.script(text("Read all three."))
    result = run_agent(
        chapter, "Read a.txt, b.txt and c.txt", provider=provider, cwd=workdir, CONTEXT_WINDOW=str(window)
    )
    assert_ok(result, "Read all three.\n")
    turns = turn_requests(provider)
    assert len(turns) == 4
    last = turns[-1]["messages"]
    assert sequence_error(last) is None
    if chapter == CHAPTER:
        assert (
            "warning: cannot compact: there is no earlier request to fold, or the latest one fills the part kept"
            in warnings(result.stderr)
        )
        assert summary_requests(provider) == [] and len(last) == 8  # the whole task went out
    else:
        # Its tools take half this window, so it folds as soon as it can, and again: at a round each time.
        assert any(line.startswith("[compacted: ") for line in result.stderr.splitlines()), result.stderr
        assert len(summary_requests(provider)) >= 1
        assert last[:2] == [turns[0]["messages"][0], summary_message(SUMMARY_TEXT)]
        assert last[2]["role"] == "assistant" and last[2]["tool_calls"]  # the tail starts at a round of the model's
        assert last[-1] == {"role": "tool", "tool_call_id": "call_c", "content": "c " * 1200}
