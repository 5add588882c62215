"""Atomic writes: all or nothing, through symbolic links, never over a device or FIFO, errors naming the target."""

import os

import pytest

from traces import EplbError
from traces.atomic_file import all_or_nothing, write_atomically, write_text_atomically


def test_a_failing_write_keeps_the_old_content_and_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old")

    def fail(tmp):
        tmp.write_text("half")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        write_atomically(target, fail)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_an_os_error_while_writing_names_the_target_not_the_temporary_file(tmp_path):
    def fail(tmp):
        raise OSError(28, "No space left on device", str(tmp))

    with pytest.raises(EplbError, match=r"cannot write .*out\.json: No space left on device$") as caught:
        write_atomically(tmp_path / "out.json", fail)
    assert ".tmp" not in str(caught.value)


def test_all_or_nothing_renames_every_staged_file_only_when_the_block_ends_cleanly(tmp_path):
    with all_or_nothing():
        write_text_atomically(tmp_path / "a.txt", "a")
        write_text_atomically(tmp_path / "b.txt", "b")
        assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == []
    assert (tmp_path / "a.txt").read_text() == "a" and (tmp_path / "b.txt").read_text() == "b"


def test_all_or_nothing_discards_every_staged_file_when_the_block_fails(tmp_path):
    (tmp_path / "a.txt").write_text("old a")
    with pytest.raises(EplbError, match="is a file, not a directory"):
        with all_or_nothing():
            write_text_atomically(tmp_path / "a.txt", "new a")
            write_text_atomically(tmp_path / "new.txt", "new")
            write_text_atomically(tmp_path / "a.txt" / "under.txt", "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]
    assert (tmp_path / "a.txt").read_text() == "old a"


def test_a_symlink_target_is_written_through_and_the_link_kept(tmp_path):
    real = tmp_path / "real.txt"
    real.write_text("old")
    link = tmp_path / "link.txt"
    os.symlink(real, link)
    write_text_atomically(link, "new")
    assert link.is_symlink() and real.read_text() == "new"


def test_a_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "link.txt"
    os.symlink(tmp_path / "sub" / "real.txt", link)
    write_text_atomically(link, "new")
    assert link.is_symlink() and (tmp_path / "sub" / "real.txt").read_text() == "new"


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"], ids=["fifo", "directory", "device-dev-null"])
def test_a_target_that_is_not_a_regular_file_is_refused_and_kept(tmp_path, kind):
    if kind == "fifo":
        target = tmp_path / "pipe"
        os.mkfifo(target)
    elif kind == "directory":
        target = tmp_path / "folder"
        target.mkdir()
    else:
        target = tmp_path / "null_link"
        os.symlink("/dev/null", target)
    with pytest.raises(EplbError, match="give the path of a regular file"):
        write_text_atomically(target, "x")
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]
