"""Chapters 8 and 9: the fixed base prompt with cache figures, and the permission gate.

The real exercises/ex08/agent.py and exercises/ex09/agent.py run as
subprocesses against the fake provider. The full permission table is also
checked in-process against ex09's permission() and approved() functions; a
sample of it runs end to end, where the files on disk prove which commands
ran and which did not.
"""

from __future__ import annotations

import importlib.util
import io
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from conftest import program, run_agent, start_agent
from fake_provider import FakeProvider, Reply, text, tool_call, tool_calls

TASK = "Do the work."
NO_OUTPUT = "(command succeeded with no output)"
DENIED = "error: permission denied — the command matches a deny rule; it was not run"
REFUSED = "error: permission denied — the user did not approve this command"
PROMPT = re.compile(r"\n⚠  the model wants to run: (.*)\nallow\? \(y/N\) ")
SUMMARY = re.compile(r"^\[(\d+) rounds · last round input (\S+) tokens \((\S+) cached\) · finish_reason=(\w+)\]$")
ROUND = re.compile(r"^\[round (\d+) input (\S+) tokens, (\S+) cached\]$", re.MULTILINE)


def calls(*specs: tuple[str, str, dict | str], **kw) -> Reply:
    """Parallel tool calls with ids chosen by the test: (id, name, arguments)."""
    return tool_calls([(name, args) for _, name, args in specs], ids=[cid for cid, _, _ in specs], **kw)


def bash_calls(*commands: tuple[str, str]) -> Reply:
    """One round of bash calls: (call id, command)."""
    return calls(*[(cid, "bash", {"command": command}) for cid, command in commands])


def results(provider: FakeProvider) -> dict[str, str]:
    """Every tool result the model received, by tool_call_id (from the last request)."""
    return {m["tool_call_id"]: m["content"] for m in provider.chat_requests[-1]["messages"] if m["role"] == "tool"}


def assert_success(result: subprocess.CompletedProcess, stdout: str = "Done.\n") -> None:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stdout == stdout


def summary(stderr: str) -> tuple[str, ...]:
    lines = stderr.splitlines()
    assert len(lines) >= 2 and lines[-2] == "", stderr
    match = SUMMARY.match(lines[-1])
    assert match, stderr
    return match.groups()


# ================================================================ chapter 8: the base prompt


def test_system_prompt_and_tools_are_a_fixed_prefix(provider: FakeProvider, workdir: Path) -> None:
    (workdir / "notes.txt").write_text("hello\n", encoding="utf-8")
    provider.script(
        tool_call("read_file", {"path": "notes.txt"}, call_id="r"),
        tool_call("write_file", {"path": "notes.txt", "content": "bye\n"}, call_id="w"),
        tool_call("bash", {"command": "cat notes.txt"}, call_id="b"),
        text("Done."),
    )
    first = run_agent(8, "Change notes.txt", provider=provider, cwd=workdir)
    assert_success(first)
    provider.script(text("Done."))
    second = run_agent(8, "Something else entirely", provider=provider, cwd=workdir)
    assert_success(second)

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


@pytest.mark.parametrize("usage_style", ["deepseek", "openai"])
def test_cache_figures_per_round_and_in_the_summary(provider: FakeProvider, workdir: Path, usage_style: str) -> None:
    (workdir / "a.txt").write_text("a", encoding="utf-8")
    provider.script(
        tool_call("read_file", {"path": "a.txt"}, prompt_tokens=1200, cached_tokens=1024, usage_style=usage_style),
        tool_call("bash", {"command": "echo hi"}, prompt_tokens=1300, cached_tokens=1152, usage_style=usage_style),
        text("Done.", prompt_tokens=1450, cached_tokens=1280, usage_style=usage_style),
    )
    result = run_agent(8, TASK, provider=provider, cwd=workdir)
    assert_success(result)
    assert ROUND.findall(result.stderr) == [("1", "1200", "1024"), ("2", "1300", "1152")]
    assert summary(result.stderr) == ("3", "1450", "1280", "stop")
    assert len(provider.chat_requests) == 3


def test_no_usage_reported_is_not_a_crash(provider: FakeProvider, workdir: Path) -> None:
    (workdir / "a.txt").write_text("a", encoding="utf-8")
    provider.script(
        tool_call("read_file", {"path": "a.txt"}, usage_style="none"),
        text("Done.", usage_style="none"),
    )
    result = run_agent(8, TASK, provider=provider, cwd=workdir)
    assert_success(result)
    assert ROUND.findall(result.stderr) == [("1", "?", "0")]
    assert summary(result.stderr) == ("2", "?", "0", "stop")


def test_cached_tokens_reads_either_field(tmp_path: Path) -> None:
    # The fake's DeepSeek style also sends prompt_tokens_details, so end to
    # end cannot tell which field was read; here each one alone must do.
    ex08 = load_chapter(8, tmp_path)
    try:
        usage = openai.types.CompletionUsage
        base = {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105}
        assert ex08.cached_tokens(usage(**base, prompt_cache_hit_tokens=64)) == 64  # DeepSeek
        assert ex08.cached_tokens(usage(**base, prompt_tokens_details={"cached_tokens": 32})) == 32  # OpenAI
        assert ex08.cached_tokens(usage(**base)) == 0
        assert ex08.cached_tokens(None) == 0
    finally:
        sys.modules.pop(ex08.__name__, None)


# ================================================================ chapter 9: the permission gate, in-process


def load_chapter(chapter: int, directory: Path):
    """A chapter's agent.py as a module. It reads .env from the current
    directory at import, so it is imported from an empty one."""
    here = os.getcwd()
    os.chdir(directory)
    try:
        spec = importlib.util.spec_from_file_location(f"agent_ex{chapter:02d}_under_test", program(chapter))
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    finally:
        os.chdir(here)
    return module


@pytest.fixture(scope="module")
def ex09(tmp_path_factory: pytest.TempPathFactory):
    module = load_chapter(9, tmp_path_factory.mktemp("import"))
    yield module
    sys.modules.pop(module.__name__, None)


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


def test_permission_table(ex09) -> None:
    got = [(command, ex09.permission(command)) for command in dict(PERMISSION_TABLE)]
    assert got == PERMISSION_TABLE


def test_permission_does_not_depend_on_rule_order(ex09, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DENY", "ASK", "ALLOW"):
        monkeypatch.setattr(ex09, name, list(reversed(getattr(ex09, name))))
    got = [(command, ex09.permission(command)) for command in dict(PERMISSION_TABLE)]
    assert got == PERMISSION_TABLE


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
    ex09, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, answer: str, approves: bool
) -> None:
    stdin = io.StringIO(answer)
    monkeypatch.setattr(sys, "stdin", stdin)
    assert ex09.approved("rm -rf build") is approves
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


@pytest.mark.parametrize("answer", ["y", "n", "EOF"])
def test_gate_end_to_end(provider: FakeProvider, workdir: Path, answer: str) -> None:
    gate_workdir(workdir)
    asks = [command for _, command, level, _ in GATE_SAMPLE if level == "ask"]
    stdin = "" if answer == "EOF" else f"{answer}\n" * len(asks)
    provider.script(bash_calls(*[(cid, command) for cid, command, _, _ in GATE_SAMPLE]), text("Done."))
    result = run_agent(9, TASK, provider=provider, cwd=workdir, stdin=stdin)
    assert_success(result)  # refusals are tool results: the loop went on
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


def test_each_answer_decides_its_own_command(provider: FakeProvider, workdir: Path) -> None:
    answers = ["y", "n", "yes", "maybe", "", "N"]  # then EOF for the rest
    names = [f"made_{n}" for n in range(8)]
    provider.script(
        bash_calls(*[(name, f"touch {name}") for name in names]),
        bash_calls(("later", "touch made_later")),  # a later round still asks, and EOF refuses
        text("Done."),
    )
    result = run_agent(9, TASK, provider=provider, cwd=workdir, stdin="".join(f"{a}\n" for a in answers))
    assert_success(result)
    assert PROMPT.findall(result.stderr) == [f"touch {name}" for name in names] + ["touch made_later"]
    got = results(provider)
    approved = {"made_0", "made_2"}
    for name in [*names, "later"]:
        file = workdir / (name if name != "later" else "made_later")
        assert file.exists() == (name in approved), name
        assert got[name] == (NO_OUTPUT if name in approved else REFUSED), (name, got[name])


def read_stderr_until(agent: subprocess.Popen, needle: bytes, seen: bytearray, timeout: float = 60) -> None:
    """Read the agent's stderr into `seen` until it contains needle `count` times."""
    deadline = time.monotonic() + timeout
    count = seen.count(needle) + 1
    while seen.count(needle) < count:
        left = deadline - time.monotonic()
        assert left > 0, f"no {needle!r} on stderr: {seen.decode(errors='replace')}"
        ready, _, _ = select.select([agent.stderr], [], [], left)
        if ready:
            chunk = os.read(agent.stderr.fileno(), 65536)
            assert chunk, f"stderr closed before {needle!r}: {seen.decode(errors='replace')}"
            seen += chunk


def test_a_command_reading_stdin_does_not_eat_the_next_answer(provider: FakeProvider, workdir: Path) -> None:
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
    agent = start_agent(9, TASK, provider=provider, cwd=workdir)
    seen = bytearray()
    try:
        read_stderr_until(agent, b"allow? (y/N) ", seen)
        agent.stdin.write(b"y\n")
        agent.stdin.flush()
        ready, _, _ = select.select([reader], [], [], 60)
        assert ready and os.read(reader, 100) == b"go\n", "the first command never started"
        agent.stdin.write(b"y\n")  # meant for the second prompt
        agent.stdin.flush()
        stdout, stderr = agent.communicate(timeout=60)
    finally:
        os.close(reader)
        if agent.poll() is None:
            agent.kill()
            agent.communicate()
    stderr = (bytes(seen) + stderr).decode()
    assert agent.returncode == 0, stderr
    assert stdout == b"Done.\n"
    assert PROMPT.findall(stderr) == ["echo go > started && head -c 5", "touch made_second"]
    got = results(provider)
    assert got["reader"] == NO_OUTPUT, got["reader"]
    assert got["second"] == NO_OUTPUT, got["second"]
    assert (workdir / "made_second").exists()
