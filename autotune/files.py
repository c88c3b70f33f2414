"""What is at a path, read and written safely: anything but a regular file is refused before
it is opened or replaced (a FIFO waits for a writer forever, a device never ends, a rename
over a device node or a pipe would replace the node itself), and every output autotune writes
is written atomically (``write_json_atomic``). No torch import here."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

from autotune.errors import ConfigError, OutputExistsError
from autotune.names import FLAGS, Names


def not_a_file(path: Path) -> str | None:
    """What ``path`` is when it exists but is not a regular file (``a directory``, ``a FIFO
    (named pipe)``, ...), or None when it is a file or is missing. Reading a FIFO would wait
    for a writer forever: such a path is refused before it is opened."""
    try:
        mode = path.stat().st_mode
    except (OSError, ValueError):  # missing, unreadable, or a NUL in the name
        return None
    return file_kind(mode)


def file_kind(mode: int) -> str | None:
    """What a file of ``st_mode`` ``mode`` is when it is not a regular file (``a directory``,
    ``a FIFO (named pipe)``, ``a character device``, ...); None for a regular file."""
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"))
    if stat.S_ISREG(mode):
        return None
    return next((what for test, what in kinds if test(mode)), "not a regular file")


def read_regular_file(path: Path) -> bytes:
    """The bytes of ``path``, read only when it is a regular file: a FIFO opened to read
    waits for a writer forever, a device such as ``/dev/zero`` never ends. It is opened
    without waiting and checked on the open file (nothing can swap it in between).

    Raises:
        OSError: missing or unreadable, or not a regular file (``strerror`` says what is
            there).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with open(fd, "rb") as f:
        kind = file_kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise OSError(errno.EINVAL, f"it is {kind}, not a regular file")
        return f.read()

def check_output(path: Path, *, force: bool = False, name: Names = FLAGS,
                 setting: str = "out") -> None:
    """Refuse to write an output at ``path``: the one check of every output autotune writes
    (``write_json_atomic``; a search checks its outputs with it before it starts).

    Raises:
        OutputExistsError: a file is there and ``force`` is False.
        ConfigError: something else than a regular file is there (a folder, a FIFO, a device,
            a link to one), ``force`` or not: a rename over it would replace the device node
            or the pipe itself; or a folder above ``path`` is a file.

    ``name`` says the settings the user's way (``--force`` or ``force=True``), ``setting``
    which one chose the path (``out``: a folder; ``output``: export's file or folder).
    """
    path = Path(path)
    kind = not_a_file(path)
    if kind is not None:
        link = f" (a link to {os.readlink(path)})" if path.is_symlink() else ""
        raise ConfigError(f"{path}{link} is {kind}, not a regular file: autotune writes its "
                          f"outputs as files and replaces nothing else, also with "
                          f"{name.given('force', True)}; choose another path")
    if path.exists() and not force:
        raise OutputExistsError(path, _exists(path, name, setting))
    for folder in path.parents:  # the nearest one that exists must be a folder
        try:
            if stat.S_ISDIR(folder.stat().st_mode):
                return
        except (FileNotFoundError, NotADirectoryError):
            continue  # not there (yet), or under a file: its parent says
        except (OSError, ValueError):
            return  # unreadable: writing it says why
        raise ConfigError(f"cannot write {path}: {folder} is a file, not a folder; choose "
                          f"another {_where(name, setting)}, or move the file")


def _exists(path: Path, name: Names, setting: str) -> str:
    return (f"{path} already exists and was not overwritten: pass {name.given('force', True)} "
            f"to replace it, or choose another {_where(name, setting)}")


def _where(name: Names, setting: str) -> str:
    """The setting that chose an output's path, the user's way: ``--out folder``, ``-o/--output
    path``."""
    return f"{name(setting)} {'folder' if setting == 'out' else 'path'}"


def write_json_atomic(path: Path, text: str | bytes, *, force: bool = False,
                      name: Names = FLAGS, setting: str = "out") -> None:
    """Write ``text`` (or bytes) to ``path`` atomically, with the user's umask, never over
    another file, and over nothing but a regular file (``check_output``).

    The text goes to a temporary file beside ``path``, which then takes the name in one step: a
    hard link (fails if the name exists, also when another process wrote it after the check
    at the start) or, with ``force``, a rename over it. Readers never see a half-written file.
    ``name`` and ``setting`` say what chose the path in errors (``check_output``).

    Raises:
        OutputExistsError: ``path`` exists and ``force`` is False.
        ConfigError: not a regular file at ``path``, a file above it, the folder not writable.
    """
    path = Path(path)
    check_output(path, force=force, name=name, setting=setting)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with (os.fdopen(fd, "wb") if isinstance(text, bytes) else
                  os.fdopen(fd, "w", encoding="utf-8")) as f:
                f.write(text)
            os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600
            if force:
                check_output(path, force=True, name=name, setting=setting)  # the write took a while
                os.replace(tmp, path)
            else:
                try:
                    _link_exclusive(tmp, path)
                except OutputExistsError:  # written meanwhile: said the user's way
                    raise OutputExistsError(path, _exists(path, name, setting)) from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}; choose a writable "
                          f"{_where(name, setting)}") from exc


def _link_exclusive(tmp: str, path: Path) -> None:
    """Give the complete ``tmp`` the name ``path`` unless that name exists."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise OutputExistsError(path) from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK):
            raise
        # A file system without hard links: claim the name exclusively (an empty file for an
        # instant, never a partial one), then move the complete file onto it.
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        except FileExistsError:
            raise OutputExistsError(path) from None
        os.replace(tmp, path)


def _umask() -> int:
    """The process's umask: read from /proc on Linux (setting it to read it back races with
    other threads creating files), else set and restored."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
