"""Where a knowledge base's files live under FACTORY_DATA_DIR: uploads by content hash, each document's
intermediate stage output, and the indexes."""

import json
import uuid
from pathlib import Path

from django.conf import settings

from accounts.atomic_files import made_once


def kb_dir(kb_id: int) -> Path:
    return settings.DATA_DIR / "rag" / f"kb-{kb_id}"


def uploads_dir(kb_id: int) -> Path:
    # Ingestion workers on other nodes read uploads from storage every node mounts (FACTORY_RAG_UPLOADS_DIR).
    if settings.RAG_UPLOADS_DIR:
        return settings.RAG_UPLOADS_DIR / f"kb-{kb_id}"
    return kb_dir(kb_id) / "uploads"


def upload_path(kb_id: int, sha256: str) -> Path:
    return uploads_dir(kb_id) / sha256


def indexes_dir(kb_id: int) -> Path:
    return kb_dir(kb_id) / "indexes"


def index_dir(kb_id: int, key: str) -> Path:
    return indexes_dir(kb_id) / key


def index_home() -> dict:
    """Where this process keeps embedded indexes: its node's name and its data dir's id (made once, kept by backups),
    so that a worker on another node with a data dir of its own never writes a second, partial copy of an index."""
    data_dir_id = made_once(settings.DATA_DIR / "rag" / "data-dir-id", lambda: uuid.uuid4().hex.encode())
    return {"node": settings.NODE_NAME, "data_dir": data_dir_id.decode("ascii").strip()}


def work_dir(document_id: int) -> Path:
    return settings.DATA_DIR / "rag" / "work" / f"doc-{document_id}"


def read_json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))
