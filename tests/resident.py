"""A person at a terminal, for the resident agent (chapter 24 on): the program runs
with a pseudo-terminal as its stdin, stdout, stderr and controlling terminal, as it
does for someone who typed `python agent.py`. The test types at it (lines, "\\x03"
for Ctrl-C, "\\x04" for Ctrl-D, "\\x1c" for Ctrl-\\) and waits for what it shows;
every wait is bounded, and close() kills what is left by process group."""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path
from typing import IO

from conftest import hermetic_env, program
from fake_provider import FakeProvider

PROMPT = "\n> "


class Resident:
    def __init__(
        self,
        chapter: int | str,
        *args: str,
        provider: FakeProvider | None,
        cwd: Path,
        columns: int = 200,
        stderr: IO[bytes] | None = None,
        **env: str | None,
    ) -> None:
        master, slave = os.openpty()
        os.set_inheritable(slave, True)
        self.master = master
        # A wide terminal: the line discipline wraps nothing, so what is shown is what was written.
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
        name = os.ttyname(slave)
        # setsid, then open the terminal: it becomes the controlling terminal, and the agent's
        # process group its foreground group, so that Ctrl-C typed here reaches the agent.
        attach = "import os, sys; os.setsid(); os.close(os.open(sys.argv[1], os.O_RDWR)); os.execv(sys.argv[2], sys.argv[2:])"
        self.process = subprocess.Popen(
            [sys.executable, "-c", attach, name, sys.executable, str(program(chapter)), *args],
            cwd=cwd,
            env={**hermetic_env(provider, cwd.parent, **env), "TERM": "xterm"},
            stdin=slave,
            stdout=slave,
            stderr=slave if stderr is None else stderr,  # a file given: as `2>err.log`, not the terminal
        )
        os.close(slave)
        self.shown = b""
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: every writer has closed the terminal
                data = b""
            with self.changed:
                self.shown += data
                self.changed.notify_all()
            if not data:
                return

    @property
    def text(self) -> str:
        """What the terminal showed, lines ended by \\n."""
        with self.changed:
            return self.shown.decode(errors="replace").replace("\r\n", "\n")

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def line(self, text: str) -> None:
        self.type(text + "\n")

    def wait_for(self, needle: str, count: int = 1, timeout: float = 30) -> float:
        """Until needle has been shown count times; returns when, by time.monotonic()."""
        encoded = needle.encode()
        with self.changed:
            if not self.changed.wait_for(lambda: self.shown.count(encoded) >= count, timeout):
                raise TimeoutError(f"{needle!r} (x{count}) never reached the terminal:\n{self.text[-3000:]}")
        return time.monotonic()

    def count(self, needle: str) -> int:
        with self.changed:
            return self.shown.count(needle.encode())

    def prompts(self) -> int:
        return self.count(PROMPT.replace("\n", "\r\n"))

    def wait_prompt(self, count: int, timeout: float = 30) -> float:
        """Until the prompt has been shown count times in all."""
        return self.wait_for(PROMPT.replace("\n", "\r\n"), count, timeout)

    def interrupt_to_exit(self, timeout: float = 30) -> int:
        """One Ctrl-C at the prompt, for a program that ends on it; its exit status. Typed the moment
        the prompt shows, it must count: agent.py's readline, which sees a signal only while it waits
        for a key, is nudged out by a thread for one that came as it started."""
        self.type("\x03")
        return self.wait_exit(timeout)

    def wait_exit(self, timeout: float = 30) -> int:
        try:
            return self.process.wait(timeout)
        finally:
            self.reader.join(5)

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)  # the agent's own group: it leads its session
            self.process.wait(10)
        self.reader.join(5)
        os.close(self.master)
