"""Atomic file writes: a file is written completely or not at all."""

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from traces.errors import EplbError


def write_atomically(path: str | os.PathLike, write: Callable[[Path], None]) -> None:
    """Call `write(tmp_path)` on a temporary file next to `path`, then rename it onto `path`.

    A crash or an exception inside `write` leaves `path` as it was (absent or its old content).
    """
    target = Path(path)
    for parent in target.parents:
        if parent.exists() and not parent.is_dir():
            raise EplbError(f"cannot write {target}: {parent} is a file, not a directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp" + target.suffix, dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file the mode a plain open() would
    try:
        write(tmp)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
