"""The book's time server, for chapter 22: an MCP server with two tools.

It speaks MCP over stdio: JSON-RPC 2.0, one JSON object a line, requests on
stdin and answers on stdout. Its tools: current_time, the local date and time,
and days_between, the days from one date to another. It ends when stdin closes.

    {"mcpServers": {"time": {"command": "python", "args": ["../../exercises/ex22/timeserver.py"]}}}
"""

import json
import sys
from datetime import date, datetime

VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")  # the protocol versions it speaks, newest first
TOOLS = [
    {
        "name": "current_time",
        "description": "The current local date and time, and the day of the week.",
        "inputSchema": {"type": "object", "properties": {}},
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "days_between",
        "description": "The number of days from start to end (negative if end comes first).",
        "inputSchema": {
            "type": "object",
            "properties": {
                "start": {"type": "string", "description": "a date, YYYY-MM-DD"},
                "end": {"type": "string", "description": "a date, YYYY-MM-DD"},
            },
            "required": ["start", "end"],
        },
        "annotations": {"readOnlyHint": True},
    },
]


def call(name: str, arguments: dict) -> dict:
    """A tool's result: its text, and isError when it could not do what was asked."""
    if name == "current_time":
        return text(f"{datetime.now():%Y-%m-%d %H:%M:%S %A}")
    if name == "days_between":
        try:
            start, end = (date.fromisoformat(str(arguments.get(field))) for field in ("start", "end"))
        except ValueError:
            return text("start and end must be dates written YYYY-MM-DD", error=True)
        return text(f"{(end - start).days} days")
    return text(f"no tool named {name}", error=True)


def text(words: str, error: bool = False) -> dict:
    return {"content": [{"type": "text", "text": words}], "isError": error}


def answer(request: dict) -> dict | None:
    """The response to one message, or None for a notification (no id: nothing to answer)."""
    method, params = request.get("method"), request.get("params") or {}
    if "id" not in request:
        return None
    if method == "initialize":
        asked = params.get("protocolVersion")
        result = {
            "protocolVersion": asked if asked in VERSIONS else VERSIONS[0],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "timeserver", "version": "0.1"},
        }
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call":
        result = call(params.get("name"), params.get("arguments") or {})
    elif method == "ping":
        result = {}
    else:
        return {"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32601, "message": f"no method {method}"}}
    return {"jsonrpc": "2.0", "id": request["id"], "result": result}


def main() -> None:
    for line in sys.stdin:
        try:
            request = json.loads(line)
        except ValueError:
            continue  # not a message: nothing to answer
        if isinstance(request, dict) and (response := answer(request)) is not None:
            print(json.dumps(response), flush=True)


if __name__ == "__main__":
    main()
