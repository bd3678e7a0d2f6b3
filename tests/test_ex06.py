"""Chapter 6: the tool registry (read_file, write_file, edit_file; read-before-write).

The real exercises/ex06/agent.py runs as a subprocess against the fake
provider, and so does agent.py ("final"), which inherits the registry. The
tests check the tool results that reached the server, the files on disk, and
what the user sees.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import run_agent
from fake_provider import FakeProvider, Reply, text, tool_call
from helpers import Live, assert_ok, calls, project_files, results, since

pytestmark = pytest.mark.parametrize("chapter", [6, "final"])
TASK = "Update the files."


def run(chapter: int | str, provider: FakeProvider, workdir: Path, *replies: Reply) -> subprocess.CompletedProcess:
    provider.script(*replies)
    result = run_agent(chapter, TASK, provider=provider, cwd=workdir)
    assert_ok(result, stdout="Done.\n")
    return result


def is_error(result: str) -> bool:
    return result.startswith("error: ")


# ---------------------------------------------------------------- tools declared, new files


def test_tools_declared_and_new_files_need_no_read(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    run(
        chapter,
        provider,
        workdir,
        calls(
            ("w_deep", "write_file", {"path": "deep/er/new.txt", "content": "héllo wörld"}),
            ("w_top", "write_file", {"path": "top.txt", "content": "first\n"}),
        ),
        # Files written in this run are known: edit and overwrite them without reading.
        calls(
            ("e_deep", "edit_file", {"path": "deep/er/new.txt", "old_string": "wörld", "new_string": "world"}),
            ("w_again", "write_file", {"path": "top.txt", "content": "second\n"}),
        ),
        text("Done."),
    )
    tools = provider.chat_requests[0]["tools"]
    declared = {tool["function"]["name"]: tool["function"]["parameters"]["required"] for tool in tools}
    expected = {
        "read_file": ["path"],
        "write_file": ["path", "content"],
        "edit_file": ["path", "old_string", "new_string"],
    }
    if since(chapter, 7):
        expected["bash"] = ["command"]
    if chapter == "final":  # the later chapters' tools come after these
        declared = {name: required for name, required in declared.items() if name in expected}
    assert declared == expected
    assert all(request["tools"] == tools for request in provider.chat_requests)
    got = results(provider)
    assert not any(is_error(result) for result in got.values()), got
    assert (workdir / "deep/er/new.txt").read_bytes() == "héllo world".encode()
    assert (workdir / "top.txt").read_bytes() == b"second\n"


def test_write_file_reports_utf8_bytes(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    contents = {
        "e.txt": ("héllo", 6),
        "zh.txt": ("你好", 6),
        "emoji.txt": ("😀", 4),
        "crlf.txt": ("a\r\nb", 4),
        "empty.txt": ("", 0),
    }
    run(
        chapter,
        provider,
        workdir,
        calls(*[(name, "write_file", {"path": name, "content": c}) for name, (c, _) in contents.items()]),
        text("Done."),
    )
    got = results(provider)
    for name, (content, size) in contents.items():
        reported = re.findall(r"(\d+) bytes", got[name])
        assert not is_error(got[name]) and reported == [str(size)], (name, got[name])
        assert (workdir / name).read_bytes() == content.encode("utf-8"), name


# ---------------------------------------------------------------- read before write


def test_an_unread_file_cannot_be_changed_until_it_is_read(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    target = workdir / "list.txt"
    original = b"eggs\nbread\n"
    target.write_bytes(original)
    provider.script(
        calls(
            ("w1", "write_file", {"path": "list.txt", "content": "clobbered\n"}),
            ("e1", "edit_file", {"path": "list.txt", "old_string": "bread\n", "new_string": "bread\nmilk\n"}),
        ),
        # The fake holds its answer to the second request until released: by
        # then the first round's tools have run.
        tool_call("read_file", {"path": "list.txt"}, call_id="r1", pause_after=0),
        calls(("e2", "edit_file", {"path": "list.txt", "old_string": "bread\n", "new_string": "bread\nmilk\n"})),
        text("Done."),
    )
    with Live(chapter, TASK, provider=provider, cwd=workdir) as agent:
        try:
            provider.wait_paused()
            assert target.read_bytes() == original  # both refused calls left the file alone
        finally:
            provider.release()
        assert_ok(agent.completed(), stdout="Done.\n")
    got = results(provider)
    for refused in ("w1", "e1"):
        assert is_error(got[refused]) and "read it first" in got[refused], got[refused]
    assert got["r1"] == "eggs\nbread\n"
    assert not is_error(got["e2"]), got["e2"]
    assert target.read_bytes() == b"eggs\nbread\nmilk\n"


def test_paths_are_compared_normalized(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    (workdir / "sub").mkdir()
    names = ["a.txt", "b.txt", "c.txt", "d.txt", "control.txt"]
    for name in names:
        (workdir / name).write_text(f"old {name}\n", encoding="utf-8")
    # (file, the path used to read it, the path used to write it)
    pairs = [
        ("a.txt", "./a.txt", "a.txt"),
        ("b.txt", "b.txt", "./b.txt"),
        ("c.txt", "sub/../c.txt", "c.txt"),
        ("d.txt", str(workdir / "d.txt"), "./d.txt"),
    ]
    run(
        chapter,
        provider,
        workdir,
        calls(*[(f"r_{name}", "read_file", {"path": read}) for name, read, _ in pairs]),
        calls(
            *[(f"w_{name}", "write_file", {"path": write, "content": f"new {name}\n"}) for name, _, write in pairs],
            # Never read: the rule is still on in this run.
            ("w_control", "write_file", {"path": "./control.txt", "content": "clobbered\n"}),
        ),
        text("Done."),
    )
    got = results(provider)
    for name, _, _ in pairs:
        assert got[f"r_{name}"] == f"old {name}\n"
        assert not is_error(got[f"w_{name}"]), (name, got[f"w_{name}"])
        assert (workdir / name).read_text(encoding="utf-8") == f"new {name}\n"
    assert "read it first" in got["w_control"]
    assert (workdir / "control.txt").read_text(encoding="utf-8") == "old control.txt\n"


# ---------------------------------------------------------------- edit_file


def test_edit_file_errors_are_distinct_and_change_nothing(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    fruit = b"apple\nbanana\napple pie\ncherry apple\n"
    binary = b"\xff\xfe abc apple\n"
    (workdir / "fruit.txt").write_bytes(fruit)
    (workdir / "latin1.txt").write_bytes(binary)
    run(
        chapter,
        provider,
        workdir,
        calls(
            ("r_fruit", "read_file", {"path": "fruit.txt"}),
            ("r_latin1", "read_file", {"path": "latin1.txt"}),
        ),
        calls(
            ("empty", "edit_file", {"path": "fruit.txt", "old_string": "", "new_string": "x"}),
            ("absent", "edit_file", {"path": "fruit.txt", "old_string": "durian", "new_string": "x"}),
            ("many", "edit_file", {"path": "fruit.txt", "old_string": "apple", "new_string": "pear"}),
            ("binary", "edit_file", {"path": "latin1.txt", "old_string": "abc", "new_string": "xyz"}),
            ("no_file", "edit_file", {"path": "nope.txt", "old_string": "a", "new_string": "b"}),
        ),
        text("Done."),
    )
    got = results(provider)
    errors = [got[key] for key in ("empty", "absent", "many", "binary", "no_file")]
    assert all(is_error(message) for message in errors), errors
    assert len(set(errors)) == len(errors), errors
    assert not any("read it first" in message for message in errors), errors
    assert "empty" in got["empty"]
    assert "not found" in got["absent"]
    assert "3 times" in got["many"]
    assert "nope.txt" in got["no_file"]
    assert (workdir / "fruit.txt").read_bytes() == fruit
    assert (workdir / "latin1.txt").read_bytes() == binary
    assert not (workdir / "nope.txt").exists()


def test_edit_file_changes_one_occurrence_and_keeps_every_other_byte(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    plain = b"alpha beta gamma\nbetamax\n"  # "beta " occurs once; "beta" twice
    # A BOM, CRLF endings, a tab, trailing spaces, non-ASCII, no final newline.
    windows = b"\xef\xbb\xbfline one\r\n\tline two  \r\nline three caf\xc3\xa9\r\nlast line"
    (workdir / "plain.txt").write_bytes(plain)
    (workdir / "windows.txt").write_bytes(windows)
    run(
        chapter,
        provider,
        workdir,
        calls(
            ("r_plain", "read_file", {"path": "plain.txt"}),
            ("r_windows", "read_file", {"path": "windows.txt"}),
        ),
        calls(
            ("e_plain", "edit_file", {"path": "plain.txt", "old_string": "beta ", "new_string": "BETA "}),
            ("e_win1", "edit_file", {"path": "windows.txt", "old_string": "line two", "new_string": "line 2"}),
            ("e_win2", "edit_file", {"path": "windows.txt", "old_string": "café\r\nlast", "new_string": "cafe\r\nend"}),
        ),
        text("Done."),
    )
    got = results(provider)
    assert got["r_windows"] == windows.decode("utf-8")  # read_file hands the CRs to the model
    for key in ("e_plain", "e_win1", "e_win2"):
        assert not is_error(got[key]), (key, got[key])
    assert (workdir / "plain.txt").read_bytes() == b"alpha BETA gamma\nbetamax\n"
    assert (workdir / "windows.txt").read_bytes() == (
        b"\xef\xbb\xbfline one\r\n\tline 2  \r\nline three cafe\r\nend line"
    )


# ---------------------------------------------------------------- bad arguments


def test_bad_arguments_are_errors_and_the_run_continues(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    (workdir / "kept.txt").write_text("keep me\n", encoding="utf-8")
    cases = {
        # id: (tool, arguments, a word the error must contain)
        "no_content": ("write_file", {"path": "m.txt"}, "content"),
        "no_path": ("write_file", {"content": "x"}, "path"),
        "empty_path": ("write_file", {"path": "", "content": "x"}, "path"),
        "no_new": ("edit_file", {"path": "kept.txt", "old_string": "keep"}, "new_string"),
        "int_content": ("write_file", {"path": "n.txt", "content": 5}, "content"),
        "read_no_path": ("read_file", {}, "path"),
        "bad_json": ("write_file", '{"path": "j.txt", "content": ', "JSON"),
        "not_object": ("read_file", '["kept.txt"]', "object"),
        "unknown": ("delete_file", {"path": "kept.txt"}, "delete_file"),
    }
    result = run(
        chapter,
        provider,
        workdir,
        calls(*[(key, name, args) for key, (name, args, _) in cases.items()]),
        text("Done."),
    )
    assert len(provider.chat_requests) == 2
    assert len(re.findall(r"^\[round 1\] ", result.stderr, re.M)) == len(cases)
    got = results(provider)
    for key, (_, _, needle) in cases.items():
        assert is_error(got[key]) and needle in got[key], (key, got[key])
    assert project_files(chapter, workdir) == ["kept.txt"]
    assert (workdir / "kept.txt").read_text(encoding="utf-8") == "keep me\n"


def test_nul_in_path_is_an_error_not_a_crash(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    # JSON allows "\u0000"; Path.resolve() and open() then raise ValueError, not OSError.
    raw = '{"path": "bad\\u0000name.txt", "content": "x"}'
    run(chapter, provider, workdir, tool_call("write_file", raw, call_id="nul"), text("Done."))
    assert is_error(results(provider)["nul"])
    assert project_files(chapter, workdir) == []


def test_lone_surrogate_in_content_is_an_error_not_a_crash(
    provider: FakeProvider, workdir: Path, chapter: int | str
) -> None:
    # JSON allows a lone "\ud800"; it cannot be encoded as UTF-8.
    raw = '{"path": "s.txt", "content": "a\\ud800b"}'
    run(chapter, provider, workdir, tool_call("write_file", raw, call_id="sur"), text("Done."))
    assert is_error(results(provider)["sur"])
    assert project_files(chapter, workdir) == []


# ---------------------------------------------------------------- a symlink loop


def test_a_symlink_loop_is_an_error_not_a_crash(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    """`ln -s loop loop`: a file tool on it, or on a path through it, gets an error result
    (before Python 3.13, Path.resolve() raises RuntimeError on a loop), the run goes on, and the
    link is left as it was."""
    os.symlink("loop", workdir / "loop")
    (workdir / "ok.txt").write_text("fine\n", encoding="utf-8")
    cases = {
        "read": ("read_file", {"path": "loop"}),
        "read_through": ("read_file", {"path": "loop/x.txt"}),
        "edit": ("edit_file", {"path": "loop", "old_string": "a", "new_string": "b"}),
        "write_through": ("write_file", {"path": "loop/x.txt", "content": "x\n"}),
        "after": ("read_file", {"path": "ok.txt"}),
    }
    run(chapter, provider, workdir, calls(*[(key, name, args) for key, (name, args) in cases.items()]), text("Done."))
    got = results(provider)
    for key in cases.keys() - {"after"}:
        assert is_error(got[key]) and "loop" in got[key], (key, got[key])
    assert got["after"] == "fine\n"
    assert os.readlink(workdir / "loop") == "loop"
    assert project_files(chapter, workdir) == ["loop", "ok.txt"]


def test_writing_to_a_symlink_loop_is_an_error(provider: FakeProvider, workdir: Path, chapter: int | str) -> None:
    os.symlink("loop", workdir / "loop")
    run(chapter, provider, workdir, calls(("write", "write_file", {"path": "loop", "content": "x\n"})), text("Done."))
    got = results(provider)
    assert is_error(got["write"]) and "loop" in got["write"], got["write"]
    assert os.readlink(workdir / "loop") == "loop"
    assert project_files(chapter, workdir) == ["loop"]
