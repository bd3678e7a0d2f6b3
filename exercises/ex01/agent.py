"""Chapter 1 — One API call (一次 API 调用).

The whole agent starts as one HTTP request. The API is stateless: all the
model knows about this conversation is what this one request carries.

    python exercises/ex01/agent.py "What is a JSONL file?"
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


# ---- one request, one answer ----


def main() -> None:
    if len(sys.argv) != 2 or not sys.argv[1].strip():
        die('usage: python agent.py "your question"')
    if not API_KEY or not MODEL:
        print(SETUP_GUIDE, file=sys.stderr)
        sys.exit(1)

    client = openai.OpenAI(api_key=API_KEY, base_url=BASE_URL)
    try:
        response = client.chat.completions.create(
            model=MODEL,
            max_tokens=1024,
            messages=[{"role": "user", "content": sys.argv[1]}],
        )
    except openai.APIError as error:
        die(describe(error))
    if not response.choices:
        die("the API returned no answer (empty choices)")

    choice = response.choices[0]
    print(choice.message.content or "")
    usage = response.usage
    print(
        f"\n[input {usage.prompt_tokens if usage else '?'} tokens · "
        f"output {usage.completion_tokens if usage else '?'} tokens · "
        f"finish_reason={choice.finish_reason}]",
        file=sys.stderr,
    )


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        sys.exit(130)
