"""Child process for the save benchmarks: agent.py loaded in-process, real syscalls.

    python save_child.py AGENT_PY io SESSION_ID        one save of one new round; /proc/self/io around it
    python save_child.py AGENT_PY time ID_SMALL ID_BIG N   median save time into each session, N saves each
    python save_child.py AGENT_PY resume SESSION_ID       in-process: a bare json.loads pass vs open_session(),
                                                          sendable() and serializing the request's messages

Run it with the working directory set to the directory that holds .sessions/
(agent.py fixes WORKDIR = Path.cwd() when it is imported). It prints one JSON
object on stdout. In "io" mode it writes the markers @@BEGIN and @@END to
stderr right around the save, so an strace log can be cut to exactly that save.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import sys
import time


def load_agent(path: str):
    spec = importlib.util.spec_from_file_location("agent_under_bench", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # @dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def new_round(number: int) -> list[dict]:
    """One round as run() saves it: an assistant message with a tool call, and its result."""
    call_id = f"call_00_bench{number:016d}"
    arguments = json.dumps({"path": "notes.txt"})
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "read_file", "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "名字: 小明\n" * 40},
    ]


def proc_io() -> dict[str, int]:
    with open("/proc/self/io", "rb", buffering=0) as file:
        text = file.read().decode()
    return {key: int(value) for key, value in (line.split(": ") for line in text.splitlines())}


def io_mode(agent, session_id: str) -> dict:
    fsyncs = [0]
    if os.environ.get("BENCH_COUNT_FSYNC"):  # no strace: count the calls the agent makes
        real_fsync = os.fsync

        def counting_fsync(fd: int) -> None:
            fsyncs[0] += 1
            real_fsync(fd)

        os.fsync = counting_fsync
    session = agent.open_session(session_id)
    history_length = len(session.history)
    session.history += new_round(1)
    expected = sum(len(agent.record_line({"type": "message", "message": m})) for m in session.history[-2:])
    size_before = os.fstat(session.fd).st_size
    os.write(2, b"@@BEGIN\n")
    before = proc_io()
    session.save()
    after = proc_io()
    os.write(2, b"@@END\n")
    return {
        "history": history_length,
        "new_bytes": expected,
        "wchar": after["wchar"] - before["wchar"],
        "syscw": after["syscw"] - before["syscw"],
        "grown": os.fstat(session.fd).st_size - size_before,
        "fsyncs_counted": fsyncs[0],
        "fd": session.fd,
    }


def time_mode(agent, small_id: str, big_id: str, count: int) -> dict:
    sessions = [agent.open_session(small_id), agent.open_session(big_id)]
    lengths = [len(s.history) for s in sessions]
    times: list[list[float]] = [[], []]
    for number in range(count + 5):  # the first 5 warm up and are not counted
        for which in (0, 1) if number % 2 else (1, 0):  # alternate the order: drift hits both
            session, length = sessions[which], lengths[which]
            session.history += new_round(number)
            start = time.perf_counter()
            session.save()
            elapsed = time.perf_counter() - start
            if number >= 5:
                times[which].append(elapsed)
            # Back to the original history, so every save is made with a history of that length.
            # The file keeps the appended rounds (both grow alike): truncating it back after
            # every save would measure ext4's ftruncate-then-append path, not a save.
            del session.history[length:]
            session.saved = length
    for session in sessions:
        os.close(session.fd)
    return {
        "lengths": lengths,
        "median": [statistics.median(t) for t in times],
        "p10": [statistics.quantiles(t, n=10)[0] for t in times],
        "p90": [statistics.quantiles(t, n=10)[-1] for t in times],
    }


def resume_mode(agent, session_id: str, repeats: int = 3) -> dict:
    path = agent.SESSIONS / f"{session_id}.jsonl"

    def bare() -> None:
        with open(path, "rb") as file:
            [json.loads(line) for line in file]

    def load() -> None:
        session = agent.open_session(session_id)
        os.close(session.fd)  # and its lock: the next repeat opens it again
        holder[:] = [session.history]

    holder: list = []
    steps = {
        "bare": bare,
        "open_session": load,
        "sendable": lambda: holder.append(agent.sendable(holder[0])),
        # What the SDK then does with the messages (openai._utils._json.openapi_dumps).
        "serialize": lambda: json.dumps(holder[-1], ensure_ascii=False, separators=(",", ":")).encode(),
    }
    best = {name: float("inf") for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def main() -> None:
    agent = load_agent(sys.argv[1])
    mode = sys.argv[2]
    if mode == "io":
        result = io_mode(agent, sys.argv[3])
    elif mode == "resume":
        result = resume_mode(agent, sys.argv[3])
    else:
        result = time_mode(agent, sys.argv[3], sys.argv[4], int(sys.argv[5]))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
