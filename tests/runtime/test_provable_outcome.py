"""The rule that settles a file tool found Started after a crash (``objects_spec.md`` §14.14), as a pure function."""

from __future__ import annotations

from kxen_agent.runtime.recovery import provable_file_outcome as proven


def test_write_file_is_proven_only_when_the_file_changed_to_its_content() -> None:
    args = {"path": "a.txt", "content": "new\n"}
    assert proven("write_file", args, None, b"new\n")  # created
    assert proven("write_file", args, b"old\n", b"new\n")  # replaced
    assert not proven("write_file", args, b"new\n", b"new\n")  # it held that already: nothing proves the write
    assert not proven("write_file", args, b"old\n", b"old\n")  # not written
    assert not proven("write_file", args, b"old\n", None)  # gone
    assert not proven("write_file", args, None, b"other\n")  # changed by something else


def test_edit_file_is_proven_only_for_its_one_replacement() -> None:
    args = {"path": "a.txt", "old": "x = 1", "new": "x = 2"}
    assert proven("edit_file", args, b"a\nx = 1\n", b"a\nx = 2\n")
    assert not proven("edit_file", args, b"a\nx = 1\n", b"a\nx = 1\n")
    assert not proven("edit_file", args, None, b"x = 2\n")  # no before: the edit would have been refused
    assert not proven("edit_file", args, b"x = 1\nx = 1\n", b"x = 2\nx = 1\n")  # twice: refused, never written
    assert not proven("edit_file", {**args, "new": "x = 1"}, b"x = 1\n", b"x = 1\n")  # a no-op edit
    assert not proven("edit_file", {**args, "old": ""}, b"x\n", b"x\n")


def test_never_for_the_shell_or_another_tool() -> None:
    assert not proven("shell", {"command": "echo x > a"}, None, b"x\n")
    assert not proven("read_file", {"path": "a"}, None, b"x\n")
