"""Atomic file writes: a file is written completely or not at all, and only over a regular file.

`write_atomically` writes a temporary file beside the target and renames it onto the target. A target that is a
symbolic link is written through: the file it points to gets the new content and the link stays. A target that
exists and is not a regular file (a directory, a FIFO, a device such as /dev/full) is refused, since renaming
over it would replace the device or pipe with a plain file.

`all_or_nothing()` groups the writes of one command: inside it every `write_atomically` call writes its temporary
file at once (so a full disk or an unwritable folder fails early), but the renames wait until the block ends
without an exception. A command that fails half-way therefore leaves none of its outputs behind, and every
target keeps its old content.
"""

import contextlib
import contextvars
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from traces.errors import EplbError

# The (temporary file, target) pairs staged by the innermost active `all_or_nothing` block, or None outside one.
_STAGED: contextvars.ContextVar[list[tuple[Path, Path]] | None] = contextvars.ContextVar("_STAGED", default=None)


def resolve_target(path: str | os.PathLike) -> Path:
    """The regular file a write to `path` should replace: symbolic links followed, missing folders allowed.

    Raises `EplbError` when the path (after links) exists and is not a regular file, or a parent is a file.
    """
    given = Path(path)
    target = Path(os.path.realpath(given))
    for parent in target.parents:
        if parent.exists() and not parent.is_dir():
            raise EplbError(f"cannot write {given}: {parent} is a file, not a directory")
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise EplbError(f"cannot write {given}: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file (a device, FIFO or socket)"
        raise EplbError(f"cannot write {given}: it exists and is {kind}; give the path of a regular file")
    return target


def write_atomically(path: str | os.PathLike, write: Callable[[Path], None]) -> None:
    """Call `write(tmp_path)` on a temporary file next to `path`'s target, then rename it onto the target.

    An exception inside `write` leaves the target as it was (absent or its old content) and no temporary file.
    Inside `all_or_nothing()` the rename waits for the end of the block. An `OSError` while writing becomes an
    `EplbError` that names `path`, never the temporary file.
    """
    given = Path(path)
    target = resolve_target(given)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp" + target.suffix, dir=target.parent)
        os.close(fd)
    except OSError as exc:
        raise EplbError(f"cannot write {given}: {exc.strerror or exc}") from None
    tmp = Path(tmp_name)
    try:
        # mkstemp creates 0600: give the file the mode of the file it replaces, or the one a plain open() would.
        os.chmod(tmp, stat.S_IMODE(os.stat(target).st_mode) if target.exists() else 0o666 & ~_umask())
        write(tmp)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise EplbError(f"cannot write {given}: {exc.strerror or exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    staged = _STAGED.get()
    if staged is not None:
        staged.append((tmp, target))
        return
    _rename(tmp, target, given)


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


@contextlib.contextmanager
def all_or_nothing() -> Iterator[None]:
    """Stage every atomic write inside the block; rename them all when it ends cleanly, discard them otherwise."""
    staged: list[tuple[Path, Path]] = []
    token = _STAGED.set(staged)
    try:
        yield
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    finally:
        _STAGED.reset(token)
    for index, (tmp, target) in enumerate(staged):
        try:
            _rename(tmp, target, target)
        except EplbError:
            for later, _ in staged[index + 1:]:
                later.unlink(missing_ok=True)
            raise


def _rename(tmp: Path, target: Path, given: Path) -> None:
    try:
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise EplbError(f"cannot write {given}: {exc.strerror or exc}") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
