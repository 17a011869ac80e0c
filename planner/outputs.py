"""Writing the files a user names (``-o``, ``--plot``, ``--write-config``): checked first, written atomically.

Every output path is checked by :func:`check_output` before any work starts (a search can take
minutes; a typo in ``-o`` should not cost them), and written by :func:`write_output` /
:func:`write_output_with`, which:

* refuse a symbolic link (dangling or not): writing through one would let anyone who can plant a link
  in the output folder make ``-o plan.json`` overwrite a file elsewhere;
* refuse anything that is not a regular file (directory, device node, FIFO, socket), even with
  ``--force``: ``--force`` means "replace my old output", never "replace /dev/sda";
* refuse an existing file without ``--force``;
* write a fresh temporary file made by :func:`tempfile.mkstemp` (``O_EXCL``, an unpredictable name)
  in the target's own folder, then :func:`os.replace` it over the target, so a reader sees the old
  file or the new one, never half of one; ``os.replace`` renames over the link itself, never
  through it, so a link planted between the check and the rename is replaced, not followed;
* without ``--force``, publish with :func:`os.link`, which fails if the name appeared meanwhile;
* remove the temporary file on every failure (full disk, file-size limit, read-only folder) and
  turn the failure into a one-line :class:`~planner.core.errors.InputError`.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import Callable

from planner.core.errors import InputError

__all__ = ["check_output", "write_output", "write_output_with", "plot_formats"]


def plot_formats() -> dict[str, str]:
    """File extensions the plotting backend (matplotlib's Agg canvas) writes: ``{ext: description}``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    return dict(FigureCanvasAgg.get_supported_filetypes())


def check_output(path: Path, *, force: bool, flag: str = "-o", formats: dict[str, str] | None = None) -> Path:
    """Refuse an output path that :func:`write_output` would refuse, before any work is done.

    Parameters
    ----------
    path:
        The file the user named.
    force:
        Whether an existing regular file may be replaced (``--force``).
    flag:
        The option that named it (``-o``, ``--plot``), for the message.
    formats:
        When given, the file's extension must be one of these keys (``--plot``).

    Returns
    -------
    Path
        ``path``, unchanged.

    Raises
    ------
    InputError
        A symbolic link, a non-regular file, an existing file without ``force``, a missing or
        unwritable folder, or an unsupported extension.

    Examples
    --------
    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> check_output(folder / "plan.json", force=False).name
    'plan.json'
    >>> (folder / "plan.json").write_text("{}")
    2
    >>> check_output(folder / "plan.json", force=False)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    planner.core.errors.InputError: ... exists; pass --force to overwrite it or choose another -o file
    """
    path = Path(path)
    if formats is not None:
        extension = path.suffix.lower().lstrip(".")
        if extension not in formats:
            known = ", ".join(sorted(formats))
            raise InputError(f"{flag} {path}: cannot write a '{path.suffix or 'no extension'}' image; name it .png or one of {known}")
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise InputError(f"{flag} {path}: cannot check it ({exc.strerror}); choose another {flag} file") from None
    if info is not None:
        if stat.S_ISLNK(info.st_mode):
            raise InputError(f"{flag} {path} is a symbolic link; name the real file or choose another {flag} file")
        if not stat.S_ISREG(info.st_mode):
            kind = _kind(info.st_mode)
            raise InputError(f"{flag} {path} is {kind}, not a regular file (even --force replaces only files); choose another {flag} file")
        if not force:
            raise InputError(f"{path} exists; pass --force to overwrite it or choose another {flag} file")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise InputError(f"folder {folder} does not exist; create it or choose another {flag} file")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"folder {folder} is not writable; choose another {flag} file")
    return path


def write_output(path: Path, data: str | bytes, *, force: bool, flag: str = "-o") -> None:
    """Write ``data`` (text is UTF-8) to ``path`` atomically, with the checks of :func:`check_output`.

    Examples
    --------
    >>> import tempfile
    >>> target = Path(tempfile.mkdtemp()) / "plan.json"
    >>> write_output(target, "{}\\n", force=False)
    >>> target.read_text(), sorted(p.name for p in target.parent.iterdir())
    ('{}\\n', ['plan.json'])
    """
    payload = data.encode("utf-8") if isinstance(data, str) else data

    def write(temporary: Path) -> None:
        with open(temporary, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())

    write_output_with(path, write, force=force, flag=flag)


def write_output_with(path: Path, writer: Callable[[Path], None], *, force: bool, flag: str = "-o") -> None:
    """Let ``writer(temporary_path)`` fill a fresh temporary file, then put it at ``path`` atomically.

    ``writer`` must write to the path it is given (e.g. ``figure.savefig(tmp, format="png")``); the
    temporary file already exists, empty, with mode 0600.
    """
    path = Path(path)
    check_output(path, force=force, flag=flag)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        handle, name = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise InputError(f"cannot write {path} ({exc.strerror}); choose another {flag} file") from None
    os.close(handle)
    temporary = Path(name)
    try:
        writer(temporary)
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp's 0600 is for the unfinished file only
        if force:
            os.replace(temporary, path)
        else:
            _publish_new(temporary, path, flag)
    except InputError:
        raise
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            fix = "free space (or raise the file-size limit) or choose another folder"
        else:
            fix = f"choose another {flag} file"
        raise InputError(f"cannot write {path} ({reason}); {fix}") from None
    finally:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        except OSError:  # the folder turned read-only meanwhile: nothing more we can do
            pass


def _publish_new(temporary: Path, path: Path, flag: str) -> None:
    """Put ``temporary`` at ``path`` only if ``path`` still does not exist (``os.link`` fails with
    EEXIST otherwise); a file system without hard links falls back to a checked ``os.replace``."""
    try:
        os.link(temporary, path, follow_symlinks=False)
    except FileExistsError:
        raise InputError(f"{path} exists; pass --force to overwrite it or choose another {flag} file") from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        check_output(path, force=False, flag=flag)
        os.replace(temporary, path)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"
