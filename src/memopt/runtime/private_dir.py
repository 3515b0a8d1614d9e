"""memopt's runtime folder: where the warm workers' sockets, locks and logs and the GPU leases'
lock files live. Its path is predictable (one per user), so it is trusted only after a check: a
real folder (not a link), owned by this user, closed to everyone else (mode 0700); otherwise
nothing is written and the message says what to do. Files in it are opened without following
links, so a link planted in it cannot redirect a write.

MEMOPT_RUNTIME_DIR replaces the default folder, `<temp dir>/memopt-<uid>`."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from memopt.errors import MemoptError

RUNTIME_ENV = "MEMOPT_RUNTIME_DIR"


def runtime_dir() -> Path:
    """The checked runtime folder, created (mode 0700) if missing."""
    default = Path(tempfile.gettempdir()) / f"memopt-{os.getuid()}"
    return private_dir(Path(os.environ.get(RUNTIME_ENV) or default))


def private_dir(path: Path, env: str = RUNTIME_ENV, repair: bool = False) -> Path:
    """`path` as a folder only this user can use: made with mode 0700 if missing, else checked
    (not a link, a folder, this user's, no access for group or others). With `repair`, for a
    folder inside a checked one (nobody else could have made it), an open mode is closed instead
    of refused: memopt made `gpus/` with mode 755 before it checked its folders. `env` is the
    variable that moves the folder, named in the message."""
    path = Path(path)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as err:
        raise MemoptError(f"cannot create memopt's runtime folder {path}: {err.strerror}") from None
    info = os.lstat(path)
    problem = None
    if stat.S_ISLNK(info.st_mode):
        problem = f"is a symbolic link (to {os.readlink(path)})"
    elif not stat.S_ISDIR(info.st_mode):
        problem = "is not a folder"
    elif info.st_uid != os.getuid():
        problem = f"belongs to user id {info.st_uid}, not to you ({os.getuid()})"
    elif info.st_mode & 0o077 and repair:
        os.chmod(path, 0o700, follow_symlinks=False)
    elif info.st_mode & 0o077:
        problem = f"is open to other users (mode {stat.S_IMODE(info.st_mode):o}; allowed: 700)"
    if problem:
        raise MemoptError(
            f"memopt's runtime folder {path} {problem}: memopt keeps its workers' sockets and logs "
            "and its GPU leases there, and writes nowhere it does not trust. Remove it if it is "
            f"yours (or chmod 700 it), or set {env} to a folder of your own"
        )
    return path


def open_private(path: Path, flags: int) -> int:
    """os.open for a file in a checked folder: never through a link, created with mode 0600."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise MemoptError(
                f"{path} is a symbolic link: memopt does not follow links in its runtime folder; "
                "remove it"
            ) from None
        raise
