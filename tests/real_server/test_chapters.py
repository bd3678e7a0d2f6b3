"""The book's chapters 1, 2, 3 and 5 against a real llama-server.

Chapters 1 to 3 declare no tools: they talk to a server with the plain chat
template, as a reader who just downloaded a GGUF would start one. Chapter 5
declares read_file, and its server has the tools template. As in
test_agent.py, the model's words are not checked, only what the programs do
with what llama-server sends.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from conftest import run_agent
from helpers import assert_ok, status_line

from .server import Proxy
from .test_agent import CUT_OFF, LLAMA_ID, NOTES, accepted, sent_messages


def test_chapter_1_one_call(chat_proxy: Proxy, workdir: Path) -> None:
    result = run_agent(1, "Say hello.", provider=chat_proxy, cwd=workdir)
    assert_ok(result)
    [exchange] = chat_proxy.chats
    accepted([exchange])
    assert "stream" not in exchange.received
    answer = exchange.json()
    choice, usage = answer["choices"][0], answer["usage"]
    assert choice["message"]["content"].strip()
    assert result.stdout == choice["message"]["content"] + "\n"
    assert result.stderr == "\n" + status_line(usage["prompt_tokens"], usage["completion_tokens"], "length") + "\n"


def test_chapter_2_streamed(chat_proxy: Proxy, workdir: Path) -> None:
    result = run_agent(2, "Say hello.", provider=chat_proxy, cwd=workdir)
    assert_ok(result)
    [exchange] = chat_proxy.chats
    accepted([exchange])
    assert exchange.received["stream"] is True
    text, usage = exchange.streamed_text(), exchange.usage()
    assert text.strip() and result.stdout == text + "\n"
    assert result.stderr == "\n" + status_line(usage["prompt_tokens"], usage["completion_tokens"], "length") + "\n"


def test_chapter_3_two_turns_at_the_prompt(chat_proxy: Proxy, workdir: Path) -> None:
    result = run_agent(3, provider=chat_proxy, cwd=workdir, stdin="My name is Xiaoming.\nWhat is my name?\nexit\n")
    assert_ok(result)
    one, two = chat_proxy.chats
    accepted([one, two])
    # The second turn resends the whole conversation: the system prompt, the first question and its answer.
    system = sent_messages(one)[0]
    assert system["role"] == "system"
    assert sent_messages(one) == [system, {"role": "user", "content": "My name is Xiaoming."}]
    assert sent_messages(two) == [
        *sent_messages(one),
        {"role": "assistant", "content": one.streamed_text()},
        {"role": "user", "content": "What is my name?"},
    ]
    assert result.stdout == one.streamed_text() + "\n" + two.streamed_text() + "\n"
    statuses = [status_line(e.usage()["prompt_tokens"], e.usage()["completion_tokens"], "length") for e in (one, two)]
    assert re.findall(r"\[input .*\]", result.stderr) == statuses


def test_chapter_5_tool_rounds(proxy: Proxy, workdir: Path) -> None:
    """A call cut off by max_tokens, then a whole one, then text: every request accepted."""
    (workdir / "notes.txt").write_text(NOTES)
    proxy.arguments = {"path": "notes.txt"}
    proxy.plan = ["cut", "call", "text"]
    result = run_agent(5, "What does notes.txt say?", provider=proxy, cwd=workdir)
    assert_ok(result)
    cut, call, text = proxy.chats
    accepted([cut, call, text])
    assert [e.finish_reason() for e in (cut, call, text)] == ["length", "tool_calls", "length"]
    cut_id, call_id = cut.tool_fragments()[0]["id"], call.tool_fragments()[0]["id"]
    assert LLAMA_ID.fullmatch(cut_id) and LLAMA_ID.fullmatch(call_id) and cut_id != call_id
    arguments = call.streamed_arguments()
    assert json.loads(arguments) == {"path": "notes.txt"}

    first_round = [
        {"role": "assistant", "content": None, "tool_calls": [tool_call(cut_id, "{}")]},
        {"role": "tool", "tool_call_id": cut_id, "content": CUT_OFF},
    ]
    second_round = [
        {"role": "assistant", "content": None, "tool_calls": [tool_call(call_id, arguments)]},
        {"role": "tool", "tool_call_id": call_id, "content": NOTES},
    ]
    task = [{"role": "user", "content": "What does notes.txt say?"}]
    assert sent_messages(cut) == task
    assert sent_messages(call) == [*task, *first_round]
    assert sent_messages(text) == [*task, *first_round, *second_round]
    assert "warning: the reply was cut off by max_tokens; its tool calls were not run" in result.stderr
    assert f"\n[round 2] read_file({arguments})\n" in result.stderr
    assert re.search(r"\n\[3 rounds · last round input \d+ tokens · finish_reason=length\]\n$", result.stderr)
    assert result.stdout == text.streamed_text() + "\n"


def tool_call(call_id: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": "read_file", "arguments": arguments}}
