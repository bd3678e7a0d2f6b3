"""Processes a test has the agent start, and what is left of them (chapter 28 on).

A background task cannot be found by name (no `pgrep -f`): its command writes its own
pid, and a grandchild's, to files named *.pid in the working directory, and the tests
check those pids. `LEFT_BEHIND` is such a command: a shell that runs long, and a child
that leaves its process group and session with setsid, so that a kill of the group
misses it. `started_terminals` starts programs at a pseudo-terminal; at its end each is
closed and every process still running in the working directory is killed, so that
nothing a failing test left behind outlives it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from resident import Resident

from conftest import wait_for_file
from helpers import kill_quietly, wait_dead

# The task's shell writes task.pid and runs on; its child leaves the group (setsid) and writes escaped.pid.
LEFT_BEHIND = "echo $$ > task.pid; setsid sh -c 'echo $$ > escaped.pid; sleep 300' & sleep 300"


def pids(workdir: Path, *names: str, timeout: float = 30) -> list[int]:
    """The pids the commands wrote to these files, once each file is there."""
    return [int(wait_for_file(workdir / name, timeout)) for name in names]


def assert_dead(*numbers: int, timeout: float = 10) -> None:
    """Each pid gone (or a zombie: dead, its parent not there yet to reap it)."""
    living = [pid for pid in numbers if not wait_dead(pid, timeout)]
    assert not living, f"still running: {living}"


def parent_of(pid: int) -> int | None:
    """Its parent's pid (a zombie's too), or None once the process is gone: reaped."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def kill_left_behind(workdir: Path) -> None:
    """Kill every process still running in workdir (its working directory), whatever its name:
    what a failing test left behind, a task's children too."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cwd").resolve().is_relative_to(workdir.resolve()):
                kill_quietly(int(entry.name))
        except OSError:  # gone, or not ours to look at
            pass


@contextlib.contextmanager
def started_terminals(workdir: Path) -> Iterator[Callable[..., Resident]]:
    """For a fixture: start(chapter, *args, provider=, cwd=, **env) starts a program at a terminal.
    At the end each is closed, and every process still running in workdir is killed."""
    started: list[Resident] = []

    def start(chapter: int | str, *args: str, **kw: object) -> Resident:
        started.append(Resident(chapter, *args, **kw))
        return started[-1]

    try:
        yield start
    finally:
        for terminal in started:
            terminal.close()
        kill_left_behind(workdir)
