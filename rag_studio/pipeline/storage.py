"""Uploaded files on disk: each is streamed to a staging file beside the uploads while it is hashed, then kept under
its sha256 (`files.upload_path`) or discarded. Whether a file is accepted, and the Document it becomes, are the
services' business (`services.upload_documents`)."""

import errno
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from accounts.errors import ServiceUnavailable
from rag_studio import files

# The errors that mean the disk is full, in the upload and in every ingestion stage.
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class StorageFull(ServiceUnavailable):
    """The data directory has no room left: nothing the user sent is wrong, and retrying later (after an operator
    frees space) works."""

    status = 507
    code = "storage_full"


class UploadedFile:
    """What an upload needs from Django's UploadedFile (or a file the tests or benchmarks open themselves)."""

    def __init__(self, name: str, stream, size: int):
        self.name, self.stream, self.size = name, stream, size

    def chunks(self, chunk_size: int = 1 << 20):
        while block := self.stream.read(chunk_size):
            yield block


@dataclass
class StagedUpload:
    """An upload written to its staging file: its hash and full size are known, and `keep` or `discard` ends it."""

    kb_id: int
    path: Path
    sha256: str
    size: int
    too_large: bool  # the bytes past the limit were hashed and counted, never written

    def keep(self) -> None:
        os.replace(self.path, files.upload_path(self.kb_id, self.sha256))

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


def stage_upload(kb_id: int, upload, *, max_bytes: int) -> StagedUpload:
    """Stream `upload` to a staging file, hashing it; bytes past `max_bytes` are hashed but not written. A disk
    that fills up mid-file keeps no half of it (the OSError is raised; see DISK_FULL)."""
    staging = files.uploads_dir(kb_id) / f".incoming-{os.getpid()}-{id(upload)}"
    staging.parent.mkdir(parents=True, exist_ok=True)
    digest, size, too_large = hashlib.sha256(), 0, False
    try:
        with staging.open("wb") as out:
            for block in upload.chunks():
                size += len(block)
                digest.update(block)
                if size > max_bytes:
                    too_large = True
                    continue
                out.write(block)
            out.flush()
            os.fsync(out.fileno())
    except OSError:
        staging.unlink(missing_ok=True)
        raise
    return StagedUpload(kb_id=kb_id, path=staging, sha256=digest.hexdigest(), size=size, too_large=too_large)


def is_stored(kb_id: int, sha256: str) -> bool:
    return files.upload_path(kb_id, sha256).exists()


def remove_stored(kb_id: int, sha256: str) -> None:
    files.upload_path(kb_id, sha256).unlink(missing_ok=True)
