"""agent.py against a real llama-server: the protocol, not the answers.

The model is tiny (Gemma 3 270M) and rambles, so nothing here checks what it
says. What is checked is what the program does with what llama-server really
sends and refuses: streamed text, tool calls in fragments with llama-server's
own 32-character ids, finish_reason "length", its HTTP 400 for a request over
the window, a stream that breaks off. The proxy (server.py) records every
request and answer, and steers the model: a text reply capped at a few
tokens, or a tool call it cannot help writing.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Callable
from pathlib import Path

from conftest import run_agent
from helpers import SUMMARY_CACHED, Live, Summary, assert_ok, disk_messages, new_session_id, resumed, round_lines

from .server import Exchange, LlamaServer, Proxy

NOTES = "The secret word is pineapple.\n"
LLAMA_ID = re.compile(r"[A-Za-z0-9]{32}")  # llama-server's tool-call ids: random, 32 characters
CUT_OFF = (
    "error: your reply was cut off by max_tokens before this call was complete, so it was not run; "
    "make the call again with shorter arguments"
)


def session_file(workdir: Path, session_id: str) -> Path:
    return workdir / ".sessions" / f"{session_id}.jsonl"


def accepted(exchanges: list[Exchange]) -> None:
    """Every request got llama-server's 200 and a whole answer."""
    assert [(e.step, e.status, e.complete) for e in exchanges] == [(e.step, 200, True) for e in exchanges], [
        (e.step, e.status, e.body[:300]) for e in exchanges
    ]


def sent_messages(exchange: Exchange) -> list[dict]:
    return exchange.received["messages"]


def closing(stderr: str) -> Summary:
    """The closing line of a run of agent.py (before its resume hint)."""
    found = [match for line in stderr.splitlines() if (match := SUMMARY_CACHED.match(line))]
    assert len(found) == 1, stderr
    rounds, _word, *figures = found[0].groups()  # "round" or "rounds": summary() checks the word
    return Summary(rounds, *figures)


def test_plain_answer_streamed_and_saved(proxy: Proxy, workdir: Path) -> None:
    result = run_agent("final", "Say hello.", provider=proxy, cwd=workdir)
    assert_ok(result)
    [exchange] = proxy.chats
    accepted([exchange])
    assert exchange.received["stream"] is True
    text = exchange.streamed_text()
    assert len([c for c in exchange.choices() if c["delta"].get("content")]) > 1, "not streamed in pieces"
    assert text.strip() and result.stdout == text + "\n"
    # The token cap struck: llama-server says "length", and the run still ends well.
    assert exchange.finish_reason() == "length"
    usage = exchange.usage()
    assert closing(result.stderr).finish == "length"
    assert closing(result.stderr).tokens == str(usage["prompt_tokens"])
    # The count as agent.py shows it: with thousands separated (1,213).
    assert f"[budget {usage['prompt_tokens'] + usage['completion_tokens']:,}/" in result.stderr
    messages = disk_messages(session_file(workdir, new_session_id(result.stderr)))
    assert messages == [*sent_messages(exchange), {"role": "assistant", "content": text}]


def test_resume_resends_the_history(proxy: Proxy, workdir: Path) -> None:
    first = run_agent("final", "My name is Xiaoming; remember it.", provider=proxy, cwd=workdir)
    assert_ok(first)
    session_id = new_session_id(first.stderr)
    stored = disk_messages(session_file(workdir, session_id))
    assert [m["role"] for m in stored] == ["system", "user", "assistant"]

    second = run_agent("final", "-c", session_id, "What is my name?", provider=proxy, cwd=workdir)
    assert_ok(second)
    assert resumed(second.stderr) == (session_id, 3)
    one, two = proxy.chats
    accepted([one, two])
    # The second request carries the first exchange as stored, then the new question.
    assert sent_messages(two) == [*stored, {"role": "user", "content": "What is my name?"}]
    assert stored[2] == {"role": "assistant", "content": one.streamed_text()}
    # llama-server's prompt cache held the start of it, and the program reports what it says.
    cached = two.usage()["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0 and closing(second.stderr).cached == str(cached)
    after = disk_messages(session_file(workdir, session_id))
    assert after == [*sent_messages(two), {"role": "assistant", "content": two.streamed_text()}]


def test_tool_round_from_streamed_fragments(proxy: Proxy, workdir: Path) -> None:
    (workdir / "notes.txt").write_text(NOTES)
    proxy.arguments = {"path": "notes.txt"}
    proxy.plan = ["call", "text"]
    result = run_agent("final", "What does notes.txt say?", provider=proxy, cwd=workdir)
    assert_ok(result)
    asked, answered = proxy.chats
    accepted([asked, answered])

    # llama-server's stream: the id and the name first, then the arguments in pieces.
    fragments = asked.tool_fragments()
    assert asked.finish_reason() == "tool_calls"
    assert len(fragments) > 2 and {f["index"] for f in fragments} == {0}
    call_id = fragments[0]["id"]
    assert LLAMA_ID.fullmatch(call_id) and fragments[0]["function"]["name"] == "read_file"
    assert all("id" not in f for f in fragments[1:])
    arguments = asked.streamed_arguments()
    assert json.loads(arguments) == {"path": "notes.txt"}

    # The call as the program assembled it, ran it, and sent it back with its result.
    assert len(round_lines(result.stderr)) == 1 and f"\n[round 1] read_file({arguments})\n" in result.stderr
    call = {"id": call_id, "type": "function", "function": {"name": "read_file", "arguments": arguments}}
    round_ = [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": NOTES},
    ]
    assert sent_messages(answered) == [*sent_messages(asked), *round_]
    session_id = new_session_id(result.stderr)
    stored = disk_messages(session_file(workdir, session_id))
    assert stored == [*sent_messages(asked), *round_, {"role": "assistant", "content": answered.streamed_text()}]

    # The file as it is, read back on a resume: llama-server takes it too.
    again = run_agent("final", "-c", session_id, "Thanks.", provider=proxy, cwd=workdir)
    assert_ok(again)
    accepted(proxy.chats[2:])
    assert sent_messages(proxy.chats[2]) == [*stored, {"role": "user", "content": "Thanks."}]


def test_cut_off_tool_call_leaves_a_usable_session(proxy: Proxy, workdir: Path) -> None:
    """A text turn cut off by the cap is the plain answer above (finish_reason length, saved, resent
    on a resume); here the cap strikes inside a tool call."""
    (workdir / "notes.txt").write_text(NOTES)
    proxy.arguments = {"path": "notes.txt"}
    proxy.plan = ["cut", "text"]
    result = run_agent("final", "What does notes.txt say?", provider=proxy, cwd=workdir)
    assert_ok(result)
    cut, after = proxy.chats
    accepted([cut, after])

    # max_tokens struck inside the call: llama-server says "length" and streamed half the arguments.
    assert cut.finish_reason() == "length"
    call_id = cut.tool_fragments()[0]["id"]
    assert LLAMA_ID.fullmatch(call_id)
    half = cut.streamed_arguments()
    assert half.startswith("{") and not valid_json(half)
    assert "warning: the reply was cut off by max_tokens; its tool calls were not run" in result.stderr
    assert round_lines(result.stderr) == []  # not run

    # The next request sends the call with arguments that parse, and says why it was not run.
    call = {"id": call_id, "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
    round_ = [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": CUT_OFF},
    ]
    assert sent_messages(after)[-2:] == round_
    session_id = new_session_id(result.stderr)
    stored = disk_messages(session_file(workdir, session_id))
    assert stored[2:] == [*round_, {"role": "assistant", "content": after.streamed_text()}]

    # Why: the half-written arguments sent back are refused by llama-server, for good.
    broken = json.loads(json.dumps(after.forwarded))
    broken["messages"][-2]["tool_calls"][0]["function"]["arguments"] = half
    status, answer = proxy.upstream.post("/v1/chat/completions", {**broken, "stream": False, "max_tokens": 1})
    assert status == 500 and "Failed to parse tool call arguments as JSON" in answer["error"]["message"], answer

    # And the session goes on from the file.
    again = run_agent("final", "-c", session_id, "Try again.", provider=proxy, cwd=workdir)
    assert_ok(again)
    [resumed_exchange] = proxy.chats[2:]
    accepted([resumed_exchange])
    assert sent_messages(resumed_exchange) == [*stored, {"role": "user", "content": "Try again."}]


def valid_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------- the window overflows

# A long first request that fits the window, and a second one that does not fit
# with it: digits are one token each for Gemma, so the second is many tokens in
# few characters (agent.py estimates 4 characters a token), and agent.py's own
# estimate keeps it below the part that compaction keeps word for word.
LONG_TASK = "Keep these notes for later.\n" + "".join(
    f"Note {i}: the build step {i} runs before the tests of module {i}, and after the lint.\n" for i in range(20)
)
LOG = "And this log, too: " + " ".join(f"{(i * 7919) % 10000:04d}" for i in range(100))


def tokens(server: LlamaServer, text: str) -> int:
    """How many tokens the server's own tokenizer makes of text."""
    request = urllib.request.Request(
        f"{server.base}/tokenize",
        data=json.dumps({"content": text}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return len(json.load(response)["tokens"])


def overflow_window(proxy: Proxy, workdir: Path) -> int:
    """A window the first request fits and the second does not, after agent.py's own first
    request: its system prompt and tools grow with the chapters, so a fixed number would
    not do. With P the first request's tokens (the prompt, the tools, LONG_TASK), the
    second is about P + the answer + LOG, and after a compaction about P - LONG_TASK +
    the summary + LOG (answers and summaries are capped at the proxy's few tokens): a
    window of P + LOG - LONG_TASK / 2 lies half of LONG_TASK away from both. llama-server
    rounds a window up to a multiple of 256: the nearest one is taken, within 128 of it, so
    half of LONG_TASK (about 220 tokens) must be more than that and a summary, and LOG (about
    500) more than half of LONG_TASK and 128."""
    probe = workdir.parent / "probe"
    probe.mkdir()
    assert_ok(run_agent("final", LONG_TASK, provider=proxy, cwd=probe, timeout=300, CONTEXT_WINDOW=None))
    first = proxy.chats[-1].usage()["prompt_tokens"]
    server = proxy.upstream
    middle = first + tokens(server, LOG) - tokens(server, LONG_TASK) // 2
    return round(middle / 256) * 256


def test_window_overflow_compacts_and_the_turn_succeeds(
    proxy: Proxy, small_proxy: Callable[[int], Proxy], workdir: Path
) -> None:
    window = overflow_window(proxy, workdir)
    proxy = small_proxy(window)
    # CONTEXT_WINDOW is unset and MODEL is not in agent.py's table: it believes in 32,000 tokens.
    first = run_agent("final", LONG_TASK, provider=proxy, cwd=workdir, timeout=300, CONTEXT_WINDOW=None)
    assert_ok(first)
    session_id = new_session_id(first.stderr)
    [one] = proxy.chats
    accepted([one])
    assert "/32,000 tokens" in first.stderr

    second = run_agent("final", "-c", session_id, LOG, provider=proxy, cwd=workdir, timeout=300, CONTEXT_WINDOW=None)
    assert_ok(second)
    _, refused, summarizing, retried = proxy.chats
    # llama-server's refusal, for real: 400 and the window it has.
    assert refused.status == 400, (refused.status, refused.body[:300])
    error = refused.json()["error"]
    assert re.fullmatch(
        rf"request \(\d+ tokens\) exceeds the available context size \({window} tokens\).*", error["message"]
    )
    assert error["n_prompt_tokens"] > window
    assert sent_messages(refused) == [*sent_messages(one), assistant_of(one), {"role": "user", "content": LOG}]
    assert re.search(
        rf"^warning: HTTP 400: request \(\d+ tokens\) exceeds the available context size \({window} tokens\).*; "
        rf"making room for a {window:,}-token window and trying again$",
        second.stderr,
        re.MULTILINE,
    ), second.stderr
    # The summary: one plain request, no tools, not streamed; then the turn again, accepted.
    accepted([summarizing, retried])
    assert "tools" not in summarizing.received and not summarizing.received.get("stream")
    assert [m["role"] for m in summarizing.received["messages"]] == ["user"]
    assert "[compacted: 2 messages folded into a summary]" in second.stderr
    summary_text = summarizing.json()["choices"][0]["message"]["content"]
    folded = {"role": "user", "content": f"[summary of the earlier conversation]\n{summary_text}"}
    assert sent_messages(retried) == [sent_messages(one)[0], folded, {"role": "user", "content": LOG}]
    assert retried.usage()["prompt_tokens"] < window
    assert re.search(rf"^\[budget [\d,]+/{window:,} tokens", second.stderr, re.MULTILINE), second.stderr

    # On disk: the folded messages stay, one compaction record follows, then the new answer.
    records = [json.loads(line) for line in session_file(workdir, session_id).read_bytes().splitlines()]
    assert [r["type"] for r in records] == ["meta", "message", "message", "message", "message", "compaction", "message"]
    assert records[5] == {"type": "compaction", "summary": summary_text, "kept": 1, "carried": []}  # no state in force
    assert records[6]["message"] == assistant_of(retried)

    # The compacted session resumes as folded.
    third = run_agent("final", "-c", session_id, "Go on.", provider=proxy, cwd=workdir, timeout=300)
    assert_ok(third)
    assert resumed(third.stderr) == (session_id, 4)
    last = proxy.chats[4]
    accepted([last])
    assert sent_messages(last) == [
        *sent_messages(retried),
        assistant_of(retried),
        {"role": "user", "content": "Go on."},
    ]


def assistant_of(exchange: Exchange) -> dict:
    return {"role": "assistant", "content": exchange.streamed_text()}


# ---------------------------------------------------------------- the server dies


def test_server_killed_mid_stream_then_resumed(fresh_server, workdir: Path) -> None:
    first: LlamaServer = fresh_server()
    with Proxy(first, max_tokens=2000) as proxy:
        with Live("final", "Tell me a long story.", provider=proxy, cwd=workdir) as live:
            live.wait_stderr("[new session ")

            def streaming() -> bool:
                return bool(proxy.exchanges) and len(proxy.exchanges[0].events()) >= 5

            proxy.wait_until(streaming, "five events of the answer relayed")
            first.kill()
            result = live.completed(timeout=60)
        [broken] = proxy.chats
        assert broken.status == 200 and not broken.complete and broken.finish_reason() is None
        partial = broken.streamed_text()
        assert result.returncode == 1, (result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
        # What had come was shown; the run ends with one error line and the resume hint.
        assert partial.strip() and result.stdout == partial + "\n"
        session_id = new_session_id(result.stderr)
        *_, error, hint = result.stderr.splitlines()
        assert error.startswith("error: ") and hint == f"[session {session_id} — continue with: -c {session_id}]"
        stored = disk_messages(session_file(workdir, session_id))
        assert stored == sent_messages(broken)  # the broken answer is not kept

        # The server comes back (the same proxy address: the user's OPENAI_BASE_URL); the session goes on.
        proxy.upstream = fresh_server()
        proxy.max_tokens = 24
        again = run_agent("final", "-c", session_id, "Go on.", provider=proxy, cwd=workdir)
        assert_ok(again)
        resumed_exchange = proxy.chats[1]
        accepted([resumed_exchange])
        assert sent_messages(resumed_exchange) == [*stored, {"role": "user", "content": "Go on."}]
        assert disk_messages(session_file(workdir, session_id)) == [
            *sent_messages(resumed_exchange),
            assistant_of(resumed_exchange),
        ]
