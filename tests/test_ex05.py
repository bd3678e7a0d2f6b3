"""Chapter 5: the agent loop closes.

The real exercises/ex05/agent.py runs as a subprocess against the fake
provider, and so does agent.py ("final") for every behaviour it inherits: the
loop, parallel calls, tool errors going back to the model, the round limit.
The tests check what the user sees (stdout, stderr, exit code), what reached
the server (messages, tool results, tools declared) and the disk.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import assert_clean_failure, run_agent
from fake_provider import FakeProvider, Reply, error, text, tool_call, tool_calls
from helpers import (
    assert_ok,
    call,
    chapter_output,
    conversation,
    disk_messages,
    free_port,
    has_summary,
    round_lines,
    since,
    stderr_lines,
    summary,
    tool_messages,
)

CHAPTER = 5
both = pytest.mark.parametrize("chapter", [CHAPTER, "final"])
TASK = "What does notes.txt say?"


def run(
    chapter: int | str, provider: FakeProvider, workdir: Path, *replies: Reply, **env: str | None
) -> subprocess.CompletedProcess:
    """Run the program on TASK; what it printed, as chapter 5 prints it (see helpers.chapter_output)."""
    provider.script(*replies)
    return chapter_output(chapter, run_agent(chapter, TASK, provider=provider, cwd=workdir, **env))


# ---------------------------------------------------------------- the loop


@both
def test_a_single_round_reads_singular(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    """An answer with no tool call is one round: the summary says "1 round", not "1 rounds"."""
    result = run(chapter, provider, workdir, text("Nothing to read.", prompt_tokens=42))
    assert_ok(result)
    assert result.stderr.splitlines()[-1].startswith("[1 round · last round input 42 tokens")
    assert summary(chapter, result.stderr).rounds == "1"


@both
def test_one_tool_round_then_an_answer(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    (workdir / "notes.txt").write_text("buy milk\nwater the plants\n", encoding="utf-8")
    call_id = "call_00_JQSxFX1xOHGH6ajdpN88RMXO"
    result = run(
        chapter,
        provider,
        workdir,
        tool_call("read_file", {"path": "notes.txt"}, call_id=call_id, prompt_tokens=99),
        text("The notes say: buy milk.", prompt_tokens=1234, keepalive=2),
    )
    assert_ok(result)
    assert result.stdout == "The notes say: buy milk.\n"
    assert round_lines(result.stderr) == ['[round 1] read_file({"path": "notes.txt"})']
    found = summary(chapter, result.stderr)
    assert (found.rounds, found.tokens, found.finish) == ("2", "1234", "stop")

    requests = provider.chat_requests
    assert len(requests) == 2
    for request in requests:
        assert request["model"] == "test-model"
        assert request["max_tokens"] == 4096
        assert request["stream"] is True
        tools = {tool["function"]["name"]: tool for tool in request["tools"]}
        assert list(tools)[:1] == ["read_file"] and (chapter != CHAPTER or len(tools) == 1), list(tools)
        assert tools["read_file"]["type"] == "function"
        assert tools["read_file"]["function"]["parameters"]["required"] == ["path"]
    user = {"role": "user", "content": TASK}
    assert conversation(chapter, requests[0]["messages"]) == [user]
    assert conversation(chapter, requests[1]["messages"]) == [
        user,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call(call_id, "read_file", '{"path": "notes.txt"}')],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "buy milk\nwater the plants\n"},
    ]


@both
def test_kimi_usage_inside_the_choice_does_not_break_the_run(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    # Kimi puts usage inside choices[0] of the finish chunk, where the SDK does
    # not look, so chunk.usage stays empty. The agent reads only the standard
    # place, so the summary says "?" (documented in the README).
    usage_style = "kimi"
    (workdir / "notes.txt").write_text("hi", encoding="utf-8")
    result = run(
        chapter,
        provider,
        workdir,
        tool_call("read_file", {"path": "notes.txt"}, prompt_tokens=99, usage_style=usage_style),
        text("It says hi.", prompt_tokens=321, usage_style=usage_style),
    )
    assert_ok(result)
    assert result.stdout == "It says hi.\n"
    found = summary(chapter, result.stderr)
    assert (found.rounds, found.tokens, found.finish) == ("2", "?", "stop")


@both
@pytest.mark.parametrize(
    "style, finish, usage_style",
    [
        ("deepseek", "tool_calls", "deepseek"),
        # Ollama: whole calls, usage in a separate choices:[] chunk (as OpenAI);
        # old versions leave out the index and end tool turns with "stop".
        ("ollama", "tool_calls", "openai"),
        ("ollama-noindex", "stop", "openai"),
    ],
)
def test_parallel_tool_calls_answered_in_order(
    provider: FakeProvider, workdir: Path, chapter: int | str, style: str, finish: str, usage_style: str
) -> None:
    (workdir / "a.txt").write_text("alpha", encoding="utf-8")
    (workdir / "b.txt").write_text("beta", encoding="utf-8")
    # Odd spacing: the arguments must go back byte for byte, not re-encoded.
    raw = ['{ "path" : "a.txt" }', '{"path":"b.txt"}', '{"path": "nope.txt"}']
    ids = ["call_00_first", "call_01_second", "call_02_third"]
    result = run(
        chapter,
        provider,
        workdir,
        tool_calls(
            [("read_file", args) for args in raw],
            ids=ids,
            tool_style=style,
            finish=finish,
            usage_style=usage_style,
            prompt_tokens=50,
        ),
        text("Done.", usage_style=usage_style, prompt_tokens=77),
    )
    assert_ok(result)
    assert result.stdout == "Done.\n"
    assert round_lines(result.stderr) == [f"[round 1] read_file({args})" for args in raw]
    found = summary(chapter, result.stderr)
    assert (found.rounds, found.tokens, found.finish) == ("2", "77", "stop")

    messages = conversation(chapter, provider.chat_requests[1]["messages"])
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "tool"]
    assert messages[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [call(i, "read_file", args) for i, args in zip(ids, raw, strict=True)],
    }
    assert [m["tool_call_id"] for m in messages[2:]] == ids
    assert messages[2]["content"] == "alpha"
    assert messages[3]["content"] == "beta"
    assert messages[4]["content"].startswith("error: ") and "nope.txt" in messages[4]["content"]


@both
def test_text_before_tool_calls_is_shown_and_kept(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    (workdir / "notes.txt").write_text("hi there", encoding="utf-8")
    result = run(
        chapter,
        provider,
        workdir,
        tool_call("read_file", {"path": "notes.txt"}, call_id="call_1", content="Let me look at the file."),
        text("It says hi there."),
    )
    assert_ok(result)
    assert result.stdout == "Let me look at the file.\nIt says hi there.\n"
    messages = conversation(chapter, provider.chat_requests[1]["messages"])
    assert messages[1] == {
        "role": "assistant",
        "content": "Let me look at the file.",
        "tool_calls": [call("call_1", "read_file", '{"path": "notes.txt"}')],
    }
    assert messages[2] == {"role": "tool", "tool_call_id": "call_1", "content": "hi there"}


CUT_OFF = (
    "error: your reply was cut off by max_tokens before this call was complete, so it was not run; "
    "make the call again with shorter arguments"
)


@pytest.mark.parametrize("chapter", [CHAPTER, 11, "final"])
def test_a_reply_cut_off_by_max_tokens_runs_none_of_its_calls(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    """finish_reason "length": max_tokens struck while the model was still writing, so the last
    call's arguments are half-written JSON. No call of that reply runs, not even a whole one; each
    gets a result that says why, and goes back with "{}" as its arguments: a strict server refuses
    half-written JSON, and a session (chapter 11 on) never stores it."""
    (workdir / "notes.txt").write_text("buy milk\n", encoding="utf-8")
    half = '{"path": "notes.txt", "why": "the user wants to kn'
    result = run(
        chapter,
        provider,
        workdir,
        tool_calls(
            [("read_file", {"path": "notes.txt"}), ("read_file", half)],
            ids=["call_whole", "call_half"],
            finish="length",
        ),
        text("I will ask for less."),
    )
    assert_ok(result, stdout="I will ask for less.\n")
    assert round_lines(result.stderr) == []  # nothing ran
    warning = "warning: the reply was cut off by max_tokens; its tool calls were not run"
    assert [line for line in stderr_lines(result.stderr) if line.startswith("warning:")] == [warning]
    found = summary(chapter, result.stderr)
    assert (found.rounds, found.finish) == ("2", "stop")

    requests = provider.chat_requests
    assert len(requests) == 2
    cut_turn = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call("call_whole", "read_file", "{}"), call("call_half", "read_file", "{}")],
        },
        {"role": "tool", "tool_call_id": "call_whole", "content": CUT_OFF},
        {"role": "tool", "tool_call_id": "call_half", "content": CUT_OFF},
    ]
    assert conversation(chapter, requests[1]["messages"])[1:] == cut_turn
    if since(chapter, 11):
        [path] = (workdir / ".sessions").glob("*.jsonl")
        stored = disk_messages(path)
        assert stored[2:5] == cut_turn
        assert b"the user wants to kn" not in path.read_bytes()  # no half-written JSON on disk


# ---------------------------------------------------------------- tool errors go back to the model

# (tool name, raw arguments, a word the error must contain)
ARGUMENT_ERRORS = [
    ("read_file", '{"path": ', "JSON"),  # invalid JSON
    ("read_file", "[1]", "object"),  # JSON, not an object
    ("read_file", '"x"', "object"),
    ("write_file", '{"path": "notes.txt"}', "write_file"),  # unknown in chapter 5; agent.py: no content
    ("delete_file", '{"path": "notes.txt"}', "delete_file"),  # unknown everywhere
    ("read_file", '{"path": "missing.txt"}', "missing.txt"),
    ("read_file", '{"path": "subdir"}', "subdir"),  # a directory
    ("read_file", "{}", "path"),  # no path
    ("read_file", '{"path": 7}', "path"),  # path not a string
]


@both
def test_tool_errors_go_back_to_the_model(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    (workdir / "notes.txt").write_text("secret", encoding="utf-8")
    (workdir / "subdir").mkdir()
    calls = [(name, raw) for name, raw, _ in ARGUMENT_ERRORS]
    result = run(chapter, provider, workdir, tool_calls(calls), text("Noted."))
    assert_ok(result)
    assert result.stdout == "Noted.\n"
    assert round_lines(result.stderr) == [f"[round 1] {name}({raw})" for name, raw in calls]
    assert summary(chapter, result.stderr).rounds == "2"
    requests = provider.chat_requests
    assert len(requests) == 2
    ids = [call["id"] for call in conversation(chapter, requests[1]["messages"])[1]["tool_calls"]]
    tools = tool_messages(requests[1])
    assert [tool["tool_call_id"] for tool in tools] == ids
    for (name, raw, needle), tool in zip(ARGUMENT_ERRORS, tools, strict=True):
        content = tool["content"]
        assert content.startswith("error: ") and needle in content, (name, raw, content)
        assert "secret" not in content
    assert len({tool["content"] for tool in tools[:4]}) == 3  # the two non-objects may share a message


@both
def test_nul_in_path_is_an_error_not_a_crash(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    # JSON allows "\u0000"; open() then raises ValueError, not OSError.
    raw = '{"path": "bad\\u0000name.txt"}'
    result = run(chapter, provider, workdir, tool_call("read_file", raw, call_id="call_nul"), text("Noted."))
    assert_ok(result)
    assert result.stdout == "Noted.\n"
    [tool] = tool_messages(provider.chat_requests[1])
    assert tool["tool_call_id"] == "call_nul"
    assert tool["content"].startswith("error: "), tool


@both
def test_non_utf8_file_is_decoded_with_replacement(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    (workdir / "latin1.txt").write_bytes(b"\xff\xfe abc\ncaf\xe9\n")
    (workdir / "utf8.txt").write_bytes("héllo 你好\n".encode())
    result = run(
        chapter,
        provider,
        workdir,
        tool_calls([("read_file", {"path": "latin1.txt"}), ("read_file", {"path": "utf8.txt"})]),
        text("Read both."),
    )
    assert_ok(result)
    assert result.stdout == "Read both.\n"
    contents = [m["content"] for m in tool_messages(provider.chat_requests[1])]
    assert contents == ["\ufffd\ufffd abc\ncaf\ufffd\n", "héllo 你好\n"]


@both
def test_stops_after_ten_rounds(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    (workdir / "notes.txt").write_text("again", encoding="utf-8")
    loop = [tool_call("read_file", {"path": "notes.txt"}) for _ in range(10)]
    # An eleventh reply is scripted so that an eleventh request would succeed
    # (and be counted) instead of failing on an empty script. agent.py allows 50
    # rounds unless MAX_ROUNDS says otherwise; the chapter has no such setting.
    result = run(chapter, provider, workdir, *loop, text("never asked for"), MAX_ROUNDS="10")
    assert_clean_failure(result, "stopped: reached the 10-round limit")
    assert result.stdout == ""
    assert len(provider.chat_requests) == 10
    assert provider.remaining == 1
    assert round_lines(result.stderr) == [f'[round {n}] read_file({{"path": "notes.txt"}})' for n in range(1, 11)]
    assert not has_summary(result.stderr)
    # Every round's result went back: the tenth request holds nine answered calls.
    assert [m["content"] for m in tool_messages(provider.chat_requests[9])] == ["again"] * 9


@both
def test_deepseek_thinking_mode_gets_its_reasoning_back(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    provider.thinking = True  # a tool-call turn without reasoning_content is a 400
    (workdir / "notes.txt").write_text("hello", encoding="utf-8")
    reasoning = "The user wants the notes. I should read notes.txt."
    result = run(
        chapter,
        provider,
        workdir,
        tool_call("read_file", {"path": "notes.txt"}, call_id="call_t", reasoning=reasoning),
        text("The notes say hello.", reasoning="Now I can answer."),
    )
    assert_ok(result)
    assert result.stdout == "The notes say hello.\n"
    assert "I should read" not in result.stdout
    assistant = conversation(chapter, provider.chat_requests[1]["messages"])[1]
    assert assistant["role"] == "assistant"
    assert assistant["reasoning_content"] == reasoning
    assert assistant["tool_calls"] == [call("call_t", "read_file", '{"path": "notes.txt"}')]


# ---------------------------------------------------------------- failures users meet


@pytest.mark.parametrize("args", [(), ("  ",)], ids=["no-argument", "blank"])
def test_missing_task_prints_usage(provider: FakeProvider, workdir: Path, args: tuple[str, ...]) -> None:
    result = run_agent(CHAPTER, *args, provider=provider, cwd=workdir)
    assert_clean_failure(result, "usage")
    assert result.stdout == ""
    assert provider.chat_requests == []


@pytest.mark.parametrize(
    "env",
    [{"OPENAI_API_KEY": None}, {"MODEL": "  "}],
    ids=["no-key", "blank-model"],
)
def test_missing_configuration_prints_a_guide(provider: FakeProvider, workdir: Path, env: dict) -> None:
    result = run_agent(CHAPTER, TASK, provider=provider, cwd=workdir, **env)
    # A short guide (what to set, a DeepSeek and an Ollama example), so
    # several lines; the first one is the error.
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stdout == ""
    assert result.stderr.startswith("error: "), result.stderr
    for needle in ("OPENAI_API_KEY", "MODEL", "deepseek", "11434"):
        assert needle in result.stderr, (needle, result.stderr)
    assert "test-key-not-real" not in result.stderr
    assert provider.chat_requests == []


@pytest.mark.parametrize(
    "status, needles",
    [
        (401, ["Authentication Fails", "OPENAI_API_KEY"]),
        (402, ["Insufficient Balance", "balance"]),
        (404, ["not found", "MODEL"]),
        (429, ["Rate Limit Reached", "try again"]),
        (500, ["Server Error", "try again"]),
    ],
)
def test_http_errors_are_one_clear_line(provider: FakeProvider, workdir: Path, status: int, needles: list[str]) -> None:
    result = run(CHAPTER, provider, workdir, error(status))
    assert_clean_failure(result, f"HTTP {status}", *needles)
    assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1, result.stderr
    assert result.stdout == ""
    assert "test-key-not-real" not in result.stderr
    assert len(provider.chat_requests) == 1


@both
def test_http_error_after_a_tool_round(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    (workdir / "notes.txt").write_text("hello", encoding="utf-8")
    result = run(chapter, provider, workdir, tool_call("read_file", {"path": "notes.txt"}), error(500))
    assert_clean_failure(result, "HTTP 500", "Server Error")
    assert round_lines(result.stderr) == ['[round 1] read_file({"path": "notes.txt"})']
    assert result.stdout == ""
    assert len(provider.chat_requests) == 2
    assert [m["content"] for m in tool_messages(provider.chat_requests[1])] == ["hello"]


def test_connection_refused(workdir: Path) -> None:
    base_url = f"http://127.0.0.1:{free_port()}/v1"
    result = run_agent(CHAPTER, TASK, provider=None, cwd=workdir, OPENAI_BASE_URL=base_url)
    assert_clean_failure(result, base_url, "OPENAI_BASE_URL")
    assert result.stdout == ""


@pytest.mark.parametrize("cut_mode", ["broken", "close"])
def test_text_stream_cut_halfway(provider: FakeProvider, workdir: Path, cut_mode: str) -> None:
    answer = "The notes say many things about milk."
    # Events: role, five text pieces, finish. Cut after the role and two pieces.
    result = run(CHAPTER, provider, workdir, text(answer, pieces=5, cut_after=3, cut_mode=cut_mode))
    assert_clean_failure(result)
    assert result.stdout.strip() and answer.startswith(result.stdout.strip())
    assert result.stdout.strip() != answer
    assert not has_summary(result.stderr)
    assert len(provider.chat_requests) == 1


@both
@pytest.mark.parametrize("cut_mode", ["broken", "close"])
def test_tool_call_stream_cut_halfway(provider: FakeProvider, workdir: Path, chapter: int | str, cut_mode: str) -> None:
    (workdir / "notes.txt").write_text("hello", encoding="utf-8")
    # Events: role, first fragment, three argument pieces, finish. Cut inside the arguments.
    reply = tool_call("read_file", {"path": "notes.txt"}, cut_after=3, cut_mode=cut_mode)
    result = run(chapter, provider, workdir, reply, text("never asked for"))
    assert_clean_failure(result)
    assert round_lines(result.stderr) == []  # a half-received call is not run
    assert len(provider.chat_requests) == 1
    assert provider.remaining == 1


def test_stream_without_finish_reason_is_a_failure(provider: FakeProvider, workdir: Path) -> None:
    result = run(CHAPTER, provider, workdir, text("An answer that never says it is done", finish=None))
    assert_clean_failure(result)
    assert not has_summary(result.stderr)
    assert len(provider.chat_requests) == 1


def test_error_event_mid_stream(provider: FakeProvider, workdir: Path) -> None:
    result = run(CHAPTER, provider, workdir, text("Hello there, friend", error_after=2))
    assert_clean_failure(result, "stream interrupted by the fake provider")
    assert not has_summary(result.stderr)
