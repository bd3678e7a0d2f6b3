"""Chapter 10: back up before overwriting, and -restore.

The real exercises/ex10/agent.py runs as a subprocess against the fake
provider to make the backups (write_file and edit_file through the real
loop), then again with -restore and no API key; so does agent.py ("final"),
which inherits both. The tests check the tool results the model got, the
bytes in .trash/ and in the files, and what the user sees.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import run_agent
from fake_provider import FakeProvider, Reply, text
from helpers import assert_ok, assert_one_error_line, calls, results, snapshot

pytestmark = pytest.mark.parametrize("chapter", [10, "final"])
TASK = "Update the files."
SAVED = re.compile(r" \(old version saved as (\S+)\)$")


def read(cid: str, path: str) -> tuple[str, str, dict]:
    return (cid, "read_file", {"path": path})


def write(cid: str, path: str, content: str) -> tuple[str, str, dict]:
    return (cid, "write_file", {"path": path, "content": content})


def run(
    chapter: int | str, provider: FakeProvider, workdir: Path, *replies: Reply, umask: int = 0o022
) -> dict[str, str]:
    """Run the agent to a "Done." answer; return every tool result the model got, by call id."""
    provider.script(*replies, text("Done."))
    assert_ok(run_agent(chapter, TASK, provider=provider, cwd=workdir, umask=umask), stdout="Done.\n")
    return results(provider)


def restore(chapter: int | str, workdir: Path, *args: str, umask: int = 0o022) -> subprocess.CompletedProcess:
    """-restore needs no API key, no model and no server."""
    return run_agent(
        chapter, "-restore", *args, provider=None, cwd=workdir, umask=umask, OPENAI_API_KEY=None, MODEL=None
    )


def backup_named(workdir: Path, result: str) -> Path:
    """The backup a tool result names; it must be a file in .trash/."""
    match = SAVED.search(result)
    assert match, result
    path = workdir / match.group(1)
    assert path.parent == workdir / ".trash" and path.is_file(), (result, path)
    return path


def trash(workdir: Path) -> dict[str, bytes]:
    """Every backup: name -> bytes."""
    return {path.name: path.read_bytes() for path in sorted((workdir / ".trash").iterdir())}


def restored_from(workdir: Path, result: subprocess.CompletedProcess, name: str) -> Path:
    """Check a successful restore's output; return the backup it names."""
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    assert result.stderr == "", result.stderr
    match = re.fullmatch(rf"restored (\S+) -> {re.escape(name)}\n", result.stdout)
    assert match, result.stdout
    backup = workdir / match.group(1)
    assert backup.parent == workdir / ".trash", backup
    return backup


# ---------------------------------------------------------------- backups made by the tools


def test_write_and_edit_back_up_the_exact_old_bytes(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    old_data = b"\xff\xfe not UTF-8 \x00 at all\r\n"
    (workdir / "data.bin").write_bytes(old_data)
    (workdir / "doc.txt").write_bytes(b"hello world\n")
    got = run(
        chapter,
        provider,
        workdir,
        calls(
            read("r_data", "data.bin"),
            write("w_data", "data.bin", "replaced\n"),
            read("r_doc", "doc.txt"),
            ("e_miss", "edit_file", {"path": "doc.txt", "old_string": "absent", "new_string": "x"}),
            ("e_doc", "edit_file", {"path": "doc.txt", "old_string": "world", "new_string": "there"}),
            write("w_new", "sub/new.txt", "fresh\n"),
        ),
    )
    assert got["w_data"].startswith("wrote 9 bytes to data.bin (old version saved as .trash/"), got["w_data"]
    assert got["e_doc"].startswith("edited doc.txt: replaced 1 occurrence (old version saved as"), got["e_doc"]
    data_backup, doc_backup = backup_named(workdir, got["w_data"]), backup_named(workdir, got["e_doc"])
    assert data_backup.read_bytes() == old_data
    assert doc_backup.read_bytes() == b"hello world\n"
    assert (workdir / "data.bin").read_bytes() == b"replaced\n"
    assert (workdir / "doc.txt").read_bytes() == b"hello there\n"
    # A new file has no old version; a failed edit changes nothing, so needs none.
    assert got["w_new"] == "wrote 6 bytes to sub/new.txt", got["w_new"]
    assert got["e_miss"].startswith("error: "), got["e_miss"]
    assert sorted(trash(workdir)) == sorted([data_backup.name, doc_backup.name])
    assert not (workdir / "sub" / ".trash").exists()


def test_the_write_is_refused_when_the_backup_fails(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    # .trash is a regular file, so the backup cannot be made (this works as root too).
    (workdir / ".trash").write_bytes(b"not a directory\n")
    (workdir / "notes.txt").write_bytes(b"keep me\n")
    (workdir / "doc.txt").write_bytes(b"hello world\n")
    got = run(
        chapter,
        provider,
        workdir,
        calls(
            read("r_notes", "notes.txt"),
            write("w_notes", "notes.txt", "lost?\n"),
            read("r_doc", "doc.txt"),
            ("e_doc", "edit_file", {"path": "doc.txt", "old_string": "world", "new_string": "there"}),
            write("w_new", "new.txt", "a new file needs no backup\n"),
        ),
    )
    for cid in ("w_notes", "e_doc"):
        assert got[cid].startswith("error: ") and "back up" in got[cid], got[cid]
    assert (workdir / "notes.txt").read_bytes() == b"keep me\n"
    assert (workdir / "doc.txt").read_bytes() == b"hello world\n"
    assert (workdir / ".trash").read_bytes() == b"not a directory\n"
    assert got["w_new"] == "wrote 27 bytes to new.txt"
    assert (workdir / "new.txt").read_bytes() == b"a new file needs no backup\n"


def test_backups_are_private_whatever_the_umask(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    """A backup holds what the file held: 0600, in a 0700 .trash/, made by the tools and by -restore.
    Under umask 000 nothing is masked off: the modes can only come from the program."""
    umask = 0o000
    (workdir / "notes.txt").write_bytes(b"v1\n")
    (workdir / "notes.txt").chmod(0o644)
    got = run(
        chapter,
        provider,
        workdir,
        calls(read("r", "notes.txt"), write("w2", "notes.txt", "v2\n"), write("w3", "notes.txt", "v3\n")),
        umask=umask,
    )
    made = [backup_named(workdir, got["w2"]), backup_named(workdir, got["w3"])]
    restored_from(workdir, restore(chapter, workdir, "notes.txt", umask=umask), "notes.txt")
    assert stat.S_IMODE((workdir / ".trash").stat().st_mode) == 0o700
    backups = sorted((workdir / ".trash").iterdir())
    assert len(backups) == 3 and set(made) < set(backups)  # and the version -restore replaced
    assert {path.name: oct(stat.S_IMODE(path.stat().st_mode)) for path in backups} == {
        path.name: "0o600" for path in backups
    }


# ---------------------------------------------------------------- -restore


def test_restore_picks_the_newest_backup_of_exactly_that_file_and_loses_nothing(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    target, sibling = workdir / "list.txt", workdir / "list.txt.old"
    target.write_bytes(b"v1\n")
    sibling.write_bytes(b"old-v1\n")
    got = run(
        chapter,
        provider,
        workdir,
        # Two writes in one round: two backups within the same second.
        calls(read("r", "list.txt"), write("w2", "list.txt", "v2\n"), write("w3", "list.txt", "v3\n")),
        # list.txt.old is backed up last: its backup is the newest in .trash.
        calls(read("r_old", "list.txt.old"), write("w_old", "list.txt.old", "old-v2\n")),
    )
    first, second = backup_named(workdir, got["w2"]), backup_named(workdir, got["w3"])
    assert first != second
    assert first.read_bytes() == b"v1\n" and second.read_bytes() == b"v2\n"
    assert backup_named(workdir, got["w_old"]).read_bytes() == b"old-v1\n"
    assert target.read_bytes() == b"v3\n"
    versions = {b"v1\n", b"v2\n", b"v3\n"}

    result = restore(chapter, workdir, "list.txt")
    assert restored_from(workdir, result, "list.txt") == second
    assert target.read_bytes() == b"v2\n"
    assert sibling.read_bytes() == b"old-v2\n"
    after_first = trash(workdir)
    assert len(after_first) == 4
    assert b"v3\n" in after_first.values(), "the replaced version was not backed up"
    assert versions <= set(after_first.values()) | {target.read_bytes()}

    # Restoring again brings back the version the first restore replaced.
    result = restore(chapter, workdir, "list.txt")
    assert restored_from(workdir, result, "list.txt").read_bytes() == b"v3\n"
    assert target.read_bytes() == b"v3\n"
    assert sibling.read_bytes() == b"old-v2\n"
    after_second = trash(workdir)
    assert len(after_second) == 5
    assert list(after_second.values()).count(b"v2\n") == 2  # v2 backed up again before it was replaced
    assert versions <= set(after_second.values()) | {target.read_bytes()}


LONG = "这个文件名很长用来检查备份在名字超过限制时是否也能正常工作"  # 29 characters


def test_a_long_file_name_still_gets_its_backups(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    """A backup's name is the file's path quoted (9 bytes a Chinese character), over the 255 bytes a
    file name may have here: the key keeps its start plus a hash of the whole, so two long names
    that differ only at the end still get backups of their own."""
    first, second = f"{LONG}甲", f"{LONG}乙"  # 30 Chinese characters: 90 bytes, 270 once quoted
    assert len(first) == len(second) == 30
    (workdir / first).write_bytes(b"v1\n")
    (workdir / second).write_bytes(b"other-v1\n")
    got = run(
        chapter,
        provider,
        workdir,
        calls(read("r", first), write("w2", first, "v2\n"), write("w3", first, "v3\n")),
        calls(read("r_other", second), write("w_other", second, "other-v2\n")),
    )
    older, newer = backup_named(workdir, got["w2"]), backup_named(workdir, got["w3"])
    other = backup_named(workdir, got["w_other"])
    assert len({older, newer, other}) == 3
    assert older.read_bytes() == b"v1\n" and newer.read_bytes() == b"v2\n" and other.read_bytes() == b"other-v1\n"
    assert all(len(path.name.encode()) <= 255 for path in (older, newer, other))

    result = restore(chapter, workdir, first)
    assert restored_from(workdir, result, first) == newer
    assert (workdir / first).read_bytes() == b"v2\n"
    assert (workdir / second).read_bytes() == b"other-v2\n"
    assert b"v3\n" in trash(workdir).values()  # the replaced version was backed up, under the long name too
    result = restore(chapter, workdir, second)
    assert restored_from(workdir, result, second) == other
    assert (workdir / second).read_bytes() == b"other-v1\n"


def test_same_name_in_two_directories_is_kept_apart(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    for name in ("a", "b"):
        (workdir / name).mkdir()
        (workdir / name / "list.txt").write_bytes(f"{name}-old\n".encode())
    got = run(
        chapter,
        provider,
        workdir,
        calls(
            read("ra", "a/list.txt"),
            write("wa", "a/list.txt", "a-new\n"),
            read("rb", "b/list.txt"),
            write("wb", "b/list.txt", "b-new\n"),
        ),
    )
    a_backup, b_backup = backup_named(workdir, got["wa"]), backup_named(workdir, got["wb"])
    assert a_backup != b_backup
    assert a_backup.read_bytes() == b"a-old\n" and b_backup.read_bytes() == b"b-old\n"

    # b's backup is the newer one; -restore a/list.txt must still take a's.
    result = restore(chapter, workdir, "a/list.txt")
    assert restored_from(workdir, result, "a/list.txt") == a_backup
    assert (workdir / "a" / "list.txt").read_bytes() == b"a-old\n"
    assert (workdir / "b" / "list.txt").read_bytes() == b"b-new\n"
    assert b"a-new\n" in trash(workdir).values()


# ---------------------------------------------------------------- -restore failures


def test_restore_without_a_trash_directory(workdir: Path, chapter: int | str) -> None:
    (workdir / "list.txt").write_bytes(b"current\n")
    result = restore(chapter, workdir, "list.txt")
    assert_one_error_line(result, ".trash")
    assert (workdir / "list.txt").read_bytes() == b"current\n"
    assert sorted(path.name for path in workdir.iterdir()) == ["list.txt"]


@pytest.mark.parametrize("args", [(), ("",)], ids=["no-file", "empty-file"])
def test_restore_without_a_file_is_a_usage_error(workdir: Path, chapter: int | str, args: tuple[str, ...]) -> None:
    (workdir / ".trash").mkdir()
    result = restore(chapter, workdir, *args)
    assert_one_error_line(result)
    # An empty FILE is no FILE: the user needs the usage line, not "no backup of  in .trash".
    assert "restore" in result.stderr, result.stderr
    assert list((workdir / ".trash").iterdir()) == []


def test_restore_with_no_backup_of_that_file(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    (workdir / "list.txt").write_bytes(b"current\n")
    (workdir / "list.txt.old").write_bytes(b"older\n")
    (workdir / "sub").mkdir()
    (workdir / "sub" / "list.txt").write_bytes(b"elsewhere\n")
    run(
        chapter,
        provider,
        workdir,
        calls(
            read("r1", "list.txt.old"),
            write("w1", "list.txt.old", "changed\n"),
            read("r2", "sub/list.txt"),
            write("w2", "sub/list.txt", "changed\n"),
        ),
    )
    before = trash(workdir)
    assert len(before) == 2
    result = restore(chapter, workdir, "list.txt")
    assert_one_error_line(result, "list.txt")
    assert (workdir / "list.txt").read_bytes() == b"current\n"
    assert trash(workdir) == before


def test_restore_from_an_unreadable_backup_changes_nothing(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    (workdir / "list.txt").write_bytes(b"v1\n")
    got = run(chapter, provider, workdir, calls(read("r", "list.txt"), write("w", "list.txt", "v2\n")))
    backup = backup_named(workdir, got["w"])
    # The backup becomes a directory: it cannot be read as a file.
    backup.unlink()
    backup.mkdir()
    result = restore(chapter, workdir, "list.txt")
    assert_one_error_line(result, "list.txt")
    assert (workdir / "list.txt").read_bytes() == b"v2\n"
    assert [path.name for path in (workdir / ".trash").iterdir()] == [backup.name]


def test_restore_onto_a_symlink_loop_is_a_clean_error(workdir: Path, chapter: int | str) -> None:
    """`ln -s loop loop`, and a backup of `loop` in .trash: -restore loop fails in one line (before
    Python 3.13 finding the backup's key raised RuntimeError), and changes nothing."""
    os.symlink("loop", workdir / "loop")
    (workdir / ".trash").mkdir()
    (workdir / ".trash" / "loop~20260801-010203-000000").write_bytes(b"saved\n")
    before = snapshot(workdir)
    result = restore(chapter, workdir, "loop")
    assert_one_error_line(result, "loop")
    assert snapshot(workdir) == before


def test_content_that_cannot_be_written_makes_no_backup(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    """A lone surrogate cannot be encoded as UTF-8: the write fails before any backup is made."""
    (workdir / "list.txt").write_bytes(b"milk\n")
    got = run(
        chapter,
        provider,
        workdir,
        calls(read("r", "list.txt")),
        calls(("w", "write_file", '{"path": "list.txt", "content": "a\\ud800b"}')),
    )
    assert got["w"].startswith("error: write_file failed on list.txt"), got["w"]
    assert (workdir / "list.txt").read_bytes() == b"milk\n"
    assert not (workdir / ".trash").exists()
