"""Backup archives made by hand, whole or as a damaged disk, a cut-short copy or a crafted file leaves them: the
members that are in the tar, and a manifest that lists what should be."""

import hashlib
import io
import json
import tarfile
from pathlib import Path

from assets import backup

DATABASE = b"SQLite format 3\x00" + bytes(4096)
UPLOAD = bytes(range(256)) * 256  # 64 KiB: a cut in the middle of the tar falls inside its bytes


def members() -> dict[str, bytes]:
    return {backup.SQLITE_MEMBER: DATABASE, f"{backup.DATA_PREFIX}rag/kb-1/uploads/report": UPLOAD}


def write(path: Path, contents: dict[str, bytes], *, listed: dict[str, bytes] | None = None,
          format_version: int = backup.FORMAT_VERSION) -> Path:
    """A tar of `contents` and a manifest listing `listed` (by default the same) with their checksums."""
    listed = contents if listed is None else listed
    manifest = {"format": backup.FORMAT, "format_version": format_version,
                "database": {"engine": "sqlite", "member": backup.SQLITE_MEMBER},
                "files": {name: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
                          for name, data in listed.items()}}
    with tarfile.open(path, "w") as tar:
        for name, data in {**contents, backup.MANIFEST: json.dumps(manifest).encode()}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path
