"""A hostile MCP server for tests/test_ex22.py: it speaks MCP over stdio (JSON-RPC 2.0,
one JSON object a line) and misbehaves as its plan says.

    python tests/hostile_mcp.py PLAN.json

The plan is a JSON object; every key is optional.
  "pid": a file it writes its pid to (then its child's, with "child") as soon as it runs;
  "environ": a file it writes its environment to, as JSON;
  "session": a file it writes its session id and its process group id to;
  "log": a file it appends every message it receives to, one JSON a line;
  "signals": a file it appends the name of every stop signal it gets to (empty if none came);
  "ignore_term": true: after a SIGTERM it goes on, only SIGKILL stops it;
  "hold": true: when its stdin closes it does not end, it waits for a signal;
  "child": true: it starts `sleep 60` in its process group, a grandchild of the agent;
  "stderr": a line it writes to its stderr at start;
  "handshake": "stall" (initialize is never answered), or seconds to wait before it is;
  "version": the protocolVersion it answers (by default the one it is asked for);
  "tools": the tools it lists (by default one, "echo", not marked read-only);
  "page": tools per tools/list page (by default all in one); the cursors are "page-N";
  "endless": true: every page has a nextCursor, the list never ends;
  "calls": what tools/call does, by tool name (by default "echo"):
      "echo": a text result, the tool's name and its arguments;
      "stall": never answers;  "late": answers after 2 s;
      "crash": writes half a line and exits;
      "garbage": frames that are no JSON object first, then the answer;
      "flood": 3,000 lines that are no JSON, then the answer;
      "string_id": answers with the request's id written as a string;
      "ask": sends a ping, a request no client knows and a notification, and answers
             only once both requests are answered, with the answers it got;
      "huge": a text of about 1 MB;  "hugewide": the same in Chinese, 3 bytes a character;
      "hugeline": a line of 17 MiB that never ends;
      "is_error": a result marked isError;  "bad_content": content that is a number.
Whatever happens, it ends after 60 s (SIGALRM), so it cannot outlive a broken test for long.
"""

import json
import os
import signal
import subprocess
import sys
import time

VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
ECHO = {"name": "echo", "description": "Says what it was given.", "inputSchema": {"type": "object", "properties": {}}}
GARBAGE = [
    b"this is no JSON\n",
    b"[1, 2, 3]\n",
    b"42\n",
    b"null\n",
    b"\n",
    b"\xff\xfe not UTF-8\n",
    b"[" * 100_000 + b"\n",  # nested deeper than any parser recurses
]
FLOOD = 3000  # lines of "flood"
HUGE = "".join(f"line {n:06d}\n" for n in range(80_000))  # 960,000 characters
HUGE_WIDE = "".join(f"第{n:06d}行\n" for n in range(80_000))  # 720,000 characters, 1.1 MB
plan: dict = {}  # read from the file its first argument names, when it runs
SIGNALS_FILE: int | None = None  # the plan's "signals" file, open for appending from the start


def note(key: str, line: str) -> None:
    """Append a line to the plan's file `key`, if the plan names one; one write, so a reader sees it whole."""
    if plan.get(key):
        with open(plan[key], "a") as file:
            file.write(line + "\n")


def on_signal(number: int, frame: object) -> None:
    # One write to a file opened at the start: a handler that opened it could be too slow, on a
    # loaded machine, for the agent's grace between SIGTERM and SIGKILL, and the signal would go unseen.
    if SIGNALS_FILE is not None:
        os.write(SIGNALS_FILE, f"{signal.Signals(number).name}\n".encode())
    if not (number == signal.SIGTERM and plan.get("ignore_term")):
        os._exit(0)


def write(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def send(message: dict) -> None:
    write(json.dumps(message).encode() + b"\n")


def receive() -> dict | None:
    """The next message from the client; None once its end of the pipe closes."""
    line = sys.stdin.buffer.readline()
    if not line:
        return None
    note("log", line.decode().rstrip("\n"))
    return json.loads(line)


def wait_forever() -> None:
    while True:
        signal.pause()


def text(words: str, error: bool = False) -> dict:
    return {"content": [{"type": "text", "text": words}], "isError": error}


def call(request: dict) -> None:
    """Answer (or not) one tools/call as the plan says."""
    params = request.get("params") or {}
    name, arguments = params.get("name"), params.get("arguments")
    answer = {"jsonrpc": "2.0", "id": request["id"], "result": text(f"{name} got {json.dumps(arguments)}")}
    how = plan.get("calls", {}).get(name, "echo")
    if how == "stall":
        wait_forever()
    elif how == "late":
        time.sleep(2)
    elif how == "crash":
        write(b'{"jsonrpc": "2.0", "id": ')
        os._exit(3)
    elif how == "garbage":
        for frame in GARBAGE:
            write(frame)
        send({"jsonrpc": "2.0", "id": 999_999, "result": text("the answer to a request never made")})
        send({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "hi"}})
    elif how == "flood":
        write(b"no JSON at all\n" * FLOOD)
    elif how == "string_id":
        answer["id"] = str(request["id"])
    elif how == "ask":
        send({"jsonrpc": "2.0", "id": "ping-1", "method": "ping"})
        send({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 1, "progress": 1}})
        send({"jsonrpc": "2.0", "id": 7, "method": "sampling/createMessage", "params": {"messages": []}})
        answer["result"] = text(json.dumps([receive(), receive()]))
    elif how == "huge":
        answer["result"] = text(HUGE)
    elif how == "hugewide":
        answer["result"] = text(HUGE_WIDE)
    elif how == "hugeline":
        for _ in range(17):
            write(b"x" * (1024 * 1024))
        wait_forever()
    elif how == "is_error":
        answer["result"] = text("it failed", error=True)
    elif how == "bad_content":
        answer["result"] = {"content": 5}
    send(answer)


def tools_page(params: dict) -> dict:
    tools = plan.get("tools", [ECHO])
    size = plan.get("page") or max(len(tools), 1)
    number = int(params["cursor"].removeprefix("page-")) if params.get("cursor") else 0
    page = {"tools": tools[number * size : (number + 1) * size]}
    if plan.get("endless") or (number + 1) * size < len(tools):
        page["nextCursor"] = f"page-{number + 1}"
    return page


def main() -> None:
    with open(sys.argv[1]) as file:
        plan.update(json.load(file))
    signal.alarm(60)
    if plan.get("signals"):
        global SIGNALS_FILE
        SIGNALS_FILE = os.open(plan["signals"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, on_signal)
    pids = [os.getpid()]
    if plan.get("child"):
        pids.append(subprocess.Popen(["sleep", "60"]).pid)
    if plan.get("environ"):
        with open(plan["environ"], "w") as file:
            json.dump(dict(os.environ), file)
    if plan.get("session"):
        note("session", f"{os.getsid(0)} {os.getpgrp()}")
    if plan.get("stderr"):
        print(plan["stderr"], file=sys.stderr, flush=True)
    note("pid", " ".join(map(str, pids)))
    while (request := receive()) is not None:
        if "id" not in request or "method" not in request:
            continue  # a notification, or an answer to nothing it asked
        method, params = request["method"], request.get("params") or {}
        if method == "initialize":
            if plan.get("handshake") == "stall":
                wait_forever()
            time.sleep(plan.get("handshake") or 0)
            asked = params.get("protocolVersion")
            version = plan.get("version") or (asked if asked in VERSIONS else VERSIONS[0])
            result = {"protocolVersion": version, "capabilities": {"tools": {}}, "serverInfo": {"name": "hostile"}}
        elif method == "tools/list":
            result = tools_page(params)
        elif method == "tools/call":
            call(request)
            continue
        elif method == "ping":
            result = {}
        else:
            send({"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32601, "message": f"no method {method}"}})
            continue
        send({"jsonrpc": "2.0", "id": request["id"], "result": result})
    if plan.get("hold"):
        wait_forever()


if __name__ == "__main__":
    main()
