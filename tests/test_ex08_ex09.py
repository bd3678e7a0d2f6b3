"""Chapters 8 and 9: the fixed base prompt with cache figures, and the permission gate.

The real exercises/ex08/agent.py and exercises/ex09/agent.py run as
subprocesses against the fake provider, and so does agent.py ("final"), which
inherits both. The full permission table is also checked in-process against
permission() and approved(); a sample of it runs end to end, where the files
on disk prove which commands ran and which did not.
"""

from __future__ import annotations

import io
import itertools
import os
import re
import select
import sys
from pathlib import Path

import openai
import pytest

from conftest import run_agent
from fake_provider import FakeProvider, text, tool_call
from helpers import ROUND_USAGE, Live, assert_ok, bash_calls, calls, chapter_output, results, summary

TASK = "Do the work."
NO_OUTPUT = "(command succeeded with no output)"
DENIED = "error: permission denied — the command matches a deny rule; it was not run"
REFUSED = "error: permission denied — the user did not approve this command"
PROMPT = re.compile(r"\n⚠  the model wants to run: (.*)\nallow\? \(y/N\) ")
chapter_8 = pytest.mark.parametrize("chapter", [8, "final"])
chapter_9 = pytest.mark.parametrize("chapter", [9, "final"])


# ================================================================ chapter 8: the base prompt


@chapter_8
def test_system_prompt_and_tools_are_a_fixed_prefix(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    (workdir / "notes.txt").write_text("hello\n", encoding="utf-8")
    provider.script(
        tool_call("read_file", {"path": "notes.txt"}, call_id="r"),
        tool_call("write_file", {"path": "notes.txt", "content": "bye\n"}, call_id="w"),
        tool_call("bash", {"command": "cat notes.txt"}, call_id="b"),
        text("Done."),
    )
    first = run_agent(chapter, "Change notes.txt", provider=provider, cwd=workdir)
    assert_ok(first, stdout="Done.\n")
    provider.script(text("Done."))
    second = run_agent(chapter, "Something else entirely", provider=provider, cwd=workdir)
    assert_ok(second, stdout="Done.\n")

    requests = provider.chat_requests
    assert len(requests) == 5
    system = requests[0]["messages"][0]
    assert system["role"] == "system" and len(system["content"]) > 100, system
    for advice in ("edit_file", "sed -i", "bash"):  # what chapter 8's prompt teaches
        assert advice in system["content"], advice
    for request in requests:
        # Same text, first, in every request of both runs: the cacheable prefix.
        assert request["messages"][0] == system
        assert request["tools"] == requests[0]["tools"]
        assert sum(m["role"] == "system" for m in request["messages"]) == 1
    assert requests[0]["messages"][1] == {"role": "user", "content": "Change notes.txt"}
    assert requests[4]["messages"][1:] == [{"role": "user", "content": "Something else entirely"}]
    # The prefix stays put while the history grows behind it.
    tool_results = {m["tool_call_id"]: m["content"] for m in requests[3]["messages"] if m["role"] == "tool"}
    assert tool_results["r"] == "hello\n" and tool_results["b"] == "bye\n"
    assert tool_results["w"].startswith("wrote "), tool_results["w"]


@chapter_8
@pytest.mark.parametrize("usage_style", ["deepseek", "openai"])
def test_cache_figures_per_round_and_in_the_summary(
    provider: FakeProvider, workdir: Path, chapter: int | str, usage_style: str
) -> None:
    (workdir / "a.txt").write_text("a", encoding="utf-8")
    provider.script(
        tool_call("read_file", {"path": "a.txt"}, prompt_tokens=1200, cached_tokens=1024, usage_style=usage_style),
        tool_call("bash", {"command": "echo hi"}, prompt_tokens=1300, cached_tokens=1152, usage_style=usage_style),
        text("Done.", prompt_tokens=1450, cached_tokens=1280, usage_style=usage_style),
    )
    result = chapter_output(chapter, run_agent(chapter, TASK, provider=provider, cwd=workdir))
    assert_ok(result, stdout="Done.\n")
    assert ROUND_USAGE.findall(result.stderr) == [("1", "1200", "1024"), ("2", "1300", "1152")]
    assert summary(chapter, result.stderr) == ("3", "1450", "1280", "stop")
    assert len(provider.chat_requests) == 3


@chapter_8
def test_no_usage_reported_is_not_a_crash(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    (workdir / "a.txt").write_text("a", encoding="utf-8")
    provider.script(
        tool_call("read_file", {"path": "a.txt"}, usage_style="none"),
        text("Done.", usage_style="none"),
    )
    result = chapter_output(chapter, run_agent(chapter, TASK, provider=provider, cwd=workdir))
    assert_ok(result, stdout="Done.\n")
    assert ROUND_USAGE.findall(result.stderr) == [("1", "?", "0")]
    assert summary(chapter, result.stderr) == ("2", "?", "0", "stop")


@pytest.mark.parametrize("loaded", [8, "final"], indirect=True)
def test_cached_tokens_reads_either_field(loaded) -> None:
    # The fake's DeepSeek style also sends prompt_tokens_details, so end to
    # end cannot tell which field was read; here each one alone must do.
    usage = openai.types.CompletionUsage
    base = {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105}
    assert loaded.cached_tokens(usage(**base, prompt_cache_hit_tokens=64)) == 64  # DeepSeek
    assert loaded.cached_tokens(usage(**base, prompt_tokens_details={"cached_tokens": 32})) == 32  # OpenAI
    assert loaded.cached_tokens(usage(**base)) == 0
    assert loaded.cached_tokens(None) == 0


# ================================================================ chapter 9: the permission gate, in-process

gate = pytest.mark.parametrize("loaded", [9, "final"], indirect=True)


PERMISSION_TABLE = [
    # allowed: starts with an allow rule as a whole word, nothing chained or redirected
    ("ls", "allow"),
    ("ls -la", "allow"),
    ("  ls  ", "allow"),
    ("pwd", "allow"),
    ("cat notes.txt", "allow"),
    ("echo hello", "allow"),
    ("git status", "allow"),
    ("git status --short", "allow"),
    # not a whole word
    ("lsof", "ask"),
    ("lsof -i", "ask"),
    ("catalog", "ask"),
    ("echoes", "ask"),
    ("pwdx", "ask"),
    ("git statusx", "ask"),
    # chaining, substitution, redirection
    ("ls && rm x", "ask"),
    ("ls; rm x", "ask"),
    ("ls | wc -l", "ask"),
    ("ls & rm x", "ask"),
    ("ls || rm x", "ask"),
    ("echo $(rm x)", "ask"),
    ("echo `rm x`", "ask"),
    ("echo $HOME", "ask"),
    ("ls (x)", "ask"),
    ("ls\nrm x", "ask"),
    ("echo x > f", "ask"),
    ("echo x >> f", "ask"),
    ("cat < f", "ask"),
    ("cat notes.txt>copy", "ask"),
    # ask rules
    ("rm -rf build", "ask"),
    ("sudo ls", "ask"),
    ("git push --force", "ask"),
    ("git push --force origin main", "ask"),
    ("curl https://example.com", "ask"),
    # no rule at all: ask
    ("make", "ask"),
    ("python -c 1", "ask"),
    ("touch f", "ask"),
    ("head -c 5", "ask"),
    ("git push", "ask"),
    ("", "ask"),
    # deny rules, and deny beats ask and allow
    ("rm -rf /", "deny"),
    ("rm -rf ~", "deny"),
    ("ls; rm -rf /", "deny"),
    ("echo rm -rf /", "deny"),
    ("echo rm -rf ~ > f", "deny"),
    ("sudo rm -rf /", "deny"),
    # ask beats allow
    ("echo sudo ls", "ask"),
    ("ls rm -rf build", "ask"),
    ("cat curl x", "ask"),
]


@gate
def test_permission_table(loaded) -> None:
    got = [(command, loaded.permission(command)) for command in dict(PERMISSION_TABLE)]
    assert got == PERMISSION_TABLE


LEVELS = {"deny": "DENY", "ask": "ASK", "allow": "ALLOW"}  # strongest first


@gate
def test_deny_beats_ask_beats_allow_whatever_the_rule_order(loaded, monkeypatch: pytest.MonkeyPatch) -> None:
    """One command matched by rules of several levels: the strongest level wins, wherever the matching
    rule sits in its list and whichever levels match. Every combination of levels, the matching rule
    first and last among rules that do not match; a command no rule matches is asked about."""
    command = "frob --all"
    others = {"DENY": ["shred -u /", "mkfs "], "ASK": ["chmod ", "dd "], "ALLOW": ["whoami", "date"]}
    checked = 0
    for matched in itertools.product([False, True], repeat=3):
        levels = [level for level, hit in zip(LEVELS, matched, strict=True) if hit]
        expected = levels[0] if levels else "ask"
        for placement in itertools.product(["first", "last"], repeat=3):
            for (level, name), where in zip(LEVELS.items(), placement, strict=True):
                rules = list(others[name])
                if level in levels:
                    rules.insert(0 if where == "first" else len(rules), "frob")
                monkeypatch.setattr(loaded, name, rules)
            got = loaded.permission(command)
            assert got == expected, (levels, placement, got)
            checked += 1
    assert checked == 64


@gate
@pytest.mark.parametrize(
    "answer, approves",
    [
        ("y\n", True),
        ("yes\n", True),
        ("y", True),  # the answer, then EOF
        ("yes\nmore\n", True),  # one line only is read
        ("n\n", False),
        ("no\n", False),
        ("\n", False),  # Enter: the default is No
        ("", False),  # EOF: nobody there
        ("yep\n", False),
        ("yes please\n", False),
        ("ok\n", False),
        ("n\ny\n", False),
    ],
)
def test_only_y_or_yes_approves(
    loaded, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, answer: str, approves: bool
) -> None:
    stdin = io.StringIO(answer)
    monkeypatch.setattr(sys, "stdin", stdin)
    assert loaded.approved("rm -rf build") is approves
    captured = capsys.readouterr()
    assert captured.out == ""
    prompt = "\n⚠  the model wants to run: rm -rf build\nallow? (y/N) "
    if answer:
        assert captured.err == prompt
    else:  # at EOF a note that the command was refused may follow
        assert captured.err.startswith(prompt), captured.err
    if answer.count("\n") > 1:
        assert stdin.read() == answer.split("\n", 1)[1], "read more than one line"


# ================================================================ chapter 9: the gate, end to end

# (call id, command, level, file the command creates when it runs or None)
# Each command shows in the result or on disk whether it ran.
GATE_SAMPLE = [
    ("allow_ls", "ls", "allow", None),
    ("allow_cat", "cat in.txt", "allow", None),
    ("allow_git", "git status", "allow", None),
    ("deny_root", "echo rm -rf / > made_deny_root", "deny", "made_deny_root"),
    ("deny_home", "ls; echo rm -rf ~ > made_deny_home", "deny", "made_deny_home"),
    ("ask_lsof", "lsof -v", "ask", None),
    ("ask_chain", "ls && touch made_chain", "ask", "made_chain"),
    ("ask_redirect", "echo x > made_redirect", "ask", "made_redirect"),
    ("ask_stdin", "cat < in.txt", "ask", None),
    ("ask_rm", "rm -rf build", "ask", None),
    ("ask_sudo", "sudo ls", "ask", None),
    ("ask_make", "make", "ask", None),
    ("ask_python", "python3 -c \"open('made_python', 'w')\"", "ask", "made_python"),
    ("ask_touch", "touch made_touch", "ask", "made_touch"),
]


def gate_workdir(workdir: Path) -> None:
    (workdir / "in.txt").write_text("inside\n", encoding="utf-8")
    (workdir / "build").mkdir()
    (workdir / "build" / "obj.o").write_bytes(b"\x7fELF")


@chapter_9
@pytest.mark.parametrize("answer", ["y", "n", "EOF"])
def test_gate_end_to_end(provider: FakeProvider, workdir: Path, chapter: int | str, answer: str) -> None:
    gate_workdir(workdir)
    asks = [command for _, command, level, _ in GATE_SAMPLE if level == "ask"]
    stdin = "" if answer == "EOF" else f"{answer}\n" * len(asks)
    provider.script(bash_calls(**{cid: command for cid, command, _, _ in GATE_SAMPLE}), text("Done."))
    result = run_agent(chapter, TASK, provider=provider, cwd=workdir, stdin=stdin)
    assert_ok(result, stdout="Done.\n")  # refusals are tool results: the loop went on
    assert len(provider.chat_requests) == 2

    # Only the ask-level commands were put to the user, in order.
    assert PROMPT.findall(result.stderr) == asks
    got = results(provider)
    runs = answer == "y"
    for cid, command, level, creates in GATE_SAMPLE:
        content = got[cid]
        ran = level == "allow" or (level == "ask" and runs)
        if level == "deny":
            assert content == DENIED, (command, content)
        elif not ran:
            assert content == REFUSED, (command, content)
        else:
            assert not content.startswith("error: permission denied"), (command, content)
        if creates:
            assert (workdir / creates).exists() == ran, (command, ran)
    assert got["allow_cat"] == "inside\n"
    assert "in.txt" in got["allow_ls"].split("\n")
    assert (workdir / "build").exists() != runs
    if runs:
        assert got["ask_stdin"] == "inside\n"


@chapter_9
def test_each_answer_decides_its_own_command(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    answers = ["y", "n", "yes", "maybe", "", "N"]  # then EOF for the rest
    names = [f"made_{n}" for n in range(8)]
    provider.script(
        bash_calls(**{name: f"touch {name}" for name in names}),
        bash_calls(later="touch made_later"),  # a later round still asks, and EOF refuses
        text("Done."),
    )
    result = run_agent(chapter, TASK, provider=provider, cwd=workdir, stdin="".join(f"{a}\n" for a in answers))
    assert_ok(result, stdout="Done.\n")
    assert PROMPT.findall(result.stderr) == [f"touch {name}" for name in names] + ["touch made_later"]
    got = results(provider)
    approved = {"made_0", "made_2"}
    for name in [*names, "later"]:
        file = workdir / (name if name != "later" else "made_later")
        assert file.exists() == (name in approved), name
        assert got[name] == (NO_OUTPUT if name in approved else REFUSED), (name, got[name])


@chapter_9
def test_a_command_reading_stdin_does_not_eat_the_next_answer(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    # The first command signals through a FIFO once it is running; only then
    # does the test type the second answer, so a command that shared the
    # agent's stdin would read it (and the second command would be refused).
    fifo = workdir / "started"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    provider.script(
        calls(
            ("reader", "bash", {"command": "echo go > started && head -c 5", "timeout": 5}),
            ("second", "bash", {"command": "touch made_second"}),
        ),
        text("Done."),
    )
    try:
        with Live(chapter, TASK, provider=provider, cwd=workdir) as agent:
            agent.wait_stderr("allow? (y/N) ")
            agent.write(b"y\n")
            ready, _, _ = select.select([reader], [], [], 60)
            assert ready and os.read(reader, 100) == b"go\n", "the first command never started"
            agent.write(b"y\n")  # meant for the second prompt
            result = agent.completed()
    finally:
        os.close(reader)
    assert_ok(result, stdout="Done.\n")
    assert PROMPT.findall(result.stderr) == ["echo go > started && head -c 5", "touch made_second"]
    got = results(provider)
    assert got["reader"] == NO_OUTPUT, got["reader"]
    assert got["second"] == NO_OUTPUT, got["second"]
    assert (workdir / "made_second").exists()
