"""What agent.py adds to chapters 12 and 13: recovery from a server's too-long
refusal, sessions grown far past the window, MAX_ROUNDS, and -list's mark.

A server whose window is smaller than agent.py believes refuses the request
(HTTP 400, in DeepSeek's, OpenAI's, Kimi's or llama.cpp's words, or with no
number at all). agent.py takes the window the refusal names (or guesses one
under what was sent), compacts, and sends the request once more. The fake
provider refuses every request over its context_limit, counted as 4 bytes a
token, and reports that count as the usage.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import TEST_KEY, run_agent
from fake_provider import FakeProvider, text, tool_call
from helpers import (
    EARLIER,
    SESSION_ID,
    SUMMARY_TEXT,
    appended,
    assert_ok,
    assert_one_error_line,
    budget_lines,
    crossing_run,
    file_records,
    first_request_tokens,
    header_line,
    hint,
    message_line,
    new_session_id,
    number,
    put_session,
    replayed,
    resumed,
    session_bytes,
    stderr_lines,
    summary_message,
    summary_requests,
    warnings,
)

LIMIT = 4000  # the server's window, in the fake provider's tokens
STYLES = ["deepseek", "openai", "kimi", "llamacpp", "unnamed"]


def small_server(provider: FakeProvider, style: str = "deepseek", limit: int = LIMIT) -> None:
    """A server with a small window, that counts each request and summarizes on request."""
    provider.measure, provider.context_limit, provider.limit_style = True, limit, style
    provider.summary = text(SUMMARY_TEXT)


def assert_recovered(provider: FakeProvider) -> int:
    """Each refused request is followed by its summary (one request or more, with no
    tools; a summary request sized for a window guessed too large is refused too, and
    sized again) and then by the same conversation once more, compacted: the system
    prompt, the summary, the end of what was refused. Returns the number of refusals."""
    chats = [r for r in provider.requests if r["path"].endswith("/chat/completions")]
    refused = [i for i, r in enumerate(chats) if r["refused"] and "tools" in r["body"]]
    for i in refused:
        j = i + 1
        while j < len(chats) and "tools" not in chats[j]["body"]:
            j += 1
        assert i + 1 < j < len(chats), "a refusal must be followed by a summary and one more try"
        assert not chats[j - 1]["refused"], "the summary that was used was refused"
        assert not chats[j]["refused"], "the second try did not fit either"
        was, sent = chats[i]["body"]["messages"], chats[j]["body"]["messages"]
        assert sent[:2] == [was[0], summary_message(SUMMARY_TEXT)]
        assert sent[2:] == was[len(was) - len(sent) + 2 :]
    return len(refused)


def read_rounds(workdir: Path, count: int) -> list:
    """count files of about 500 tokens each, and a round reading each."""
    for n in range(1, count + 1):
        (workdir / f"f{n}.txt").write_text(f"file {n} " * 250)
    return [tool_call("read_file", {"path": f"f{n}.txt"}, call_id=f"call_f{n}") for n in range(1, count + 1)]


# ---------------------------------------------------------------- a server's too-long refusal


# (the server's words, CONTEXT_WINDOW): the table believes 128,000 for deepseek-chat, or the window is right.
refusals = pytest.mark.parametrize(
    ("style", "window"),
    [*[(style, None) for style in STYLES], ("deepseek", str(LIMIT))],
    ids=[*[f"{style}, window from the table" for style in STYLES], "CONTEXT_WINDOW right"],
)


@refusals
def test_a_request_over_the_server_s_window_is_compacted_and_sent_once_more(
    provider: FakeProvider, workdir: Path, style: str, window: str | None
) -> None:
    small_server(provider, style)
    provider.script(*read_rounds(workdir, 8), text("Read them all."))
    env = {"MODEL": "deepseek-chat", "CONTEXT_WINDOW": window}  # the table says 128,000
    result = run_agent("final", "Read f1.txt to f8.txt", provider=provider, cwd=workdir, **env)
    assert_ok(result, "Read them all.\n")
    assert "[9 rounds" in result.stderr
    retried = [w for w in warnings(result.stderr) if w.endswith("trying again")]
    if window:  # compacted in time: never refused
        assert assert_recovered(provider) == 0 and retried == []
        assert "[compacted" in result.stderr
    else:
        assert assert_recovered(provider) == 1
        (warned,) = retried
        assert warned.startswith("warning: HTTP 400: "), warned
        size = number(re.search(r"making room for a ([\d,]+)-token window", warned).group(1))
        # The window the server named, or a guess under what was sent.
        assert size == LIMIT if style != "unnamed" else LIMIT / 2 < size < LIMIT
        assert budget_lines(result.stderr)[-1].window == size  # the rest of the run knows it

    # Nothing lost: every round is on disk, the folded ones too.
    path = workdir / ".sessions" / f"{new_session_id(result.stderr)}.jsonl"
    records = file_records(path)
    stored = [r["message"] for r in records if r["type"] == "message"]
    assert len(stored) == 2 + 8 * 2 + 1 and any(r["type"] == "compaction" for r in records)
    assert [m["content"] for m in stored if m["role"] == "tool"] == [f"file {n} " * 250 for n in range(1, 9)]

    # And the session goes on, as it was compacted: it fits the server's window. (Not CONTEXT_WINDOW's:
    # the tools take half of 4,000 tokens, so a resume told that window would compact again first.)
    provider.script(text("f8.txt."))
    again = run_agent(
        "final", "-c", path.stem, "Which was last?", provider=provider, cwd=workdir, MODEL="deepseek-chat"
    )
    assert_ok(again, "f8.txt.\n")
    question = {"role": "user", "content": "Which was last?"}
    assert provider.chat_requests[-1]["messages"] == [*replayed(records), question]
    assert not provider.requests[-1]["refused"]


def test_a_server_that_counts_the_reply_in_its_window_gets_a_reply_that_fits(
    provider: FakeProvider, workdir: Path
) -> None:
    """OpenAI and vLLM count max_tokens in the window: a short task asking for a reply of
    4,096 tokens (the table's 128,000 for gpt-4o allows it) is refused by a server of
    4,096 tokens. There is nothing to fold, but a smaller max_tokens fits."""
    small_server(provider, limit=4096)
    provider.limit_counts_reply = True
    provider.script(text("Hello."))
    result = run_agent("final", "Say hello", provider=provider, cwd=workdir, MODEL="gpt-4o")
    assert_ok(result, "Hello.\n")
    refused, retry = provider.requests
    assert refused["refused"] and refused["body"]["max_tokens"] == 4096
    assert not retry["refused"] and retry["body"]["max_tokens"] <= 4096 // 4
    assert retry["body"]["messages"] == refused["body"]["messages"]


def test_a_first_request_over_the_window_has_nothing_to_fold(provider: FakeProvider, workdir: Path) -> None:
    """A task longer than the server's window: nothing to fold, so the same request goes once more
    with a smaller max_tokens (DeepSeek counts the reply), is refused too, and that ends the run."""
    small_server(provider, limit=650)
    provider.script(text("never sent"))
    result = run_agent("final", "Summarize: " + "word " * 1000, provider=provider, cwd=workdir, MODEL="deepseek-chat")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    lines = stderr_lines(result.stderr)
    assert lines[-2].startswith("error: HTTP 400: ") and lines[-1] == hint(new_session_id(result.stderr))
    assert any(line.startswith("warning: cannot compact") for line in lines), result.stderr
    assert [("tools" in r["body"], r["refused"]) for r in provider.requests] == [(True, True), (True, True)]
    first, second = provider.chat_requests
    assert second["max_tokens"] < first["max_tokens"] and second["messages"] == first["messages"]


@pytest.mark.parametrize(
    ("repeat", "requests"),
    [
        # Folded, but the system prompt, the tools and the summary alone nearly fill the window.
        (60, [(True, False), (True, True), (False, False), (True, True)]),
        # The result of round 1 alone is more than the window: all before it folded, still too long.
        (100, [(True, False), (True, True), (False, False), (True, True)]),
    ],
    ids=["refused once more", "the last round alone too long"],
)
def test_a_refusal_that_compaction_cannot_cure_ends_the_run_with_one_error(
    provider: FakeProvider, workdir: Path, tmp_path: Path, repeat: int, requests: list[tuple[bool, bool]]
) -> None:
    """The request is sent once more after a compaction, and no more."""
    small_server(provider, limit=first_request_tokens("final", tmp_path) + 100)  # its prompt and tools, and a little
    (workdir / "f1.txt").write_text("file 1 " * repeat)
    provider.script(tool_call("read_file", {"path": "f1.txt"}), text("never sent"))
    result = run_agent("final", "Read f1.txt", provider=provider, cwd=workdir, MODEL="deepseek-chat")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    session_id = new_session_id(result.stderr)
    lines = stderr_lines(result.stderr)
    assert lines[-2].startswith("error: HTTP 400: ") and lines[-1] == hint(session_id), result.stderr
    assert any(line.startswith("[compacted: 1 messages") for line in lines), result.stderr
    # (offers tools, refused): round 1, round 2 refused, [its summary, round 2 refused again]
    assert [("tools" in r["body"], r["refused"]) for r in provider.requests] == requests
    assert provider.remaining == 1
    assert len(file_records(workdir / ".sessions" / f"{session_id}.jsonl")) >= 5  # round 1 is saved


@refusals
def test_a_session_grown_far_past_the_window_goes_on(
    provider: FakeProvider, workdir: Path, style: str, window: str | None
) -> None:
    """A session from before compaction existed, 14 times the server's window: -c works."""
    history = [EARLIER[0]]
    for n in range(100):
        history += [{"role": "user", "content": f"question {n} " * 20}]
        history += [{"role": "assistant", "content": f"answer {n} " * 200}]
    path = put_session(workdir, session_bytes(*history))
    before = path.read_bytes()
    assert len(before) // 4 > 14 * LIMIT
    small_server(provider, style)
    provider.script(text("Going on."))
    env = {"MODEL": "deepseek-chat", "CONTEXT_WINDOW": window}
    result = run_agent("final", "-c", SESSION_ID, "go on", provider=provider, cwd=workdir, **env)
    assert_ok(result, "Going on.\n")
    assert resumed(result.stderr) == (SESSION_ID, len(history))
    assert assert_recovered(provider) == (0 if window else 1)
    assert len(summary_requests(provider)) >= 2  # in parts: the folded part fits no single summary request
    sent = provider.chat_requests[-1]["messages"]
    assert sent[:2] == [EARLIER[0], summary_message(SUMMARY_TEXT)] and sent[-1] == {"role": "user", "content": "go on"}
    assert [r["type"] for r in appended(before, path.read_bytes())] == ["message", "compaction", "message"]


# ---------------------------------------------------------------- MAX_ROUNDS


def test_more_than_ten_rounds_by_default(provider: FakeProvider, workdir: Path) -> None:
    provider.script(*read_rounds(workdir, 12), text("Read them all."))
    result = run_agent("final", "Read f1.txt to f12.txt", provider=provider, cwd=workdir)
    assert_ok(result, "Read them all.\n")
    assert len(provider.chat_requests) == 13 and "\n[13 rounds · " in result.stderr


@pytest.mark.parametrize("source", ["environment", ".env"])
def test_max_rounds_stops_there_and_says_how_to_go_on(provider: FakeProvider, workdir: Path, source: str) -> None:
    env = {"MAX_ROUNDS": "3"} if source == "environment" else {}
    if source == ".env":
        (workdir / ".env").write_text("MAX_ROUNDS=3\n")
    provider.script(*read_rounds(workdir, 3), text("Read them all."))
    result = run_agent("final", "Read f1.txt to f3.txt", provider=provider, cwd=workdir, **env)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    session_id = new_session_id(result.stderr)
    assert stderr_lines(result.stderr)[-2:] == [
        f'stopped: reached the 3-round limit (MAX_ROUNDS sets it); go on with: -c {session_id} "continue"',
        hint(session_id),
    ]
    assert len(provider.chat_requests) == 3

    # Doing as it says: the three rounds go out again, then the answer.
    again = run_agent("final", "-c", session_id, "continue", provider=provider, cwd=workdir, **env)
    assert_ok(again, "Read them all.\n")
    sent = provider.chat_requests[-1]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", *["assistant", "tool"] * 3, "user"]


@pytest.mark.parametrize("value", ["abc", "0", "-3", "2.5", "1e3"])
def test_a_bad_max_rounds_is_one_error_line(provider: FakeProvider, workdir: Path, value: str) -> None:
    result = run_agent("final", "hello", provider=provider, cwd=workdir, MAX_ROUNDS=value)
    assert_one_error_line(result, "MAX_ROUNDS", repr(value))
    assert provider.requests == [] and not (workdir / ".sessions").exists()


# ---------------------------------------------------------------- -list


def test_list_marks_a_compacted_session_and_counts_the_messages_on_disk(provider: FakeProvider, workdir: Path) -> None:
    path, _before, result = crossing_run("final", provider, workdir, text(SUMMARY_TEXT))
    assert_ok(result)
    plain = "20260802-101010-0badf00d"
    put_session(workdir, session_bytes(*EARLIER, session_id=plain), plain)
    listing = run_agent("final", "-list", provider=None, cwd=workdir)
    assert_ok(listing)
    lines = {line.split()[0]: line for line in listing.stdout.splitlines()}
    on_disk = sum(r["type"] == "message" for r in file_records(path))
    assert on_disk == 9  # the resume loads 6: the summary stands for 4 of them
    assert f" {on_disk} messages " in lines[SESSION_ID] and lines[SESSION_ID].endswith("  [compacted ×1]"), (
        listing.stdout
    )
    assert f" {len(EARLIER)} messages " in lines[plain] and "compacted" not in lines[plain], listing.stdout


# ---------------------------------------------------------------- the reply's room, the summary's care


@pytest.mark.parametrize(("window", "max_tokens"), [("4000", 1000), ("128000", 4096)])
def test_a_request_leaves_the_reply_a_quarter_of_the_window_at_most(
    provider: FakeProvider, workdir: Path, window: str, max_tokens: int
) -> None:
    """Started under 75%, a request has room for its reply: max_tokens is min(4096, window // 4)."""
    provider.script(text("Hello."))
    assert_ok(run_agent("final", "Say hello", provider=provider, cwd=workdir, CONTEXT_WINDOW=window), "Hello.\n")
    assert provider.chat_requests[0]["max_tokens"] == max_tokens


def test_a_summary_that_echoes_the_key_is_stored_without_it(provider: FakeProvider, workdir: Path) -> None:
    """The summary is the server's text like any answer: the key's value is removed before
    it is stored in the compaction record or sent in the next request."""
    path, before, result = crossing_run("final", provider, workdir, text(f"Summary. The key in use is {TEST_KEY}."))
    assert_ok(result)
    (record,) = [r for r in appended(before, path.read_bytes()) if r["type"] == "compaction"]
    assert record["summary"] == "Summary. The key in use is [OPENAI_API_KEY removed]."
    assert TEST_KEY.encode() not in path.read_bytes()
    assert TEST_KEY not in json.dumps(provider.chat_requests[-1]["messages"])


@pytest.mark.parametrize(
    "extra",
    [b"x" * 200_000, json.dumps({"type": "compaction", "summary": "s", "kept": 999}).encode() + b"y" * 200_000],
    ids=["a damaged line", "a compaction record that does not apply"],
)
def test_a_resumed_estimate_counts_the_history_not_the_file(
    provider: FakeProvider, workdir: Path, extra: bytes
) -> None:
    """agent.py estimates a resumed session from its file's bytes only when the file holds nothing
    else: 200 KB that is not history (about 50,000 tokens) must not make it compact."""
    put_session(workdir, session_bytes(*EARLIER) + extra + b"\n")
    provider.script(text("ok"))
    result = run_agent("final", "-c", SESSION_ID, "go on", provider=provider, cwd=workdir, CONTEXT_WINDOW="32000")
    assert_ok(result, "ok\n")
    first = budget_lines(result.stderr)[0]
    assert first.estimated and first.used < 4000, result.stderr  # EARLIER is about 2,000 tokens
    assert summary_requests(provider) == []


def test_a_compacted_session_in_the_go_edition_s_spelling_is_read_back_from_its_compaction(
    provider: FakeProvider, workdir: Path
) -> None:
    """The book's Go edition writes its records with no spaces ('{"type":"compaction"'). Its
    compacted session is read back from the last compaction, as ours is: the 200 KB it folded
    (about 50,000 tokens, over this window) is neither sent nor counted, so nothing is compacted."""
    folded = [EARLIER[0], {"role": "user", "content": "x" * 200_000}, {"role": "assistant", "content": "Done."}]
    compaction = json.dumps({"type": "compaction", "summary": SUMMARY_TEXT, "kept": 0}, separators=(",", ":"))
    lines = [*(message_line(m, compact=True) for m in folded), compaction.encode() + b"\n"]
    put_session(workdir, header_line() + b"".join(lines) + b"".join(message_line(m, compact=True) for m in EARLIER[1:]))
    provider.script(text("ok"))
    result = run_agent("final", "-c", SESSION_ID, "go on", provider=provider, cwd=workdir, CONTEXT_WINDOW="32000")
    assert_ok(result, "ok\n")
    first = budget_lines(result.stderr)[0]
    assert first.estimated and first.used < 4000, result.stderr  # what follows the compaction: about 2,000
    assert summary_requests(provider) == []
    question = {"role": "user", "content": "go on"}
    assert provider.chat_requests[0]["messages"] == [EARLIER[0], summary_message(SUMMARY_TEXT), *EARLIER[1:], question]


def test_a_window_too_small_for_any_summary_ends_the_run_at_the_floor(provider: FakeProvider, workdir: Path) -> None:
    """A server of 200 tokens that names no window: the guess is halved while the summary requests are
    refused, down to 1,000 tokens and no further; then the first refusal is the run's one error line."""
    history = [EARLIER[0]]
    for n in range(20):
        history += [
            {"role": "user", "content": f"question {n} " * 20},
            {"role": "assistant", "content": "answer " * 200},
        ]
    put_session(workdir, session_bytes(*history))
    small_server(provider, "unnamed", limit=200)
    result = run_agent("final", "-c", SESSION_ID, "go on", provider=provider, cwd=workdir, MODEL="deepseek-chat")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    lines = stderr_lines(result.stderr)
    assert lines[-2] == "error: HTTP 400: the input length exceeds the context length" and lines[-1] == hint(SESSION_ID)
    assert [line for line in lines if line.startswith("error:")] == [lines[-2]], result.stderr
    tried = [number(w.split("trying a ")[1].split("-token")[0]) for w in warnings(result.stderr) if "trying a " in w]
    assert tried and tried[-1] == 1000 and tried == sorted(tried, reverse=True), result.stderr
    assert all(r["refused"] for r in provider.requests)  # nothing got through, nothing was folded
    assert "compaction" not in (workdir / ".sessions" / f"{SESSION_ID}.jsonl").read_text()


def test_a_last_round_larger_than_the_tail_is_kept_alone_and_the_rest_folded(
    provider: FakeProvider, workdir: Path, tmp_path: Path
) -> None:
    """A 6 KB file read twice against a llama.cpp server whose window holds the prompt, the tools
    and one read (some 3,000 tokens): the second read's round is over the 30% a tail may take,
    and nothing shorter ends the history. Everything before that round is folded, and the turn
    goes on (it used to end with the refusal, at every -c)."""
    (workdir / "notes.txt").write_text("note line\n" * 600)
    small_server(provider, "llamacpp", limit=first_request_tokens("final", tmp_path) + 1800)  # a read is 1,550
    provider.script(tool_call("read_file", {"path": "notes.txt"}, call_id="first"), text("One line, repeated."))
    assert_ok(run_agent("final", "Read notes.txt", provider=provider, cwd=workdir, MODEL="deepseek-chat"))
    provider.script(tool_call("read_file", {"path": "notes.txt"}, call_id="second"), text("Still the same."))
    again = run_agent("final", "-c", "last", "Read it again", provider=provider, cwd=workdir, MODEL="deepseek-chat")
    assert_ok(again, "Still the same.\n")
    assert assert_recovered(provider) == 1
    sent = provider.chat_requests[-1]["messages"]
    assert sent[1] == summary_message(SUMMARY_TEXT) and [m["role"] for m in sent[2:]] == ["assistant", "tool"]
    assert sent[2]["tool_calls"][0]["id"] == "second"  # the last round, kept whole
