"""A fake browser's DevTools endpoint: websockets' own server on 127.0.0.1, for the tests.

It speaks CDP's framing (JSON-RPC over a websocket: calls with an id, answers
with that id, events with none) and serves /json/version, where a browser
names its websocket. What it answers is the test's to script:

    with FakeCDP() as cdp:                   # answers every call at once (`answer` below)
        ... the program, or its CDP class, connects to cdp.ws_url or cdp.http_url ...
        cdp.received                         # every call it got, in order

    def hold(call, connection): ...           # FakeCDP(hold): decide per call what goes back
        return [frame, ...]                  # answers and events, sent in this order; [] holds

A respond function gets each call and returns the frames to send for it (an
answer is {"id": ..., "result": ...} or {"id": ..., "error": ...}; an event has
no id; a str is sent as it is). It may keep calls and answer them later, from a
later call's frames, in any order; CLOSE in the list closes the connection there.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from websockets.sync.server import ServerConnection, serve

CLOSE = {"close": True}  # in a respond function's frames: close the connection at that point

Frames = list[dict]


def result(call: dict, value: dict | None = None) -> dict:
    """The answer to a call, with a result."""
    return {
        "id": call["id"],
        "result": value or {},
        **({"sessionId": call["sessionId"]} if "sessionId" in call else {}),
    }


def failure(call: dict, code: int, message: str) -> dict:
    """The answer to a call, with a protocol error."""
    return {"id": call["id"], "error": {"code": code, "message": message}}


def answer(call: dict, connection: ServerConnection) -> Frames:
    """A browser that does what it is asked: one tab, T1, attached as session S1; Runtime.evaluate
    gives 2 for "1 + 1" and a page's address for location.href; anything else an empty result."""
    method = call.get("method")
    if method == "Target.createTarget":
        return [result(call, {"targetId": "T1"})]
    if method == "Target.attachToTarget":
        return [result(call, {"sessionId": "S1"})]
    if method == "Runtime.evaluate":
        expression = call["params"].get("expression")
        values = {"1 + 1": 2, "location.href": "http://page.test/"}
        if expression in values:
            return [result(call, {"result": {"type": "number", "value": values[expression]}})]
        return [result(call, {"result": {"type": "number", "value": 1}})]
    return [result(call)]


class FakeCDP:
    def __init__(self, respond: Callable[[dict, ServerConnection], Frames] = answer) -> None:
        self.respond = respond
        self.received: list[dict] = []  # every call, in the order they came, over all connections
        self.connections = 0
        self.changed = threading.Condition()
        self.server = serve(self._handle, "127.0.0.1", 0, process_request=self._http)
        self.port = self.server.socket.getsockname()[1]
        self.http_url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/devtools/browser/fake"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _http(self, connection: ServerConnection, request: Any) -> Any:
        """/json/version, as a browser serves it; every other path goes on to the websocket."""
        if request.path == "/json/version":
            return connection.respond(200, json.dumps({"Browser": "Fake/1.0", "webSocketDebuggerUrl": self.ws_url}))
        return None

    def _handle(self, connection: ServerConnection) -> None:
        with self.changed:
            self.connections += 1
            self.changed.notify_all()
        for frame in connection:
            call = json.loads(frame)
            with self.changed:
                self.received.append(call)
                self.changed.notify_all()
            for reply in self.respond(call, connection):
                if reply is CLOSE:
                    connection.close()
                    return
                connection.send(reply if isinstance(reply, str) else json.dumps(reply))

    def methods(self) -> list[str]:
        with self.changed:
            return [call.get("method") for call in self.received]

    def wait_calls(self, count: int, timeout: float = 10) -> None:
        """Until `count` calls have come in all."""
        with self.changed:
            if not self.changed.wait_for(lambda: len(self.received) >= count, timeout):
                raise TimeoutError(f"{count} calls never came: {self.received}")

    def close(self) -> None:
        self.server.shutdown()

    def __enter__(self) -> FakeCDP:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
