"""Files an installation makes once and every process then shares: the Django secret key, the secrets key, the
signing key, the data dir's id, chat templates. Several processes start together on a fresh data dir (`make run`'s
node worker runs its replica starts side by side), so making one must be safe across processes, not just threads.

Standard library only: factory/settings.py uses it before Django is set up."""

import os
import uuid
from collections.abc import Callable
from pathlib import Path


def made_once(path: Path, make: Callable[[], bytes], *, mode: int = 0o600) -> bytes:
    """The file's contents, made by `make()` first when no process has made it yet.

    The contents are written whole beside the file under a name no other process uses, flushed, then hard-linked
    into place: a link never replaces an existing file, so of processes racing exactly one file is installed, it is
    never seen half written, and every process reads that one."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.partial")
    try:
        with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as out:
            out.write(make())
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(partial, path)
        except FileExistsError:
            pass  # another process installed its file first: that one is the installation's
    finally:
        partial.unlink(missing_ok=True)
    return path.read_bytes()
