"""Hostile input, part 3: damaged or strange files (agent.py).

The files the tools touch and the session files the agent reads back are not
trusted either: /dev/zero, a FIFO (also where a file read before was), a
directory, a 5 MB file, a symlink loop, a name of 30 Chinese characters, a
read-only file, a full disk, a session line nested 100,000 deep, a FIFO or a
dangling symlink where a session should be, a .env someone else can write (or
overruled by a variable set empty), .trash or .sessions as a symlink that
leads out, a FIFO for -restore, a name that is not UTF-8. Each must end in a clean
result or a clean error, never a hang, a traceback, a half-written file or a
leaked one.

The real agent.py runs as a subprocess against the fake provider, every run
with a timeout (a FIFO or /dev/zero must not hang the suite even if a defence
is broken). A full disk is a file-size limit (RLIMIT_FSIZE) set in the child
before agent.py starts. One table of tool calls under that limit runs
agent.py's own registry in a child Python, with the end-to-end runs beside it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

import conftest
from conftest import TEST_KEY, hermetic_env, run_agent
from fake_provider import FakeProvider, sequence_error, text, tool_call
from helpers import (
    SESSION_ID,
    appended,
    assert_no_control,
    assert_ok,
    assert_one_error_line,
    call,
    calls,
    disk_messages,
    header_line,
    message_line,
    new_session_id,
    put_session,
    results,
    resumed,
    session_bytes,
    session_file,
    snapshot,
    stderr_lines,
    warnings,
)

TASK = "Work on the files."
SYSTEM = {"role": "system", "content": "You are a coding agent."}
USER = {"role": "user", "content": "Remember the number 42"}
ANSWER = {"role": "assistant", "content": "I will remember 42."}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def leftovers(root: Path) -> list[str]:
    """Temporary files an interrupted write would leave (agent.py names them .agent-*.tmp)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name.endswith(".tmp"))


def file_size_limit(limit: int) -> Callable[[], None]:
    """preexec_fn: no file may grow past `limit` bytes (Python ignores SIGXFSZ: write() fails with EFBIG)."""

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def drop_dac_override() -> None:
    """preexec_fn: as root, give up the capability to write what permissions forbid (CAP_DAC_OVERRIDE)
    from the bounding set, so the program runs as root but read-only files are read-only to it."""
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(24, 1, 0, 0, 0) != 0:  # PR_CAPBSET_DROP, CAP_DAC_OVERRIDE
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def registry_run(workdir: Path, tool_calls: list[tuple[str, dict]], preexec: Callable[[], None]) -> list[str]:
    """Run tool calls through agent.py's own registry, in a child Python started in workdir with
    preexec (a file-size limit): the results, in order. No model and no SDK, so a table is cheap."""
    script = (
        "import importlib.util, json, sys\n"
        "spec = importlib.util.spec_from_file_location('agent', sys.argv[1])\n"
        "agent = importlib.util.module_from_spec(spec); sys.modules['agent'] = agent; spec.loader.exec_module(agent)\n"
        "for name, args in json.loads(sys.stdin.read()):\n"
        "    print(json.dumps(agent.registry.run(name, json.dumps(args))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(conftest.program("final"))],
        cwd=workdir,
        env=hermetic_env(None, workdir.parent, PYTHONDONTWRITEBYTECODE="1"),
        input=json.dumps(tool_calls),
        capture_output=True,
        text=True,
        timeout=60,
        umask=0o022,
        start_new_session=True,
        preexec_fn=preexec,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


# ---------------------------------------------------------------- 4 and 5. writes: atomic, modes kept, private backups


def test_writes_keep_modes_follow_links_and_keep_backups_private(provider: FakeProvider, workdir: Path) -> None:
    """Under umask 027: an existing 0600 file stays 0600 and a 0755 script 0755, a new file is
    0666 & ~027 = 0640, a write through a symlink changes its target and leaves the link a link,
    no temporary file is left, and every backup is 0600 in a 0700 .trash/ (-restore's too).
    Overwriting the executable script asks first (a git hook or a script runs it)."""
    (workdir / "secret.txt").write_text("old secret\n")
    (workdir / "secret.txt").chmod(0o600)
    (workdir / "run.sh").write_text("#!/bin/sh\necho old\n")
    (workdir / "run.sh").chmod(0o755)
    (workdir / "real.txt").write_text("old real\n")
    (workdir / "real.txt").chmod(0o644)
    (workdir / "link.txt").symlink_to("real.txt")
    names = ["secret.txt", "run.sh", "link.txt"]
    provider.script(
        calls(*[(f"r_{name}", "read_file", {"path": name}) for name in names]),
        calls(
            ("w_secret", "write_file", {"path": "secret.txt", "content": "new secret\n"}),
            ("e_run", "edit_file", {"path": "run.sh", "old_string": "echo old", "new_string": "echo new"}),
            ("w_link", "write_file", {"path": "link.txt", "content": "new real\n"}),
            ("w_new", "write_file", {"path": "sub/new.txt", "content": "brand new\n"}),
        ),
        text("Done."),
    )
    result = run_agent("final", TASK, provider=provider, cwd=workdir, umask=0o027, answers="y\n")
    assert_ok(result, stdout="Done.\n")
    assert result.terminal.count("allow? (y/N)") == 1
    assert f"overwrite an executable file (a git hook, a script): {workdir.resolve() / 'run.sh'}" in result.terminal
    got = results(provider)
    assert all(not value.startswith("error") for value in got.values()), got
    assert (workdir / "secret.txt").read_text() == "new secret\n" and mode(workdir / "secret.txt") == 0o600
    assert (workdir / "run.sh").read_text() == "#!/bin/sh\necho new\n" and mode(workdir / "run.sh") == 0o755
    assert (workdir / "link.txt").is_symlink() and os.readlink(workdir / "link.txt") == "real.txt"
    assert (workdir / "real.txt").read_text() == "new real\n" and mode(workdir / "real.txt") == 0o644
    assert (workdir / "sub" / "new.txt").read_text() == "brand new\n" and mode(workdir / "sub" / "new.txt") == 0o640
    assert leftovers(workdir) == []

    restored = run_agent("final", "-restore", "secret.txt", cwd=workdir, provider=None, umask=0)
    assert restored.returncode == 0, restored.stderr
    assert (workdir / "secret.txt").read_text() == "old secret\n" and mode(workdir / "secret.txt") == 0o600
    trash = workdir / ".trash"
    assert mode(trash) == 0o700
    backups = sorted(trash.iterdir())
    assert len(backups) == 4, backups  # secret.txt, run.sh, real.txt, and secret.txt again before the restore
    assert {mode(b) for b in backups} == {0o600}
    assert sorted(b.name.partition("~")[0] for b in backups) == ["real.txt", "run.sh", "secret.txt", "secret.txt"]
    assert leftovers(workdir) == []


def test_the_temporary_file_of_a_write_is_private_until_it_is_renamed(loaded, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under umask 026, write_file over a 0664 file and write_file of a new one, through agent.py's
    registry in-process, watching the standard library: each temporary file is created 0600 and still
    private when full (its fsync), so nobody else can open it while it fills; at the rename it has the
    final mode, the old file's (0664) or what the umask leaves of 0666 (0640); after the rename the
    directory is fsynced, so the new name is on the disk too."""
    work = loaded.WORKDIR
    (work / "old.txt").write_text("old\n")
    (work / "old.txt").chmod(0o664)
    created, filled, renamed, events = {}, {}, {}, []
    real_open, real_fsync, real_replace = os.open, os.fsync, os.replace

    def watched_open(path: object, flags: int, mode: int = 0o777, *args: object, **kwargs: object) -> int:
        fd = real_open(path, flags, mode, *args, **kwargs)
        if flags & os.O_CREAT:
            created[os.path.realpath(path)] = stat.S_IMODE(os.fstat(fd).st_mode)
        return fd

    def watched_fsync(fd: int) -> None:
        filled[os.readlink(f"/proc/self/fd/{fd}")] = stat.S_IMODE(os.fstat(fd).st_mode)
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def watched_replace(source: object, target: object, *args: object, **kwargs: object) -> None:
        renamed[os.path.realpath(target)] = (os.path.realpath(source), stat.S_IMODE(os.stat(source).st_mode))
        real_replace(source, target, *args, **kwargs)
        events.append(("rename", os.path.realpath(target)))

    monkeypatch.setattr(os, "open", watched_open)
    monkeypatch.setattr(os, "fsync", watched_fsync)
    monkeypatch.setattr(os, "replace", watched_replace)
    umask = os.umask(0o026)
    try:
        got = [
            loaded.registry.run(name, json.dumps(args))
            for name, args in (
                ("read_file", {"path": "old.txt"}),
                ("write_file", {"path": "old.txt", "content": "new\n"}),
                ("write_file", {"path": "new.txt", "content": "new\n"}),
            )
        ]
    finally:
        os.umask(umask)
        monkeypatch.setattr(os, "open", real_open)
        monkeypatch.setattr(os, "fsync", real_fsync)
        monkeypatch.setattr(os, "replace", real_replace)
    assert got[1].startswith("wrote 4 bytes to old.txt") and got[2] == "wrote 4 bytes to new.txt", got
    for name, final in (("old.txt", 0o664), ("new.txt", 0o640)):
        temporary, at_rename = renamed[os.path.realpath(work / name)]
        assert oct(created[temporary]) == oct(0o600), name  # nobody else can open it while it fills
        assert oct(filled[temporary]) == oct(0o600), name  # full and on the disk, still private
        assert oct(at_rename) == oct(final), name
        assert (work / name).read_text() == "new\n" and oct(mode(work / name)) == oct(final)
        after = events[events.index(("rename", os.path.realpath(work / name))) :]
        assert ("fsync", os.path.realpath(work)) in after, events  # the directory, after the rename
    assert leftovers(work) == []


def test_a_read_only_file_stays_read_only(provider: FakeProvider, workdir: Path) -> None:
    """A rename replaces a file whatever its mode, so an atomic write must check: 0444 is refused,
    by write_file and by edit_file, as a plain write would be. (As root, the agent runs without
    CAP_DAC_OVERRIDE here, as an ordinary user would be.)"""
    try:
        subprocess.run(["true"], preexec_fn=drop_dac_override, check=True, timeout=30)
    except (subprocess.SubprocessError, OSError) as problem:
        pytest.skip(f"cannot run the agent without CAP_DAC_OVERRIDE here: {problem}")
    ro = workdir / "ro.txt"
    ro.write_text("read only\n")
    ro.chmod(0o444)
    provider.script(
        tool_call("read_file", {"path": "ro.txt"}, call_id="read"),
        calls(
            ("write", "write_file", {"path": "ro.txt", "content": "changed\n"}),
            ("edit", "edit_file", {"path": "ro.txt", "old_string": "only", "new_string": "write"}),
        ),
        text("Done."),
    )
    result = run_agent("final", TASK, provider=provider, cwd=workdir, options={"preexec_fn": drop_dac_override})
    assert_ok(result, stdout="Done.\n")
    got = results(provider)
    for cid in ("write", "edit"):
        assert got[cid].startswith(f"error: {cid}_file failed on ro.txt: Permission denied"), got[cid]
    assert ro.read_text() == "read only\n" and mode(ro) == 0o444
    assert leftovers(workdir) == []


BIG = "".join(f"{i:07d} {'x' * 91}\n" for i in range(1000))  # 100,000 bytes, lines of 100


def test_a_full_disk_leaves_the_old_file_and_tells_the_model(provider: FakeProvider, workdir: Path) -> None:
    """edit_file makes a 100 KB file grow past the file-size limit: the model gets an error, the file
    keeps its exact old bytes, no temporary file is left, and the run goes on (the session fits)."""
    (workdir / "big.txt").write_text(BIG)
    provider.script(
        tool_call("read_file", {"path": "big.txt"}, call_id="read"),
        tool_call("edit_file", {"path": "big.txt", "old_string": "0000500 ", "new_string": "y" * 2000}, call_id="edit"),
        text("The disk is full."),
    )
    limit = file_size_limit(len(BIG) + 1000)
    result = run_agent("final", TASK, provider=provider, cwd=workdir, options={"preexec_fn": limit})
    assert_ok(result, stdout="The disk is full.\n")
    assert results(provider)["edit"] == "error: edit_file failed on big.txt: File too large"
    assert (workdir / "big.txt").read_text() == BIG
    assert leftovers(workdir) == []


def test_a_full_disk_during_write_file(provider: FakeProvider, workdir: Path) -> None:
    """write_file of 60 KB under a 50 KB limit. The call carries the content, so the round cannot be
    saved either: the run stops with one error line, and the old file is byte for byte what it was."""
    (workdir / "notes.txt").write_text("old notes\n")
    provider.script(
        tool_call("read_file", {"path": "notes.txt"}, call_id="read"),
        tool_call("write_file", {"path": "notes.txt", "content": "z" * 60_000}, call_id="write"),
        text("never asked"),
    )
    result = run_agent("final", TASK, provider=provider, cwd=workdir, options={"preexec_fn": file_size_limit(50_000)})
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        f"error: cannot save session {new_session_id(result.stderr)}: File too large"
    ]
    assert (workdir / "notes.txt").read_text() == "old notes\n"
    assert leftovers(workdir) == []
    assert [m["role"] for m in disk_messages(session_file(workdir, result.stderr))] == [
        "system",
        "user",
        "assistant",
        "tool",
    ]


def test_the_tool_results_on_a_full_disk(workdir: Path) -> None:
    """What the model is told, for each way a write meets a full disk (agent.py's registry, a real limit)."""
    (workdir / "old.txt").write_text("old bytes\n")
    (workdir / "old.txt").chmod(0o640)
    got = registry_run(
        workdir,
        [
            ("read_file", {"path": "old.txt"}),
            ("write_file", {"path": "old.txt", "content": "w" * 5000}),
            ("write_file", {"path": "new.txt", "content": "n" * 5000}),
            ("edit_file", {"path": "old.txt", "old_string": "old", "new_string": "e" * 5000}),
            ("write_file", {"path": "old.txt", "content": "fits\n"}),
        ],
        file_size_limit(1000),
    )
    assert got[1:4] == [
        "error: write_file failed on old.txt: File too large",
        "error: write_file failed on new.txt: File too large",
        "error: edit_file failed on old.txt: File too large",
    ]
    assert got[4].startswith("wrote 5 bytes to old.txt")
    assert (workdir / "old.txt").read_text() == "fits\n" and mode(workdir / "old.txt") == 0o640
    assert not (workdir / "new.txt").exists()
    assert leftovers(workdir) == []
    assert {p.read_text() for p in (workdir / ".trash").iterdir()} == {"old bytes\n"}


# 7, a last record without its newline: tests/test_ex11.py::test_a_last_record_without_its_newline_is_kept[final].


# ---------------------------------------------------------------- 8. a long Chinese file name

LONG_NAME = "这是一个用来测试备份功能的很长很长的中文文件名字请勿删除谢谢.txt"  # 30 Chinese characters: 94 bytes
LONG_DIR = "中文目录" * 10  # a path whose backup name would be far over 255 bytes


def test_a_file_with_a_30_character_chinese_name_is_edited_with_a_backup(provider: FakeProvider, workdir: Path) -> None:
    assert len(LONG_NAME) == 34 and len(LONG_NAME.encode()) == 94
    (workdir / LONG_NAME).write_text("旧内容\n", encoding="utf-8")
    (workdir / LONG_DIR).mkdir()
    (workdir / LONG_DIR / LONG_NAME).write_text("深处的旧内容\n", encoding="utf-8")
    deep = f"{LONG_DIR}/{LONG_NAME}"
    provider.script(
        calls(("r1", "read_file", {"path": LONG_NAME}), ("r2", "read_file", {"path": deep})),
        calls(
            ("e1", "edit_file", {"path": LONG_NAME, "old_string": "旧", "new_string": "新"}),
            ("e2", "edit_file", {"path": deep, "old_string": "旧", "new_string": "新"}),
        ),
        text("Done."),
    )
    result = run_agent("final", TASK, provider=provider, cwd=workdir)
    assert_ok(result, stdout="Done.\n")
    got = results(provider)
    assert got["e1"].startswith(f"edited {LONG_NAME}: replaced 1 occurrence (old version saved as .trash/"), got["e1"]
    assert got["e2"].startswith(f"edited {deep}: replaced 1 occurrence (old version saved as .trash/"), got["e2"]
    assert (workdir / LONG_NAME).read_text() == "新内容\n"
    backups = sorted((workdir / ".trash").iterdir())
    assert sorted(b.read_text() for b in backups) == ["旧内容\n", "深处的旧内容\n"]
    assert all(len(b.name.encode()) <= 255 for b in backups)

    for name, old in ((LONG_NAME, "旧内容\n"), (deep, "深处的旧内容\n")):
        restored = run_agent("final", "-restore", name, provider=None, cwd=workdir)
        assert restored.returncode == 0, restored.stderr
        assert (workdir / name).read_text() == old


def test_long_backup_names_stay_apart(loaded) -> None:
    """Names that share a long start get backups of their own, each name at most 255 bytes."""
    paths = [loaded.WORKDIR / LONG_DIR / f"{LONG_NAME}{n}" for n in range(3)] + [loaded.WORKDIR / ("长" * 84)]
    keys = [loaded.backup_key(path) for path in paths]
    assert len(set(keys)) == len(keys)
    assert all(len(f"{key}~20261129-084045-123456.99".encode()) <= 255 for key in keys), keys
    assert loaded.backup_key(loaded.WORKDIR / "a b/c.txt") == "a%20b%2Fc.txt"  # short names stay readable


# ---------------------------------------------------------------- 11. what read_file will not read whole

LINE = 100
FIVE_MB = b"".join(b"%07d %s\n" % (i, b"r" * (LINE - 9)) for i in range(50_000))
CUT = 32 * 1024 // LINE * LINE  # the first read stops at the last whole line inside 32 KiB: 32,700


def test_read_file_refuses_what_never_ends_and_reads_a_huge_file_in_parts(
    provider: FakeProvider, workdir: Path
) -> None:
    """/dev/zero (approved at the terminal: it is outside) and a FIFO with no writer are refused,
    and so is a directory, without waiting; a 5 MB file comes back as 32 KiB at most, with a marker
    that names the offset to read on, and reading on from there continues exactly. The session
    holds the parts that were read, not the file. A hang would be a failed run, not a stalled suite."""
    os.mkfifo(workdir / "pipe")
    (workdir / "dir").mkdir()
    (workdir / "big.txt").write_bytes(FIVE_MB)
    provider.script(
        calls(
            ("zero", "read_file", {"path": "/dev/zero"}),
            ("fifo", "read_file", {"path": "pipe"}),
            ("dir", "read_file", {"path": "dir"}),
            ("big", "read_file", {"path": "big.txt"}),
        ),
        calls(
            ("on", "read_file", {"path": "big.txt", "offset": CUT}),
            ("end", "read_file", {"path": "big.txt", "offset": len(FIVE_MB) - LINE}),
            ("bad", "read_file", {"path": "big.txt", "offset": -1}),
        ),
        text("Done."),
    )
    result = run_agent("final", TASK, provider=provider, cwd=workdir, answers="y\n", timeout=30)
    assert_ok(result, stdout="Done.\n")
    assert result.terminal.count("allow? (y/N)") == 1  # /dev/zero only
    got = results(provider)
    assert got["zero"] == "error: /dev/zero is not a regular file; read_file reads only files"
    assert got["fifo"] == "error: pipe is not a regular file; read_file reads only files"
    assert got["dir"].startswith("error:") and "dir" in got["dir"]
    size = len(FIVE_MB)
    assert (
        got["big"]
        == FIVE_MB[:CUT].decode() + f"\n[... bytes 0-{CUT} of {size}; read on with read_file offset={CUT} ...]"
    )
    assert got["on"] == (
        FIVE_MB[CUT : 2 * CUT].decode()
        + f"\n[... bytes {CUT}-{2 * CUT} of {size}; read on with read_file offset={2 * CUT} ...]"
    )
    assert got["end"] == FIVE_MB[-LINE:].decode()
    assert got["bad"] == "error: offset must be a whole number of bytes, at least 0"
    assert session_file(workdir, result.stderr).stat().st_size < 4 * 32 * 1024


@pytest.mark.parametrize("key", [TEST_KEY, "ollama"], ids=["a key", "a key too short to look for"])
def test_edit_file_and_write_file_meeting_a_fifo_fail_at_once(provider: FakeProvider, workdir: Path, key: str) -> None:
    """The model reads notes.txt, then (approved at the terminal) puts a FIFO with no writer in its
    place. edit_file and write_file of it return an error at once instead of waiting for a writer:
    through the key check that reads the file first, and (with a key too short to look for) through
    edit_file's own read and the backup of write_file. The FIFO stays; no backup, no temporary file."""
    (workdir / "notes.txt").write_text("my notes\n")
    provider.script(
        tool_call("read_file", {"path": "notes.txt"}, call_id="read"),
        tool_call("bash", {"command": "rm notes.txt && mkfifo notes.txt"}, call_id="swap"),
        calls(
            ("edit", "edit_file", {"path": "notes.txt", "old_string": "my", "new_string": "your"}),
            ("write", "write_file", {"path": "notes.txt", "content": "new notes\n"}),
        ),
        text("Done."),
    )
    result = run_agent("final", TASK, provider=provider, cwd=workdir, answers="y\n", timeout=30, OPENAI_API_KEY=key)
    assert_ok(result, stdout="Done.\n")
    got = results(provider)
    assert got["swap"] == "(command succeeded with no output)"
    assert got["edit"] == "error: edit_file failed on notes.txt: not a regular file"
    if key == TEST_KEY:
        assert got["write"] == "error: write_file failed on notes.txt: not a regular file"
    else:
        assert got["write"] == (
            "error: write_file failed on notes.txt: could not back up the old version (not a regular file); "
            "the file was not changed"
        )
    assert stat.S_ISFIFO((workdir / "notes.txt").lstat().st_mode)
    assert not (workdir / ".trash").exists()
    assert leftovers(workdir) == []


# ---------------------------------------------------------------- 12. symlink loops


def loops(workdir: Path) -> None:
    (workdir / "loop_a").symlink_to("loop_b")
    (workdir / "loop_b").symlink_to("loop_a")
    (workdir / "self").symlink_to("self")


def test_a_symlink_loop_is_a_clean_error_for_read_and_edit(provider: FakeProvider, workdir: Path) -> None:
    loops(workdir)
    provider.script(
        calls(
            ("read", "read_file", {"path": "loop_a"}),
            ("edit", "edit_file", {"path": "self", "old_string": "a", "new_string": "b"}),
            ("under", "write_file", {"path": "self/under.txt", "content": "x\n"}),
        ),
        text("Done."),
    )
    result = run_agent("final", TASK, provider=provider, cwd=workdir, timeout=30)
    assert_ok(result, stdout="Done.\n")
    got = results(provider)
    assert got["read"].startswith("error: read_file failed on loop_a: "), got["read"]
    assert got["edit"].startswith("error: "), got["edit"]
    assert got["under"].startswith("error: write_file failed on self/under.txt: "), got["under"]
    assert all((workdir / name).is_symlink() for name in ("loop_a", "loop_b", "self"))


def test_a_symlink_loop_is_a_clean_error_for_write(provider: FakeProvider, workdir: Path) -> None:
    loops(workdir)
    provider.script(calls(("write", "write_file", {"path": "loop_a", "content": "x\n"})), text("Done."))
    result = run_agent("final", TASK, provider=provider, cwd=workdir, timeout=30)
    assert_ok(result, stdout="Done.\n")
    assert results(provider)["write"].startswith("error: write_file failed on loop_a: ")
    assert (workdir / "loop_a").is_symlink()


def test_a_symlink_loop_is_a_clean_error_for_restore(workdir: Path) -> None:
    loops(workdir)
    trash = workdir / ".trash"
    trash.mkdir(mode=0o700)
    (trash / "self~20260101-000000-000000").write_text("a backup\n")
    result = run_agent("final", "-restore", "self", provider=None, cwd=workdir, timeout=30)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1 and result.stderr.startswith("error: cannot restore self"), result.stderr
    assert (workdir / "self").is_symlink()


# ---------------------------------------------------------------- 13. strange session files

DEPTH = 100_000


def test_a_session_line_nested_too_deep_to_parse(provider: FakeProvider, workdir: Path) -> None:
    """A line json cannot parse without a RecursionError: -list lists the session, -c reports the
    line by number, keeps it in the file, and goes on with the rest."""
    nested = b'{"type": "message", "message": {"role": "user", "content": ' + b"[" * DEPTH + b"]" * DEPTH + b"}}\n"
    path = put_session(workdir, header_line() + message_line(SYSTEM) + nested + message_line(ANSWER))
    before = path.read_bytes()
    listed = run_agent("final", "-list", provider=None, cwd=workdir, timeout=30)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    assert listed.stdout.startswith(SESSION_ID) and len(listed.stdout.splitlines()) == 1, listed.stdout

    provider.script(text("Still 42."))
    result = run_agent("final", "-c", SESSION_ID, "And now?", provider=provider, cwd=workdir, timeout=30)
    assert_ok(result, stdout="Still 42.\n")
    assert warnings(result.stderr) == [
        f"warning: skipped damaged line(s) 3 of {SESSION_ID}.jsonl; they stay in the file"
    ]
    assert provider.chat_requests[0]["messages"] == [SYSTEM, ANSWER, {"role": "user", "content": "And now?"}]
    assert len(appended(before, path.read_bytes())) == 2


def test_a_fifo_and_a_dangling_symlink_named_like_sessions(provider: FakeProvider, workdir: Path) -> None:
    """-list and -c last neither wait on the FIFO nor trip on the link: they are not sessions."""
    put_session(workdir, session_bytes(SYSTEM, USER, ANSWER))
    sessions = workdir / ".sessions"
    os.mkfifo(sessions / "20260801-090721-0000f1f0.jsonl")
    (sessions / "20260801-090722-0000dead.jsonl").symlink_to("nowhere.jsonl")
    (sessions / "20260801-090723-0000a1a5.jsonl").symlink_to(f"{SESSION_ID}.jsonl")  # an alias is not one either

    listed = run_agent("final", "-list", provider=None, cwd=workdir, timeout=30)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()] == [SESSION_ID]

    missing = run_agent("final", "-c", "20260801-090721", "hello?", provider=None, cwd=workdir, timeout=30)
    assert missing.returncode == 1 and "Traceback" not in missing.stderr, missing.stderr
    assert missing.stderr.startswith("error: no session 20260801-090721"), missing.stderr

    provider.script(text("Still 42."))
    result = run_agent("final", "-c", "last", "And now?", provider=provider, cwd=workdir, timeout=30)
    assert_ok(result, stdout="Still 42.\n")
    assert resumed(result.stderr) == (SESSION_ID, 3)


def test_list_shows_a_hostile_prompt_escaped(workdir: Path) -> None:
    prompt = {"role": "user", "content": "hi\x1b]52;c;Y3VybCBldmls\x07\x1b[2J\u202eevil"}
    put_session(workdir, session_bytes(SYSTEM, prompt, ANSWER))
    listed = run_agent("final", "-list", provider=None, cwd=workdir, timeout=30)
    assert listed.returncode == 0, listed.stderr
    assert_no_control("-list", listed.stdout)
    assert r"hi\x1b]52;c;Y3VybCBldmls\x07\x1b[2J\u202eevil" in listed.stdout


def test_a_stored_call_with_torn_arguments_is_sent_as_json(provider: FakeProvider, workdir: Path) -> None:
    """A file from an older run holds a call cut off mid-arguments: the request carries JSON."""
    torn = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "write_file", "arguments": '{"path": "a'}}
        ],
    }
    result_ = {"role": "tool", "tool_call_id": "c1", "content": "error: cut off"}
    path = put_session(workdir, session_bytes(SYSTEM, USER, torn, result_))
    provider.script(text("Fine."))
    result = run_agent("final", "-c", SESSION_ID, "go on", provider=provider, cwd=workdir)
    assert_ok(result, stdout="Fine.\n")
    sent = provider.chat_requests[0]["messages"]
    assert sequence_error(sent) is None
    assert json.loads(sent[2]["tool_calls"][0]["function"]["arguments"]) == {}
    assert disk_messages(path)[2] == torn  # the file keeps what it held


def test_odd_stored_messages_are_sent_valid_and_bad_ones_reported(provider: FakeProvider, workdir: Path) -> None:
    """An assistant message with null content and no tool calls is sent with content ""; calls named
    "" and "bad name!" (never run) are sent as unnamed_tool; a role that is a list and a content that
    is a number are damaged lines, reported by number and kept. The file is only appended to."""
    call_turn = {
        "role": "assistant",
        "content": None,
        "tool_calls": [call("c1", name="", arguments="{}"), call("c2", name="bad name!", arguments="{}")],
    }
    path = put_session(
        workdir,
        session_bytes(SYSTEM, USER, {"role": "assistant", "content": None})  # lines 1-4
        + b'{"type":"message","message":{"role":["user"],"content":"a role that is a list"}}\n'  # line 5
        + b'{"type":"message","message":{"role":"user","content":5}}\n'  # line 6
        + message_line({"role": "user", "content": "Call something."})
        + message_line(call_turn)
        + message_line({"role": "tool", "tool_call_id": "c1", "content": "error: unknown tool ''"})
        + message_line({"role": "tool", "tool_call_id": "c2", "content": "error: unknown tool 'bad name!'"}),
    )
    before = path.read_bytes()
    provider.script(text("Fine."))
    result = run_agent("final", "-c", SESSION_ID, "go on", provider=provider, cwd=workdir, timeout=30)
    assert_ok(result, stdout="Fine.\n")
    assert warnings(result.stderr) == [
        f"warning: skipped damaged line(s) 5, 6 of {SESSION_ID}.jsonl; they stay in the file"
    ]
    sent = provider.chat_requests[0]["messages"]
    assert sequence_error(sent) is None
    assert sent[2] == {"role": "assistant", "content": ""}
    assert [m["content"] for m in sent if m["role"] == "user"] == [USER["content"], "Call something.", "go on"]
    assert [c["function"]["name"] for c in sent[4]["tool_calls"]] == ["unnamed_tool", "unnamed_tool"]
    assert len(appended(before, path.read_bytes())) == 2


def test_a_session_file_holding_a_lone_surrogate_escape_goes_on(provider: FakeProvider, workdir: Path) -> None:
    """Another program wrote "\\ud83d" (half an emoji, escaped: valid JSON) into a session: -c is
    accepted, the request valid UTF-8 JSON, and the file is only appended to."""
    lone = {"role": "user", "content": "half an emoji: \ud83d"}
    line = json.dumps({"type": "message", "message": lone}).encode() + b"\n"  # ASCII: the half as \ud83d
    path = put_session(workdir, header_line() + message_line(SYSTEM) + line + message_line(ANSWER))
    before = path.read_bytes()
    provider.script(text("Fine."))
    result = run_agent("final", "-c", SESSION_ID, "go on", provider=provider, cwd=workdir, timeout=30)
    assert_ok(result, stdout="Fine.\n")
    assert json.loads(provider.requests[0]["raw"].decode("utf-8"))["messages"][1]["content"].startswith("half an emoji")
    assert len(appended(before, path.read_bytes())) == 2


FAR = 1e13  # seconds: the year 318857, which no datetime can show


def test_list_shows_a_session_modified_in_a_year_no_calendar_has(tmp_path: Path) -> None:
    """os.utime to 1e13 s: -list lists the session with modified "?". ext4 clamps such a time to the
    year 2446, so the working directory is made on /dev/shm (tmpfs keeps it) if tmp_path's does not."""
    with contextlib.ExitStack() as stack:
        for base in (tmp_path, Path("/dev/shm")):
            if not base.is_dir():
                continue
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=base))) / "work"
            workdir.mkdir()
            path = put_session(workdir, session_bytes(SYSTEM, USER, ANSWER))
            os.utime(path, (FAR, FAR))
            if path.stat().st_mtime == FAR:
                break
        else:
            pytest.skip("no file system here keeps a modification time of 1e13 s")
        listed = run_agent("final", "-list", provider=None, cwd=workdir, timeout=30)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    assert listed.stdout.startswith(f"{SESSION_ID}  created 2026-08-01 09:07  modified ?  "), listed.stdout
    assert len(listed.stdout.splitlines()) == 1


# ---------------------------------------------------------------- a .env that is not yours, or cannot be read


@pytest.mark.parametrize("whose", ["another user's", "world-writable"])
def test_a_dotenv_that_someone_else_can_write_is_ignored(tmp_path: Path, workdir: Path, whose: str) -> None:
    """A .env in a parent directory (a /tmp/.env) that another user owns, or that anyone can write,
    names a server of its own, a key, a model and OPENAI_ORG_ID. It is ignored with one warning
    line, and the real environment's settings are used: none at all (the short guide, exit 1), or
    all three (the run goes to the real server, without the planted organization)."""
    with FakeProvider() as real, FakeProvider() as thief:
        planted = tmp_path / ".env"
        planted.write_text(
            f"OPENAI_API_KEY=sk-planted-0123456789\nOPENAI_BASE_URL={thief.url}\nMODEL=planted\nOPENAI_ORG_ID=org-planted\n"
        )
        if whose == "another user's":
            if os.geteuid() != 0:
                pytest.skip("giving a file to another user needs root")
            os.chown(planted, 65534, 65534)
            settings = {"OPENAI_API_KEY": None, "OPENAI_BASE_URL": None, "MODEL": None}
        else:
            planted.chmod(0o666)
            settings = {}
        thief.script(text("Thanks for the task."))
        real.script(text("Done."))
        result = run_agent("final", "Work.", provider=real, cwd=workdir, timeout=30, **settings)
    assert thief.requests == []
    assert "Traceback" not in result.stderr, result.stderr
    assert warnings(result.stderr) == [f"warning: ignored {planted}: not yours, or anyone can write it"]
    if settings:
        assert result.returncode == 1 and result.stdout == "" and real.requests == []
        assert stderr_lines(result.stderr)[1].startswith("error: OPENAI_API_KEY and MODEL must be set"), result.stderr
    else:
        assert_ok(result, stdout="Done.\n")
        assert [request["body"]["model"] for request in real.requests] == ["test-model"]
        assert real.requests[0]["headers"]["authorization"] == f"Bearer {TEST_KEY}"
        assert "openai-organization" not in real.requests[0]["headers"]


@pytest.mark.parametrize("kind", ["not UTF-8", "a FIFO"])
def test_a_dotenv_that_cannot_be_read_is_one_warning(workdir: Path, kind: str) -> None:
    """-h still works, at once: one warning line, the usage on stdout."""
    dotenv = workdir / ".env"
    if kind == "a FIFO":
        os.mkfifo(dotenv)  # no writer ever comes: an open that waits for one never returns
    else:
        dotenv.write_bytes(b"MODEL=caf\xe9\n")
    result = run_agent("final", "-h", provider=None, cwd=workdir, timeout=10)
    assert result.returncode == 0 and result.stdout.startswith("usage: python agent.py"), result.stderr
    assert len(stderr_lines(result.stderr)) == 1, result.stderr
    assert result.stderr.startswith(f"warning: ignored {dotenv}"), result.stderr


@pytest.mark.parametrize("empty", ["OPENAI_BASE_URL", "OPENAI_API_KEY", "MODEL", "STREAM_TIMEOUT"])
def test_a_variable_set_empty_wins_over_dotenv(provider: FakeProvider, workdir: Path, empty: str) -> None:
    """The .env names a server of its own, a key, a model and a STREAM_TIMEOUT that is no number; the
    environment sets all four, one of them empty, and the empty one is used: OPENAI_BASE_URL= is
    OpenAI (reached through HTTPS_PROXY, a socket that listens and never answers, so nothing leaves
    the machine), an empty key or model is the short guide, an empty STREAM_TIMEOUT the default.
    The .env's server gets nothing."""
    with FakeProvider() as thief, socket.socket() as proxy:
        proxy.bind(("127.0.0.1", 0))
        proxy.listen(8)  # the kernel takes the connection and what is sent on it; nobody answers
        (workdir / ".env").write_text(
            f"OPENAI_API_KEY=sk-dotenv-0123456789\nOPENAI_BASE_URL={thief.url}\nMODEL=dotenv-model\nSTREAM_TIMEOUT=abc\n"
        )
        thief.script(text("Thanks for the task."))
        provider.script(text("Done."))
        settings = {"STREAM_TIMEOUT": "1", empty: ""}
        https_proxy = f"http://127.0.0.1:{proxy.getsockname()[1]}"
        result = run_agent(
            "final", TASK, provider=provider, cwd=workdir, timeout=30, HTTPS_PROXY=https_proxy, **settings
        )
        proxy.setblocking(False)  # the run is over: a connection it made is queued, with what it sent
        try:
            with proxy.accept()[0] as connection:
                asked = connection.recv(4096)
        except BlockingIOError:
            asked = b""
    assert thief.requests == []
    assert "Traceback" not in result.stderr, result.stderr
    if empty == "OPENAI_BASE_URL":
        assert result.returncode == 1 and provider.requests == []
        errors = [line for line in stderr_lines(result.stderr) if line.startswith("error:")]
        assert errors == [
            "error: no progress from https://api.openai.com/v1 for 1 s (keep-alives and empty events do not count); "
            "try again, or raise STREAM_TIMEOUT"
        ], result.stderr
        assert asked.startswith(b"CONNECT api.openai.com:443 "), asked
    elif empty == "STREAM_TIMEOUT":
        assert_ok(result, stdout="Done.\n")
        assert [request["body"]["model"] for request in provider.requests] == ["test-model"]
        assert asked == b""
    else:
        assert result.returncode == 1 and result.stdout == "" and provider.requests == []
        assert result.stderr.startswith("error: OPENAI_API_KEY and MODEL must be set"), result.stderr
        assert asked == b""


# ---------------------------------------------------------------- .trash or .sessions that is a symlink


def test_a_trash_that_is_a_symlink_is_never_used(provider: FakeProvider, tmp_path: Path, workdir: Path) -> None:
    """.trash links to a directory outside (a repository can commit such a link): a write that needs
    a backup fails with an error result and writes nothing; -restore refuses in one line rather than
    bring in the "backup" planted there. Nothing appears in the link's target."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "a.txt~20260101-000000-000000").write_text("planted\n")
    (workdir / ".trash").symlink_to(elsewhere)
    (workdir / "a.txt").write_text("mine\n")
    before = snapshot(elsewhere)
    provider.script(
        tool_call("read_file", {"path": "a.txt"}, call_id="read"),
        tool_call("write_file", {"path": "a.txt", "content": "changed\n"}, call_id="write"),
        text("Done."),
    )
    result = run_agent("final", TASK, provider=provider, cwd=workdir, timeout=30)
    assert_ok(result, stdout="Done.\n")
    got = results(provider)["write"]
    assert got.startswith("error: write_file failed on a.txt: could not back up the old version"), got
    assert ".trash is a symlink" in got and got.endswith("the file was not changed"), got
    restored = run_agent("final", "-restore", "a.txt", provider=None, cwd=workdir, timeout=30)
    assert_one_error_line(restored, "cannot restore a.txt", ".trash is a symlink")
    assert (workdir / "a.txt").read_text() == "mine\n"
    assert snapshot(elsewhere) == before


def test_a_sessions_directory_that_is_a_symlink_is_never_used(
    provider: FakeProvider, tmp_path: Path, workdir: Path
) -> None:
    """.sessions links to a directory outside that holds a session: a new session is refused, and
    so are -list and -c last, each in one line. Nothing appears in, or changes in, the link's target."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / f"{SESSION_ID}.jsonl").write_bytes(session_bytes(SYSTEM, USER, ANSWER))
    (workdir / ".sessions").symlink_to(elsewhere)
    before = snapshot(elsewhere)
    provider.script(text("never asked"), text("never asked"))
    new = run_agent("final", TASK, provider=provider, cwd=workdir, timeout=30)
    assert_one_error_line(new, "cannot create a session in", ".sessions is a symlink")
    for args in (["-list"], ["-c", "last", "go on"]):
        refused = run_agent("final", *args, provider=provider, cwd=workdir, timeout=30)
        assert_one_error_line(refused, "cannot read", ".sessions: it is a symlink")
    assert provider.requests == []
    assert snapshot(elsewhere) == before


# ---------------------------------------------------------------- -restore: a FIFO, a name that is not UTF-8


@pytest.mark.parametrize("where", ["the file", "its newest backup"])
def test_restore_with_a_fifo_is_one_error_line(workdir: Path, where: str) -> None:
    """-restore f, where f is a FIFO, or where .trash holds a FIFO named like f's newest backup:
    one error line at once (reading a FIFO waits for a writer that never comes), nothing changed."""
    trash = workdir / ".trash"
    trash.mkdir(mode=0o700)
    (trash / "f~20260101-000000-000000").write_text("old\n")
    fifo = workdir / "f" if where == "the file" else trash / "f~20260102-000000-000000"
    os.mkfifo(fifo)
    if where != "the file":
        (workdir / "f").write_text("current\n")
    names = sorted(path.name for path in trash.iterdir())
    result = run_agent("final", "-restore", "f", provider=None, cwd=workdir, timeout=10)
    assert_one_error_line(result, "cannot restore f")
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert where == "the file" or (workdir / "f").read_text() == "current\n"
    assert sorted(path.name for path in trash.iterdir()) == names  # no backup made, none taken


NOT_UTF8 = os.fsdecode(b"a\xffb")  # a file name with a byte that is not UTF-8, as Python holds it


def test_restore_of_a_name_that_is_not_utf8(provider: FakeProvider, workdir: Path) -> None:
    """The model reads and rewrites a\\xffb (its JSON names it "a\\udcffb"), which backs it up; then
    `-restore $'a\\xffb'` brings the old text back."""
    (workdir / NOT_UTF8).write_text("old\n")
    provider.script(
        tool_call("read_file", '{"path": "a\\udcffb"}', call_id="read"),
        tool_call("write_file", '{"path": "a\\udcffb", "content": "new\\n"}', call_id="write"),
        text("Done."),
    )
    result = run_agent("final", TASK, provider=provider, cwd=workdir, timeout=30)
    assert_ok(result, stdout="Done.\n")
    assert results(provider)["write"].startswith("wrote 4 bytes to a"), results(provider)
    assert (workdir / NOT_UTF8).read_text() == "new\n"
    restored = run_agent("final", "-restore", b"a\xffb", provider=None, cwd=workdir, timeout=30)  # type: ignore[arg-type]
    assert restored.returncode == 0 and "Traceback" not in restored.stderr, restored.stderr
    assert restored.stdout.startswith("restored .trash/"), restored.stdout
    assert (workdir / NOT_UTF8).read_text() == "old\n"
