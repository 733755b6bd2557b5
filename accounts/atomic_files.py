"""Files written whole or not at all, for processes that may crash or race each other.

Files an installation makes once and every process then shares (the Django secret key, the secrets key, the signing
key, the data dir's id, chat templates): several processes start together on a fresh data dir (`make run`'s node
worker runs its replica starts side by side), so making one must be safe across processes, not just threads.
State a worker rewrites (a document's stage output, a training run's status and results): a worker killed
mid-write must leave the previous file whole.

Standard library only: factory/settings.py and the training process use it without Django."""

import json
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


def write_json_atomic(path: Path, value, *, durable: bool = True) -> None:
    """`value` as JSON at `path`, whole or not at all: written beside under this process's own name, then renamed
    over it. `durable` waits for the disk too (a progress report rewritten every second need not: a crash loses at
    most its latest version, never a whole file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    with partial.open("w", encoding="utf-8") as out:
        json.dump(value, out, ensure_ascii=False)
        if durable:
            out.flush()
            os.fsync(out.fileno())
    os.replace(partial, path)
