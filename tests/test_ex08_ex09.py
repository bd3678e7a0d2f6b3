"""Chapters 8 and 9: the fixed base prompt with cache figures, and the permission gate.

The real exercises/ex08/agent.py and exercises/ex09/agent.py run as
subprocesses against the fake provider, and so does agent.py ("final"), which
inherits both. The full permission table is also checked in-process against
permission(); a sample of it runs end to end, where the files on disk prove
which commands ran and which did not. Questions are answered at a
pseudo-terminal (conftest.Terminal), the only place approved() reads from, so
every check of approved() runs the real function in a process of its own.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import select
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from conftest import Terminal, hermetic_env, program, run_agent
from fake_provider import FakeProvider, text, tool_call
from helpers import (
    ROUND_USAGE,
    Live,
    assert_ok,
    bash_calls,
    calls,
    chapter_output,
    project_files,
    results,
    since,
    summary,
)

TASK = "Do the work."
NO_OUTPUT = "(command succeeded with no output)"
DENIED = "error: permission denied — the command matches a deny rule; it was not run"
REFUSED = "error: permission denied — the user did not approve this command"
PROMPT = re.compile(r"\n⚠  the model wants to run: (.*)\nallow\? \(y/N\) ")
NOBODY = "(no answer from a terminal: refused)"  # on stderr, when no answer came from a terminal
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


# agent.py asks about git status: git runs the programs its config names (core.fsmonitor),
# and a model that wrote .git/config would run code without a question (docs/security.md).
FINAL_LEVELS = {"git status": "ask", "git status --short": "ask"}


def level_in(chapter: int | str, command: str, level: str) -> str:
    """The level a command has in this program: chapter 9's table, with agent.py's changes."""
    return FINAL_LEVELS.get(command, level) if chapter == "final" else level


def chapter_of(module) -> int | str:
    return "final" if Path(module.__file__) == program("final") else 9


@gate
def test_permission_table(loaded) -> None:
    got = [(command, loaded.permission(command)) for command in dict(PERMISSION_TABLE)]
    chapter = chapter_of(loaded)
    assert got == [(command, level_in(chapter, command, level)) for command, level in PERMISSION_TABLE]


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


# ================================================================ chapter 9: approved(), at a terminal

# approved() imported from the chapter's program and called once per question, in a process
# whose controlling terminal is a conftest.Terminal. After each call it prints the verdict and
# what is left unread at the terminal (waiting for it only when the test says a line is left).
ASK_AT_TERMINAL = """\
import importlib.util, json, os, select, sys
spec = importlib.util.spec_from_file_location("agent_at_terminal", sys.argv[1])
agent = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = agent
spec.loader.exec_module(agent)
terminal = os.open("/dev/tty", os.O_RDONLY | os.O_NONBLOCK)
for line_left in json.loads(sys.argv[3]):
    verdict = agent.approved(sys.argv[2])
    left = os.read(terminal, 1000) if line_left and select.select([terminal], [], [], 10)[0] else b""
    print(json.dumps([verdict, left.decode()]), flush=True)
    print("--", file=sys.stderr, flush=True)
"""

# (what the person types at the question, approves?, the line left unread); \x04 is Ctrl-D
TYPED = [
    ("y\n", True, ""),
    ("yes\n", True, ""),
    ("  YES \n", True, ""),
    ("Y\n", True, ""),
    ("y\x04\x04", True, ""),  # y, then Ctrl-D twice: the answer, then end of input
    ("yes\nmore\n", True, "more\n"),  # one line only is read
    ("n\n", False, ""),
    ("no\n", False, ""),
    ("\n", False, ""),  # Enter: the default is No
    ("\x04", False, ""),  # Ctrl-D: end of input, nobody says yes
    ("yep\n", False, ""),
    ("yes please\n", False, ""),
    ("ok\n", False, ""),
    ("n\ny\n", False, "y\n"),
]


@chapter_9
def test_only_y_or_yes_at_the_terminal_approves(workdir: Path, chapter: int | str) -> None:
    command = "rm -rf build"
    prompt = f"\n⚠  the model wants to run: {command}\nallow? (y/N) "
    argv = [sys.executable, "-c", ASK_AT_TERMINAL, str(program(chapter)), command]
    argv.append(json.dumps([bool(left) for _, _, left in TYPED]))
    piped, pipe_in = os.pipe()
    os.write(pipe_in, b"y\n" * len(TYPED))  # a "y" for every question piped in: never an answer
    os.close(pipe_in)
    terminal = Terminal(hang_up=False)  # nothing is typed but what the test types
    try:
        process = subprocess.Popen(
            terminal.argv(argv),
            cwd=workdir,
            env=hermetic_env(None, workdir.parent),
            stdin=piped,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            for number, (keys, _, _) in enumerate(TYPED, start=1):
                terminal.wait_for("allow? (y/N)", count=number)
                terminal.type(keys)
            out, err = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate(timeout=30)
    finally:
        os.close(piped)
        terminal.close()
    assert process.returncode == 0, err.decode()
    got = [tuple(json.loads(line)) for line in out.decode().splitlines()]
    assert got == [(approves, left) for _, approves, left in TYPED]
    # The question goes to the terminal only: stderr holds just the note for an empty answer.
    notes = err.decode().split("--\n")
    assert notes[-1] == "" and len(notes) == len(TYPED) + 1, err.decode()
    assert notes[:-1] == [f"{NOBODY}\n" if keys == "\x04" else "" for keys, _, _ in TYPED], err.decode()
    assert terminal.text.count(prompt) == len(TYPED), terminal.text
    assert terminal.text.startswith(prompt), terminal.text


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
@pytest.mark.parametrize("answer", ["y", "n", "Ctrl-D", "no terminal"])
def test_gate_end_to_end(provider: FakeProvider, workdir: Path, chapter: int | str, answer: str) -> None:
    """Every question answered y, n or Ctrl-D at the terminal, or no terminal at all (cron, CI,
    setsid), while a "y" for every question is piped into stdin: `echo y | python agent.py ...`
    approves nothing, and with no terminal every question is refused."""
    gate_workdir(workdir)
    sample = [
        (cid, command, level_in(chapter, command, level), creates) for cid, command, level, creates in GATE_SAMPLE
    ]
    asks = [command for _, command, level, _ in sample if level == "ask"]
    typed = {"y": "y\n" * len(asks), "n": "n\n" * len(asks), "Ctrl-D": "", "no terminal": None}[answer]
    provider.script(bash_calls(**{cid: command for cid, command, _, _ in sample}), text("Done."))
    # A "y" for every question is piped in as well: it must never count as an answer.
    result = run_agent(chapter, TASK, provider=provider, cwd=workdir, stdin="y\n" * len(asks), answers=typed)
    assert_ok(result, stdout="Done.\n")  # refusals are tool results: the loop went on
    assert len(provider.chat_requests) == 2

    # Only the ask-level commands were put to the person at the terminal, in order; never on stderr.
    assert PROMPT.findall(result.terminal) == ([] if typed is None else asks)
    assert "allow?" not in result.stderr, result.stderr
    # Ctrl-D at each question, or no terminal at all: each refusal says why.
    assert result.stderr.count(NOBODY) == (len(asks) if answer in ("Ctrl-D", "no terminal") else 0), result.stderr
    got = results(provider)
    runs = answer == "y"
    for cid, command, level, creates in sample:
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
@pytest.mark.parametrize("answer", ["y", "n"])
def test_the_prompt_shows_exactly_what_runs(
    provider: FakeProvider, workdir: Path, chapter: int | str, answer: str
) -> None:
    """A carriage return and an erase-line sequence would redraw the question as `pytest -q`
    while the command before them ran; a bidi override would reorder what is shown. The
    question shows every control character escaped, and the command shown is the one that runs."""
    hidden = "echo pwned > PWNED.txt #\r\x1b[2Kpytest -q"  # after # the shell reads a comment
    reordered = "touch \u202eexe.txt"
    provider.script(bash_calls(hidden=hidden, reordered=reordered), text("Done."))
    result = run_agent(chapter, TASK, provider=provider, cwd=workdir, answers=f"{answer}\n" * 2)
    assert_ok(result, stdout="Done.\n")
    shown = PROMPT.findall(result.terminal)
    assert shown == ["echo pwned > PWNED.txt #\\r\\x1b[2Kpytest -q", "touch \\u202eexe.txt"], result.terminal
    raw = result.terminal.replace("\r\n", "\n")
    for character in ("\x1b", "\r", "\u202e"):
        assert character not in raw, (character, result.terminal)  # never sent to the terminal as it is
    # What runs is the command shown, escapes read back: nothing more, nothing less.
    assert [line.encode().decode("unicode_escape") for line in shown] == [hidden, reordered]
    made = project_files(chapter, workdir)
    if answer == "y":
        assert made == sorted(["PWNED.txt", "\u202eexe.txt"]), made
        assert (workdir / "PWNED.txt").read_text() == "pwned\n"
        assert results(provider) == {"hidden": NO_OUTPUT, "reordered": NO_OUTPUT}
    else:
        assert made == [], made
        assert results(provider) == {"hidden": REFUSED, "reordered": REFUSED}


@chapter_9
def test_each_answer_decides_its_own_command(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    answers = ["y", "n", "yes", "maybe", "", "N"]  # then Ctrl-D for the rest
    names = [f"made_{n}" for n in range(8)]
    provider.script(
        bash_calls(**{name: f"touch {name}" for name in names}),
        bash_calls(later="touch made_later"),  # a later round still asks, and Ctrl-D refuses
        text("Done."),
    )
    result = run_agent(chapter, TASK, provider=provider, cwd=workdir, answers="".join(f"{a}\n" for a in answers))
    assert_ok(result, stdout="Done.\n")
    assert PROMPT.findall(result.terminal) == [f"touch {name}" for name in names] + ["touch made_later"]
    assert result.stderr.count(NOBODY) == 3, result.stderr  # made_6, made_7, made_later
    got = results(provider)
    approved = {"made_0", "made_2"}
    for name in [*names, "later"]:
        file = workdir / (name if name != "later" else "made_later")
        assert file.exists() == (name in approved), name
        assert got[name] == (NO_OUTPUT if name in approved else REFUSED), (name, got[name])


@chapter_9
def test_a_running_command_cannot_take_the_next_answer(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    # The first command signals through a FIFO once it is running; only then does the
    # person type the answer to the second question, ahead of it. A command that could
    # read the agent's stdin or its terminal would take it, and the second question would
    # wait for an answer that never comes (the run is killed after 30 s and the test fails).
    # The command ends only when the test closes the gate, after typing: the line is typed
    # while it runs, however slow the machine (else it could come after the question).
    fifo, gate = workdir / "started", workdir / "gate"
    os.mkfifo(fifo)
    os.mkfifo(gate)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    opened_gate = os.open(gate, os.O_RDWR)  # never blocks (Linux); its close is the command's EOF
    command = "exec 3< gate; echo go > started && head -c 5; head -c 5 < /dev/tty; status=$?; cat <&3; exit $status"
    provider.script(
        calls(
            ("reader", "bash", {"command": command, "timeout": 5}), ("second", "bash", {"command": "touch made_second"})
        ),
        text("Done."),
    )
    try:
        with Live(
            chapter, TASK, provider=provider, cwd=workdir, stdin=b"n\n" * 10, answers="y\n", hang_up=False
        ) as agent:
            ready, _, _ = select.select([reader], [], [], 60)
            assert ready and os.read(reader, 100) == b"go\n", "the first command never started"
            agent.terminal.type("y\n")  # meant for the second question
            os.close(opened_gate)
            if since(chapter, 20):  # typed before the question, it is no answer to it: asked, the person says no
                agent.terminal.wait_for("allow? (y/N)", count=2)
                agent.terminal.type("n\n")
            result = agent.completed(timeout=30)
            shown = agent.terminal.text
    finally:
        os.close(reader)
        with contextlib.suppress(OSError):  # closed already, unless the test failed before
            os.close(opened_gate)
    assert_ok(result, stdout="Done.\n")
    assert PROMPT.findall(shown) == [command, "touch made_second"]
    got = results(provider)
    # stdin is /dev/null, and in a session of its own the command has no terminal to open.
    assert "/dev/tty" in got["reader"] and re.search(r"\n\[exit status [1-9]\d*\]$", got["reader"]), got["reader"]
    if since(chapter, 20):
        assert got["second"].startswith("error: permission denied"), got["second"]
        assert not (workdir / "made_second").exists()
    else:
        assert got["second"] == NO_OUTPUT, got["second"]
        assert (workdir / "made_second").exists()
