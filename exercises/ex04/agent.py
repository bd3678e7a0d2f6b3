"""Chapter 4 — One loop, two protocols (provider 抽象).

The loop only needs one thing from a model: send(system, history) -> reply.
Two adapters give it that, one for OpenAI Chat Completions, one for the
Anthropic Messages API, and the loop never changes.

    python exercises/ex04/agent.py                      (OpenAI protocol)
    PROTOCOL=anthropic python exercises/ex04/agent.py   (Anthropic protocol)
"""

import json
import os
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import NoReturn

import openai
from dotenv import find_dotenv, load_dotenv

# ---- configuration: environment variables, or a .env file where you run ----

load_dotenv(find_dotenv(usecwd=True))  # real environment variables win over .env
API_KEY = os.environ.get("OPENAI_API_KEY", "").strip()
BASE_URL = os.environ.get("OPENAI_BASE_URL", "").strip() or "https://api.openai.com/v1"
MODEL = os.environ.get("MODEL", "").strip()
PROTOCOL = os.environ.get("PROTOCOL", "").strip().lower() or "openai"
ANTHROPIC_BASE_URL = os.environ.get("ANTHROPIC_BASE_URL", "").strip() or "https://api.anthropic.com"
ANTHROPIC_API_KEY = os.environ.get("ANTHROPIC_API_KEY", "").strip()

SETUP_GUIDE = """\
error: OPENAI_API_KEY and MODEL must be set (in the environment or in a .env file).
For DeepSeek:
  OPENAI_API_KEY=sk-...  OPENAI_BASE_URL=https://api.deepseek.com  MODEL=deepseek-v4-flash
For a local Ollama:
  OPENAI_API_KEY=ollama  OPENAI_BASE_URL=http://localhost:11434/v1  MODEL=qwen3:8b
With PROTOCOL=anthropic, set ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL and MODEL instead:
  ANTHROPIC_API_KEY=sk-...  ANTHROPIC_BASE_URL=https://api.deepseek.com/anthropic  MODEL=deepseek-v4-flash"""

# What to do about the HTTP errors people actually meet.
HINTS = {
    401: "check OPENAI_API_KEY",
    402: "check your account balance",
    403: "check your account's permissions",
    404: "check MODEL and OPENAI_BASE_URL",
    429: "rate limited: wait a moment and try again",
}


def die(message: str) -> NoReturn:
    """Expected failures end with one line on stderr, never a traceback."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def describe(error: openai.APIError) -> str:
    """One line for an API failure: what happened and what to do about it."""
    if isinstance(error, openai.APITimeoutError):
        return f"no answer from {BASE_URL} in time; try again"
    if isinstance(error, openai.APIConnectionError):
        return f"the connection to {BASE_URL} failed or broke off: is the server up and OPENAI_BASE_URL right?"
    message = error.body.get("message") if isinstance(error.body, dict) else None
    message = message or error.message
    if isinstance(error, openai.APIStatusError):
        status = error.status_code
        hint = HINTS.get(status, "the provider failed; try again later" if status >= 500 else "")
        return f"HTTP {status}: {message}" + (f" ({hint})" if hint else "")
    return f"the API failed: {message}"


SYSTEM_PROMPT = "You are a concise assistant; answer in at most three sentences."


class TurnFailed(Exception):
    """A model turn that did not complete; the message says why."""


@dataclass
class Reply:
    text: str
    stop: str  # "finish_reason=stop" or "stop_reason=end_turn": each protocol's own words
    input_tokens: int
    output_tokens: int


# ---- adapters: one method, send(system, history) -> Reply ----
# Not streaming on purpose: streaming formats differ between protocols.


class OpenAIProvider:
    """OpenAI Chat Completions: the system prompt is the first message."""

    def __init__(self) -> None:
        self.client = openai.OpenAI(api_key=API_KEY, base_url=BASE_URL)

    def send(self, system: str, history: list[dict]) -> Reply:
        try:
            response = self.client.chat.completions.create(
                model=MODEL,
                max_tokens=1024,
                messages=[{"role": "system", "content": system}, *history],
            )
        except openai.APIError as error:
            raise TurnFailed(describe(error)) from None
        if not response.choices:
            raise TurnFailed("the API returned no answer (empty choices)")
        choice, usage = response.choices[0], response.usage
        return Reply(
            choice.message.content or "",
            f"finish_reason={choice.finish_reason}",
            usage.prompt_tokens if usage else 0,
            usage.completion_tokens if usage else 0,
        )


class AnthropicProvider:
    """Anthropic Messages, in plain HTTP: this is all an SDK would do for us."""

    def send(self, system: str, history: list[dict]) -> Reply:
        body = {"model": MODEL, "max_tokens": 1024, "system": system, "messages": history}
        request = urllib.request.Request(
            ANTHROPIC_BASE_URL.rstrip("/") + "/v1/messages",
            data=json.dumps(body).encode(),
            headers={
                "x-api-key": ANTHROPIC_API_KEY,
                "anthropic-version": "2023-06-01",
                "content-type": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=600) as response:
                data = json.load(response)
        except urllib.error.HTTPError as error:
            raise TurnFailed(f"HTTP {error.code}: {anthropic_error_message(error)}") from None
        except (urllib.error.URLError, OSError) as error:
            raise TurnFailed(f"cannot reach {ANTHROPIC_BASE_URL}: {getattr(error, 'reason', error)}") from None
        except ValueError:
            raise TurnFailed("the API answered with something that is not JSON") from None
        # content is a list of blocks; the answer is the text blocks joined.
        text = "".join(block.get("text", "") for block in data.get("content", []) if block.get("type") == "text")
        usage = data.get("usage", {})
        return Reply(
            text, f"stop_reason={data.get('stop_reason')}", usage.get("input_tokens", 0), usage.get("output_tokens", 0)
        )


def anthropic_error_message(error: urllib.error.HTTPError) -> str:
    """Anthropic error bodies look like {"type":"error","error":{"message":...}}."""
    try:
        return json.load(error)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return error.reason


PROVIDERS = {"openai": OpenAIProvider, "anthropic": AnthropicProvider}


# ---- the conversation: a list that grows, and a loop around it ----


def main() -> None:
    if len(sys.argv) != 1:
        die("usage: python agent.py   (no arguments: it starts a conversation)")
    if PROTOCOL not in PROVIDERS:
        die(f"unknown PROTOCOL {PROTOCOL!r}: use openai or anthropic")
    key = ANTHROPIC_API_KEY if PROTOCOL == "anthropic" else API_KEY
    if not key or not MODEL:
        print(SETUP_GUIDE, file=sys.stderr)
        sys.exit(1)

    provider = PROVIDERS[PROTOCOL]()
    history: list[dict] = []  # the system prompt travels separately: each adapter places it
    print("Type a message and press Enter; type exit to quit.", file=sys.stderr)
    while True:
        print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:  # EOF (Ctrl-D)
            print(file=sys.stderr)
            return
        line = line.strip()
        if line == "exit":
            return
        if not line:
            continue

        history.append({"role": "user", "content": line})
        try:
            reply = provider.send(SYSTEM_PROMPT, history)
        except TurnFailed as failure:
            history.pop()  # forget the failed turn, so the next one starts clean
            print(f"error: {failure}", file=sys.stderr)
            continue
        history.append({"role": "assistant", "content": reply.text})
        print(reply.text)
        print(
            f"[input {reply.input_tokens} tokens · output {reply.output_tokens} tokens · {reply.stop}]", file=sys.stderr
        )


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        sys.exit(130)
