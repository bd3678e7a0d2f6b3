"""Realistic session files for the benchmarks, built deterministically.

A conversation is a system prompt, then rounds: a user prompt, one to three
tool exchanges (an assistant message with tool_calls and the tool results, from
400 bytes to 5 KB of code, logs, Chinese, Japanese and accented text), then the
assistant's answer. About half the assistant messages carry DeepSeek's
reasoning_content, as a thinking model's do. Records are written exactly the way
agent.py writes them: json.dumps(..., ensure_ascii=False), one per line.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SYSTEM = "You are a coding agent working in the user's current directory.\n- Act through your tools."
# Code, logs, Chinese and Japanese prose, accents, an emoji: what tool results hold.
SNIPPETS = [
    "def load(path: Path) -> list[dict]:\n    return [json.loads(line) for line in path.open()]\n",
    "2026-11-29 08:40:45 INFO  server started on :8080 (pid 4711)\n",
    "名字: 小明。这个项目是一个命令行编码代理，会话保存在 .sessions/ 目录中。\n",
    "テストはすべて成功しました。次の変更を確認してください。\n",
    "café, naïve, Ünïcödé — “quoted” text ✓ 🙂\n",
    '    {"id": 17, "name": "widget", "tags": ["a", "b"], "price": 9.5}\n',
    "FAILED tests/test_sessions.py::test_resume - AssertionError: assert 3 == 4\n",
    "drwxr-xr-x  8 root root  4096 Nov 29 08:43 exercises\n",
]
TOOLS = ["read_file", "bash", "edit_file", "write_file"]


def _text(rng: random.Random, size: int) -> str:
    """At least size bytes (UTF-8) of tool-output-like text, less than a snippet more."""
    parts: list[str] = []
    total = 0
    while total < size:
        piece = rng.choice(SNIPPETS)
        parts.append(piece)
        total += len(piece.encode())
    return "".join(parts)


class Conversation:
    """Yields messages of a plausible agent conversation, forever."""

    def __init__(self, seed: int = 1) -> None:
        self.rng = random.Random(seed)
        self.calls = 0
        # A pool of pre-built texts keeps generating 50 MB fast; the mix stays varied.
        self.outputs = [_text(self.rng, self.rng.randint(400, 5000 - 150)) for _ in range(97)]  # 400 B to 5 KB
        self.prompts = [_text(self.rng, self.rng.randint(40, 400)) for _ in range(31)]
        self.answers = [_text(self.rng, self.rng.randint(100, 900)) for _ in range(37)]

    def _call(self) -> dict:
        self.calls += 1
        name = self.rng.choice(TOOLS)
        if name == "bash":
            args = {"command": "python -m pytest -q tests/test_sessions.py", "timeout": 60}
        elif name == "read_file":
            args = {"path": f"src/module_{self.calls % 40}.py"}
        else:
            args = {"path": f"src/module_{self.calls % 40}.py", "old_string": self.rng.choice(self.prompts)}
            args["new_string"] = self.rng.choice(self.prompts)
        return {
            "id": f"call_00_{self.calls:024d}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
        }

    def round(self, exchanges: int) -> list[dict]:
        """A user prompt, `exchanges` tool calls with their results, the answer: 2 + 2*exchanges messages."""
        out: list[dict] = [{"role": "user", "content": self.rng.choice(self.prompts)}]
        for _ in range(exchanges):
            call = self._call()
            assistant: dict = {"role": "assistant", "content": None, "tool_calls": [call]}
            if self.rng.random() < 0.5:
                assistant["reasoning_content"] = self.rng.choice(self.answers)
            out.append(assistant)
            out.append({"role": "tool", "tool_call_id": call["id"], "content": self.rng.choice(self.outputs)})
        answer = {"role": "assistant", "content": self.rng.choice(self.answers)}
        if self.rng.random() < 0.5:
            answer["reasoning_content"] = self.rng.choice(self.answers)
        out.append(answer)
        return out


def messages(count: int, seed: int = 1) -> list[dict]:
    """Exactly `count` messages (a system prompt first), ending on a complete round where possible."""
    conversation = Conversation(seed)
    out: list[dict] = [{"role": "system", "content": SYSTEM}][:count]
    while len(out) < count:
        left = count - len(out)
        if left >= 4:
            exchanges = min(conversation.rng.randint(1, 3), (left - 2) // 2)
            out += conversation.round(exchanges)
        else:  # 1 to 3 left: a user prompt, and the answer if there is room
            out += conversation.round(0)[:left]
            if left == 3:
                out.append({"role": "user", "content": "Thanks."})
    return out


def chat_messages(count: int, seed: int = 1) -> list[dict]:
    """`count` messages of a plain chat: short prompts and answers, no tools (about 250 B a message)."""
    rng = random.Random(seed)
    out: list[dict] = [{"role": "system", "content": SYSTEM}]
    while len(out) < count:
        role = "user" if len(out) % 2 else "assistant"
        out.append({"role": role, "content": _text(rng, rng.randint(60, 300))})
    return out[:count]


def body_of_size(size: int, seed: int = 1) -> tuple[bytes, int]:
    """(records, message count): whole rounds until the records take about `size` bytes."""
    conversation = Conversation(seed)
    lines = [record({"role": "system", "content": SYSTEM})]
    total = len(lines[0])
    while total < size:
        for message in conversation.round(conversation.rng.randint(1, 3)):
            lines.append(record(message))
            total += len(lines[-1])
    return b"".join(lines), len(lines)


def record(message: dict) -> bytes:
    """A message as agent.py stores it: one line."""
    return json.dumps({"type": "message", "message": message}, ensure_ascii=False).encode("utf-8") + b"\n"


def session_id(number: int) -> str:
    return f"20260101-{number // 1000000 % 100:02d}{number // 10000 % 100:02d}{number // 100 % 100:02d}-{number:08x}"


def write_session(sessions: Path, sid: str, history: list[dict] | None = None, body: bytes | None = None) -> Path:
    """Write .sessions/<sid>.jsonl: a header and the records (or a pre-built body). Returns the path."""
    sessions.mkdir(mode=0o700, exist_ok=True)
    header = {
        "type": "meta",
        "id": sid,
        "created_at": "2026-01-01T00:00:00+00:00",
        "version": 1,
        "model": "test-model",
        "base_url": "http://127.0.0.1:9/v1",
    }
    if body is None:
        body = b"".join(record(m) for m in history or [])
    path = sessions / f"{sid}.jsonl"
    path.write_bytes(json.dumps(header).encode() + b"\n" + body)
    path.chmod(0o600)
    return path
