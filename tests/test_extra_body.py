"""The request trick agent.py relies on: messages=[] plus extra_body={"messages": history}.

Given messages=history, the openai SDK walks every message against its type
hints before sending, which costs seconds on a long session. agent.py passes an
empty list instead and hands the history over in extra_body, counting on the
SDK to merge extra_body over the top level of the JSON body, so that the
history replaces the empty list. An SDK release that merged differently (or
refused the duplicate) would send conversations without their history, so one
test calls the SDK directly the way agent.py does, and one runs agent.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import openai

from conftest import run_agent
from fake_provider import FakeProvider, text
from helpers import SESSION_ID, assert_ok, call, put_session, resumed, session_bytes

HISTORY = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Read notes.txt — 笔记\u2028please"},
    {
        "role": "assistant",
        "content": None,
        "reasoning_content": "I should read it first.",
        "tool_calls": [call("call_00_x", "read_file", '{"path":  "notes.txt"}')],
    },
    {"role": "tool", "tool_call_id": "call_00_x", "content": "名字: 小明 🎉\n"},
    {"role": "assistant", "content": "Your name is 小明."},
]


def top_level_keys(raw: bytes) -> list[str]:
    """The keys of a JSON object in the order sent, duplicates included."""
    return [key for key, _ in json.loads(raw, object_pairs_hook=lambda pairs: pairs)]


def test_the_sdk_sends_extra_body_messages_in_place_of_the_empty_list(provider: FakeProvider) -> None:
    provider.script(text("ok"))
    client = openai.OpenAI(base_url=provider.url, api_key="x", max_retries=0)
    history = [*HISTORY, {"role": "user", "content": "And now?"}]
    stream = client.chat.completions.create(
        model="test-model",
        max_tokens=64,
        messages=[],
        extra_body={"messages": history},
        stream=True,
        stream_options={"include_usage": True},
    )
    answer = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert answer == "ok"

    [request] = provider.requests
    assert request["body"]["messages"] == history
    assert top_level_keys(request["raw"]).count("messages") == 1, request["raw"][:300]
    assert request["body"]["model"] == "test-model" and request["body"]["stream"] is True


def test_a_resumed_session_sends_its_whole_history(provider: FakeProvider, workdir: Path) -> None:
    put_session(workdir, session_bytes(*HISTORY))
    provider.script(text("Still 小明."))
    result = run_agent("final", "-c", SESSION_ID, "What is my name again?", provider=provider, cwd=workdir)
    assert_ok(result, stdout="Still 小明.\n")
    assert resumed(result.stderr) == (SESSION_ID, len(HISTORY))

    [request] = provider.requests
    assert request["body"]["messages"] == [*HISTORY, {"role": "user", "content": "What is my name again?"}]
    assert top_level_keys(request["raw"]).count("messages") == 1, request["raw"][:300]
