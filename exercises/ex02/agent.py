"""Chapter 2 — Streaming (流式输出).

The model writes its answer token by token. With stream=True we print each
piece the moment it arrives instead of waiting for the whole answer.

    python exercises/ex02/agent.py "Explain TCP in five sentences."
"""

import os
import sys
from typing import NoReturn

import openai
from dotenv import find_dotenv, load_dotenv

# ---- configuration: environment variables, or a .env file where you run ----

load_dotenv(find_dotenv(usecwd=True))  # real environment variables win over .env
API_KEY = os.environ.get("OPENAI_API_KEY", "").strip()
BASE_URL = os.environ.get("OPENAI_BASE_URL", "").strip() or "https://api.openai.com/v1"
MODEL = os.environ.get("MODEL", "").strip()

SETUP_GUIDE = """\
error: OPENAI_API_KEY and MODEL must be set (in the environment or in a .env file).
For DeepSeek:
  OPENAI_API_KEY=sk-...  OPENAI_BASE_URL=https://api.deepseek.com  MODEL=deepseek-v4-flash
For a local Ollama:
  OPENAI_API_KEY=ollama  OPENAI_BASE_URL=http://localhost:11434/v1  MODEL=qwen3:8b"""

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


# ---- one request, the answer streamed as it is written ----


def main() -> None:
    if len(sys.argv) != 2 or not sys.argv[1].strip():
        die('usage: python agent.py "your question"')
    if not API_KEY or not MODEL:
        print(SETUP_GUIDE, file=sys.stderr)
        sys.exit(1)

    client = openai.OpenAI(api_key=API_KEY, base_url=BASE_URL)
    usage, finish_reason = None, None
    try:
        stream = client.chat.completions.create(
            model=MODEL,
            max_tokens=1024,
            messages=[{"role": "user", "content": sys.argv[1]}],
            stream=True,
            stream_options={"include_usage": True},  # a stream carries usage only if asked
        )
        for chunk in stream:
            # DeepSeek puts usage on the finish chunk; OpenAI and Ollama send
            # one more chunk with empty choices. Keep whichever carries it.
            usage = chunk.usage or usage
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            if choice.delta.content:
                print(choice.delta.content, end="", flush=True)
            finish_reason = choice.finish_reason or finish_reason
    except openai.APIError as error:
        if finish_reason is None:  # a break after the finish chunk costs nothing of the answer
            print(flush=True)  # end the half-printed answer before the error line
            die(describe(error))
    print()
    # A stream can simply stop (a proxy, a crash): no finish_reason means
    # the answer is incomplete, and that is a failure, not a success.
    if finish_reason is None:
        die("the stream ended before the answer was finished; try again")

    print(
        f"\n[input {usage.prompt_tokens if usage else '?'} tokens · "
        f"output {usage.completion_tokens if usage else '?'} tokens · "
        f"finish_reason={finish_reason}]",
        file=sys.stderr,
    )


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        sys.exit(130)
