"""Chapter 7: bash is a privileged tool.

The real exercises/ex07/agent.py runs as a subprocess against the fake
provider; the model's bash calls are scripted. The tests check the tool
results that reached the server, the processes left behind, the agent's
memory, and the files on disk.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

from conftest import hermetic_env, program, run_agent, start_agent
from fake_provider import FakeProvider, Reply, text, tool_calls

CHAPTER = 7
TASK = "Run the commands."
NO_OUTPUT = "(command succeeded with no output)"
MARKER = re.compile(r"\A\[\.\.\. first (\d+) bytes truncated, showing the end \.\.\.\]\n")


def calls(*specs: tuple[str, str, dict | str], **kw) -> Reply:
    """Parallel tool calls with ids chosen by the test: (id, name, arguments)."""
    return tool_calls([(name, args) for _, name, args in specs], ids=[cid for cid, _, _ in specs], **kw)


def bash_calls(**commands: str | dict) -> Reply:
    """One round of bash calls, keyed by call id: a command string, or the full arguments."""
    return calls(
        *[(cid, "bash", spec if isinstance(spec, dict) else {"command": spec}) for cid, spec in commands.items()]
    )


def run(provider: FakeProvider, workdir: Path, *replies: Reply, stdin: str | None = None) -> dict[str, str]:
    """Run the agent to a "Done." answer; return every tool result the model got, by call id."""
    provider.script(*replies, text("Done."))
    result = run_agent(CHAPTER, TASK, provider=provider, cwd=workdir, stdin=stdin, timeout=120)
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stdout == "Done.\n"
    return results(provider)


def results(provider: FakeProvider) -> dict[str, str]:
    """Every tool result the model received, by tool_call_id (from the last request)."""
    return {m["tool_call_id"]: m["content"] for m in provider.chat_requests[-1]["messages"] if m["role"] == "tool"}


def split_marker(result: str) -> tuple[int, str]:
    """(K from the truncation marker, the text shown after it)."""
    match = MARKER.match(result)
    assert match, result[:200]
    return int(match.group(1)), result[match.end() :]


# ---------------------------------------------------------------- where and how commands run


def test_tool_is_declared_with_an_optional_integer_timeout(provider: FakeProvider, workdir: Path) -> None:
    run(provider, workdir, bash_calls(c1="true"))
    tools = {tool["function"]["name"]: tool["function"] for tool in provider.chat_requests[0]["tools"]}
    assert set(tools) == {"read_file", "write_file", "edit_file", "bash"}
    parameters = tools["bash"]["parameters"]
    assert parameters["required"] == ["command"]
    assert parameters["properties"]["command"]["type"] == "string"
    assert parameters["properties"]["timeout"]["type"] == "integer"
    # The model is told the limits it must respect.
    assert "30" in parameters["properties"]["timeout"]["description"]
    assert "120" in parameters["properties"]["timeout"]["description"]


def test_runs_in_the_start_directory_with_stdin_closed(provider: FakeProvider, workdir: Path) -> None:
    (workdir / "here.txt").write_text("x", encoding="utf-8")
    (workdir / "sub").mkdir()
    start = os.path.realpath(workdir)
    got = run(
        provider,
        workdir,
        bash_calls(
            pwd1="pwd",
            ls="ls",
            cd_root="cd / && pwd",
            pwd2="pwd",
            cd_sub="cd sub",
            pwd3="pwd",
            stdin_is="readlink /proc/self/fd/0",
            # The agent's own stdin holds text: a command must not read it.
            cat="cat",
            combined="echo out; echo err >&2; echo out2",
        ),
        bash_calls(pwd4="pwd"),  # a later round: still the start directory
        stdin="text meant for the agent, not for commands\n",
    )
    assert got["pwd1"] == got["pwd2"] == got["pwd3"] == got["pwd4"] == start + "\n", got
    assert got["ls"] == "here.txt\nsub\n"
    assert got["cd_root"] == "/\n"
    assert got["cd_sub"] == NO_OUTPUT
    assert got["stdin_is"] == "/dev/null\n"
    assert got["cat"] == NO_OUTPUT
    assert got["combined"] == "out\nerr\nout2\n"


def test_exit_status_is_information_not_failure(provider: FakeProvider, workdir: Path) -> None:
    got = run(
        provider,
        workdir,
        bash_calls(
            hi="echo hi; exit 3",
            silent_fail="exit 4",
            err_fail="echo oops >&2; exit 1",
            empty="true",
            no_newline="printf 'no newline'",
            missing="no_such_command_xyz",
        ),
    )
    assert got["hi"] == "hi\n[exit status 3]"
    assert got["silent_fail"] == "[exit status 4]"
    assert got["err_fail"] == "oops\n[exit status 1]"
    assert got["empty"] == NO_OUTPUT
    assert got["no_newline"] == "no newline"
    assert "no_such_command_xyz" in got["missing"] and got["missing"].endswith("\n[exit status 127]")
    assert not any(result.startswith("error:") for result in got.values()), got


def test_bash_walks_past_read_before_write(provider: FakeProvider, workdir: Path) -> None:
    # The chapter's lesson: the registry's rule binds the file tools only.
    target = workdir / "f.txt"
    target.write_bytes(b"old\n")
    got = run(
        provider,
        workdir,
        calls(
            ("w", "write_file", {"path": "f.txt", "content": "new\n"}),
            ("b", "bash", {"command": "echo x >> f.txt"}),
        ),
    )
    assert got["w"].startswith("error: ") and "read" in got["w"], got["w"]
    assert got["b"] == NO_OUTPUT
    assert target.read_bytes() == b"old\nx\n"


# ---------------------------------------------------------------- the timeout argument


def test_timeout_argument_is_validated(provider: FakeProvider, workdir: Path) -> None:
    bad = {"string": "5", "float": 1.5, "bool": True, "zero": 0, "negative": -1}
    good = {"one": 1, "max": 120}
    specs = {key: {"command": f"touch ran_{key}", "timeout": value} for key, value in {**bad, **good}.items()}
    specs["too_long"] = {"command": "touch ran_too_long", "timeout": 121}
    specs["default"] = {"command": "touch ran_default"}
    got = run(provider, workdir, bash_calls(**specs))
    for key in bad:
        assert got[key].startswith("error: ") and "timeout" in got[key], (key, got[key])
        assert not (workdir / f"ran_{key}").exists(), key
    assert got["too_long"].startswith("error: ") and "120" in got["too_long"], got["too_long"]
    assert "split" in got["too_long"], got["too_long"]
    assert not (workdir / "ran_too_long").exists()
    for key in [*good, "default"]:
        assert got[key] == NO_OUTPUT, (key, got[key])
        assert (workdir / f"ran_{key}").exists(), key


def live_processes(argv: list[str]) -> list[int]:
    """Pids of processes running exactly argv that are not zombies."""
    wanted = [arg.encode() for arg in argv]
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")[:-1]
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue  # gone meanwhile
        if cmdline == wanted and state != "Z":
            found.append(int(entry.name))
    return found


def test_timeout_kills_the_whole_process_group(provider: FakeProvider, workdir: Path) -> None:
    # A duration no other process on the machine uses, to find this run's sleeps.
    duration = f"61.{secrets.randbelow(10**6):06d}"
    command = f"echo started; sleep {duration} & sleep {duration}"
    provider.script(bash_calls(k={"command": command, "timeout": 1}), text("Done."))
    agent = start_agent(CHAPTER, TASK, provider=provider, cwd=workdir)
    try:
        # Time the tool round only (between the two requests), not Python's start-up.
        provider.wait_requests(1, timeout=60)
        started = time.monotonic()
        provider.wait_requests(2, timeout=90)
        elapsed = time.monotonic() - started
        stdout, stderr = (s.decode() for s in agent.communicate(timeout=60))
        assert agent.returncode == 0, (stdout, stderr)
        assert elapsed < 10, f"the tool round took {elapsed:.1f} s; the kill should come after about 1 s"
        assert (
            results(provider)["k"] == "error: command exceeded 1 s and was killed. Output before the kill:\nstarted\n"
        )
        # SIGKILL is delivered at once, but a dying process may show for a moment: poll briefly.
        deadline = time.monotonic() + 5
        while (survivors := live_processes(["sleep", duration])) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert survivors == [], "sleep processes from the killed command are still running"
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.communicate()
        for pid in live_processes(["sleep", duration]):  # only this test's own leftovers
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def test_default_timeout_is_30_seconds(provider: FakeProvider, workdir: Path) -> None:
    duration = f"67.{secrets.randbelow(10**6):06d}"
    got = run(provider, workdir, bash_calls(slow=f"echo started; sleep {duration}"))
    assert got["slow"] == "error: command exceeded 30 s and was killed. Output before the kill:\nstarted\n"


# ---------------------------------------------------------------- output: the tail, bounded


def test_long_output_keeps_a_line_aligned_tail(provider: FakeProvider, workdir: Path) -> None:
    full = "".join(f"{n}\n" for n in range(1, 100001)).encode()
    got = run(provider, workdir, bash_calls(seq="seq 1 100000", short="seq 1 3"))
    result = got["seq"]
    assert len(result.encode()) < 8.3 * 1024, len(result.encode())
    truncated, shown = split_marker(result)
    shown_bytes = shown.encode()
    assert full.endswith(shown_bytes)
    assert truncated == len(full) - len(shown_bytes)
    assert full[: len(full) - len(shown_bytes)].endswith(b"\n"), "the shown part starts mid-line"
    assert int(shown.split("\n", 1)[0]) > 90000
    assert shown.endswith("99999\n100000\n")
    assert len(shown_bytes) >= 8 * 1024 - len(b"100000\n"), "less than the 8 KiB cap shown"
    assert got["short"] == "1\n2\n3\n"  # under the cap: no marker


MEASURE = """\
import resource, subprocess, sys
code = subprocess.run(sys.argv[2:]).returncode
with open(sys.argv[1], "w") as out:
    out.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(code)
"""


def test_huge_output_keeps_memory_bounded(provider: FakeProvider, workdir: Path) -> None:
    size = 300_000_000
    provider.script(bash_calls(big=f"yes | head -c {size}"), text("Done."))
    # A helper process runs the agent and reports its children's peak RSS.
    rss_file = workdir.parent / "maxrss"
    result = subprocess.run(
        [sys.executable, "-c", MEASURE, str(rss_file), sys.executable, str(program(CHAPTER)), TASK],
        cwd=workdir,
        env=hermetic_env(provider, workdir.parent),
        input="",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert result.stdout == "Done.\n"
    peak_mb = int(rss_file.read_text()) / 1024  # Linux reports kilobytes
    assert peak_mb < 150, f"peak RSS {peak_mb:.0f} MB while a command printed {size // 10**6} MB"
    truncated, shown = split_marker(results(provider)["big"])
    assert shown and set(shown.split("\n")[:-1]) == {"y"} and shown.endswith("y\n")
    assert truncated == size - len(shown.encode())
    assert len(shown) >= 8 * 1024 - len(b"y\n")
