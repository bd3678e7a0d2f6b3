"""An MCP server for tests/test_mcp_sandbox_production.py: MCP over stdio (JSON-RPC 2.0,
one JSON object a line), well-behaved or hostile as its plan says.

    python tests/mcp_server_for_production.py PLAN.json

The plan is a JSON object; every key is optional.
  "pid": a file it writes its pid to, and its child's after it (with "child"), once it runs;
  "log": a file it appends every line it receives to, as it came;
  "marker": a file it writes "started" to at start (what a changed server would do first);
  "child": true: it starts `sleep 60` in its process group, a grandchild of the agent;
  "stderr": strings written to its stderr when initialize arrives, each as given (latin-1);
  "stderr_flood": bytes of "A" written to stderr without a newline when initialize
      arrives, then "\\nEND-OF-FLOOD\\n";
  "stderr_close": true: after those writes its stderr is closed (its last words are said);
  "spam": {"when": FIFO, "lines": N, "done": FILE}: once something opens the FIFO for writing,
      a thread writes N lines of 450 characters to stderr, then "done" to FILE;
  "tools": the tools it lists (by default one, "echo", read-only);
  "page": tools per tools/list page (by default all in one);
  "endless": N: every tools/list page has N new tools and a nextCursor, the list never ends;
  "calls": what tools/call does, by tool name (by default "echo"):
      "echo": a text result: "<name> got <arguments as JSON>";
      "stall": never answers (it goes on reading: a cancel is logged);
      "structured": a result with only structuredContent, {"answer": 42, "unit": "°C"};
      "is_error": a text result "it failed" marked isError;
      "string_id": the answer's id is the request's, written as a string;
      "hugeline": a line of 17 MiB, with its newline at the end.
Whatever happens it ends after 60 s (SIGALRM), and when its stdin closes it ends too.
"""

import json
import os
import signal
import subprocess
import sys
import threading

ECHO = {
    "name": "echo",
    "description": "Says what it was given.",
    "inputSchema": {"type": "object", "properties": {}},
    "annotations": {"readOnlyHint": True},
}
plan: dict = {}


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
    if plan.get("log"):
        with open(plan["log"], "ab") as file:
            file.write(line if line.endswith(b"\n") else line + b"\n")
    return json.loads(line)


def say_on_stderr() -> None:
    for line in plan.get("stderr", []):
        os.write(2, line.encode("latin-1"))
    if size := plan.get("stderr_flood"):
        block = b"A" * (1 << 20)
        while size > 0:
            os.write(2, block[: min(size, len(block))])
            size -= len(block)
        os.write(2, b"\nEND-OF-FLOOD\n")
    if plan.get("stderr_close"):
        os.close(2)


def spam(how: dict) -> None:
    with open(how["when"], "rb"):  # waits for a writer: the test's go
        pass
    line = b"log line of a server that talks a lot " + b"." * 412 + b"\n"  # 450 characters and its newline
    for _ in range(how["lines"]):
        os.write(2, line)
    with open(how["done"], "w") as file:
        file.write("done\n")


def call(request: dict) -> None:
    params = request.get("params") or {}
    name, arguments = params.get("name"), params.get("arguments")
    how = plan.get("calls", {}).get(name, "echo")
    result: dict = {"content": [{"type": "text", "text": f"{name} got {json.dumps(arguments)}"}]}
    answer_id = request["id"]
    if how == "stall":
        return  # never answered; the loop goes on reading (and logging) what comes
    if how == "structured":
        result = {"structuredContent": {"answer": 42, "unit": "°C"}}
    elif how == "is_error":
        result = {"content": [{"type": "text", "text": "it failed"}], "isError": True}
    elif how == "string_id":
        answer_id = str(request["id"])
    elif how == "hugeline":
        write(b"x" * (17 * 1024 * 1024) + b"\n")
        return
    send({"jsonrpc": "2.0", "id": answer_id, "result": result})


def tools_page(params: dict) -> dict:
    number = int(params["cursor"].removeprefix("page-")) if params.get("cursor") else 0
    if endless := plan.get("endless"):
        tools = [
            {"name": f"p{number}_{n}", "description": "x" * 200, "inputSchema": {"type": "object"}}
            for n in range(endless)
        ]
        return {"tools": tools, "nextCursor": f"page-{number + 1}"}
    tools = plan.get("tools", [ECHO])
    size = plan.get("page") or max(len(tools), 1)
    page = {"tools": tools[number * size : (number + 1) * size]}
    if (number + 1) * size < len(tools):
        page["nextCursor"] = f"page-{number + 1}"
    return page


def main() -> None:
    with open(sys.argv[1]) as file:
        plan.update(json.load(file))
    signal.alarm(60)
    pids = [os.getpid()]
    if plan.get("child"):
        pids.append(subprocess.Popen(["sleep", "60"]).pid)
    if plan.get("spam"):
        threading.Thread(target=spam, args=(plan["spam"],), daemon=True).start()
    if plan.get("marker"):
        with open(plan["marker"], "w") as file:
            file.write("started\n")
    if plan.get("pid"):
        with open(plan["pid"], "w") as file:
            file.write(" ".join(map(str, pids)) + "\n")
    while (request := receive()) is not None:
        if "id" not in request or "method" not in request:
            continue  # a notification, or an answer to nothing it asked
        method, params = request["method"], request.get("params") or {}
        if method == "initialize":
            say_on_stderr()
            result = {"protocolVersion": params.get("protocolVersion"), "capabilities": {"tools": {}}}
        elif method == "tools/list":
            result = tools_page(params)
        elif method == "tools/call":
            call(request)
            continue
        else:
            result = {}
        send({"jsonrpc": "2.0", "id": request["id"], "result": result})


if __name__ == "__main__":
    main()
