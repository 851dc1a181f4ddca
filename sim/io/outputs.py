"""Output folders written whole or not at all, and never over a user's files without --force.

Every command that writes an --out folder goes through `staged_output`: the files are written into a
hidden folder next to the target and moved into place only when the command succeeded, so a failed or
interrupted run leaves no half-written output folder behind. `check_out_dir` refuses, before any work,
an --out that is a file, lies under a file, cannot be written, or already holds files the command
would overwrite (unless --force).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from sim.io.errors import ConfigError


def _nearest_existing(path: Path) -> Path:
    for p in (path, *path.parents):
        if p.exists():
            return p
    return Path(".")


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _probe(anchor: Path, path: Path, flag: str) -> None:
    """Create and delete a file in `anchor`: permission bits do not tell (root, read-only mounts, /proc)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".capsim-write-test-", dir=anchor)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: cannot write in {anchor} ({_why(exc)})") from None


def check_out_dir(out: str | Path, force: bool = False, names: Iterable[str] | None = None,
                  flag: str = "--out") -> Path:
    """Refuse an --out folder that cannot be used, before any work is done.

    `names`: the files the command writes there (an existing one needs `force`); None: any file
    already in the folder needs `force`."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path}: is a file, expected a folder (choose another {flag} or remove the file)")
    anchor = _nearest_existing(path)
    if not anchor.is_dir():
        raise ConfigError(f"{flag} {path}: lies under {anchor}, which is a file, not a folder")
    _probe(anchor, path, flag)
    folders = [n for n in (names or ()) if (path / n).is_dir() and not (path / n).is_symlink()]
    if folders:  # a file of ours would replace a folder of the user's, whatever --force says
        raise ConfigError(f"{flag} {path}: {', '.join(folders)} is a folder there, where this command writes a file; "
                          "move it or choose another folder")
    if path.is_dir() and not force:
        try:
            present = sorted(p.name for p in path.iterdir())
        except OSError as exc:
            raise ConfigError(f"{flag} {path}: cannot read the folder ({_why(exc)})") from None
        clash = present if names is None else [n for n in names if n in present]
        if clash:
            shown = ", ".join(clash[:4]) + (f" and {len(clash) - 4} more" if len(clash) > 4 else "")
            raise ConfigError(f"{flag} {path}: already holds {shown}; pass --force to overwrite, or choose another "
                              "folder")
    return path


@contextlib.contextmanager
def staged_output(out: str | Path, force: bool = False, names: Iterable[str] | None = None,
                  flag: str = "--out") -> Iterator[Path]:
    """Yield a hidden staging folder; on success move its files into `out` (created if needed),
    on any failure (an error, Ctrl-C) delete it, leaving `out` as it was."""
    final = check_out_dir(out, force, names, flag)
    anchor = _nearest_existing(final.absolute().parent)
    try:
        stage = Path(tempfile.mkdtemp(prefix=f".{final.name or 'out'}.partial-", dir=anchor))
    except OSError as exc:
        raise ConfigError(f"{flag} {final}: cannot write in {anchor} ({_why(exc)})") from None
    try:
        yield stage
        _commit(stage, final, flag)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _commit(stage: Path, final: Path, flag: str) -> None:
    try:
        final.mkdir(parents=True, exist_ok=True)
        items = sorted(stage.iterdir())
        for item in items:  # never a folder of the user's replaced by a file (its contents deleted)
            target = final / item.name
            if target.is_dir() and not target.is_symlink() and not item.is_dir():
                raise ConfigError(f"{flag} {final}: {item.name} is a folder there, where this command writes a "
                                  "file; nothing was moved into place (move it or choose another folder)")
        for item in items:
            target = final / item.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(item, target)
    except OSError as exc:
        raise ConfigError(f"{flag} {final}: cannot move the outputs into place ({_why(exc)})") from None


def check_out_file(out: str | Path, force: bool = False, flag: str = "--out") -> Path:
    """Refuse an output file path that is a folder, lies under a file, is not writable, or exists
    (without `force`)."""
    path = Path(out)
    if path.is_dir():
        raise ConfigError(f"{flag} {path}: is a folder, expected a file name")
    if path.exists() and not force:
        raise ConfigError(f"{flag} {path}: exists; pass --force to overwrite it, or choose another name")
    anchor = _nearest_existing(path.absolute().parent)
    if not anchor.is_dir():
        raise ConfigError(f"{flag} {path}: lies under {anchor}, which is a file, not a folder")
    _probe(anchor, path, flag)
    return path


def write_file_atomically(path: str | Path, text: str, flag: str = "--out") -> Path:
    """Write `text` to a temporary file beside `path`, then rename it over `path` (never half a file)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.partial-", dir=path.parent)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError, UnboundLocalError):
            os.unlink(tmp)
        raise ConfigError(f"{flag} {path}: cannot write ({_why(exc)})") from None
    return path
