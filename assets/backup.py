"""Backup and restore of a whole instance: the database, uploads, indexes, models in the data dir and the keys, in
one archive with a manifest and checksums (`manage.py backup`, `manage.py restore`).

The archive is a tar (streamed, so a backup of any size needs no memory or scratch copy of it):

    data/<path>          every file of FACTORY_DATA_DIR worth keeping (see EXCLUDED): uploads, the current
                         generation of each index, registered and fine-tuned models, chat templates, agent
                         checkpoints, secret_key, secrets.key (stored secrets cannot be read without it) and
                         instance_key.pem (bundles signed here)
    database/db.sqlite3  SQLite: a consistent copy made with SQLite's online backup API
    database/data.json   any other database (Postgres): Django's dumpdata with natural keys, read in one
                         REPEATABLE READ transaction, so it is one moment's state; it loads into any database
    parts/<name>/...     what an app keeps outside the data dir and the Django tables, written and read back by
                         that app (register_part): rag_studio's pgvector indexes
    manifest.json        last: format and version, time, the database engine, the migrations applied, each
                         member's sha256 and size, and the row count of every table

Models registered by a path outside the data dir are not copied (FACTORY_MODEL_DIRS defaults to data/models,
which is): keep those files where they are.

The database is read first and the files after it, so a file may be newer than the database but never older: a
restored document marked indexed always has its upload and its index entries (work in progress resumes, as after a
crash). Every SQLite file among the data (agent checkpoints) is copied through the backup API too, never as bytes
that a writer may be changing.

Restore verifies every member against the manifest while unpacking into a staging dir beside the data (`unpack`;
`verify` makes the same checks and writes nothing), and only then moves the files into place: a damaged archive
changes nothing. The appliance's upgrade checks the backup it takes, and rolls back from it, with these two. Restore
refuses a data dir or a database that already holds an instance. After restoring it migrates, so an archive from an
older version comes up to date.
"""

import hashlib
import io
import json
import os
import shutil
import sqlite3
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.apps import apps
from django.conf import settings
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.db.migrations.recorder import MigrationRecorder
from django.utils import timezone

FORMAT = "ai-factory-backup"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SQLITE_MEMBER = "database/db.sqlite3"
JSON_MEMBER = "database/data.json"
DATA_PREFIX = "data/"
_SQLITE_HEADER = b"SQLite format 3\x00"
_BLOCK = 1 << 20
# Paths under the data dir that are not kept: the database itself (copied separately), what is only this
# machine's or this moment's (engine logs, keys and PIDs, metrics, Redis, beat's schedule, scratch dirs), and
# what is rebuilt from the rest (ingestion's intermediate files: a resumed document starts from its upload; GGUF
# bases converted for training).
EXCLUDED = ("db.sqlite3", "db.sqlite3-wal", "db.sqlite3-shm", "test_db.sqlite3", "test_db.sqlite3-wal",
            "test_db.sqlite3-shm", "engines", "prometheus", "redis", "exports", "imports", "backups", "rag/work",
            "enhancement/bases")
EXCLUDED_PREFIXES = ("celerybeat-schedule", ".restore-")
# Made by any process at its start, so present in a data dir that holds nothing yet.
MADE_AT_START = {"secret_key"}
# What dumpdata leaves out, as Django documents for a dump that loads into a fresh database.
DUMP_EXCLUDES = ["contenttypes", "auth.permission", "sessions", "admin.logentry"]


PARTS_PREFIX = "parts/"
RESTORED_PARTS = ".restore-parts"
# name -> (write the part into an empty dir, read it back from such a dir after the database is restored). Apps of
# higher floors register theirs in AppConfig.ready.
_PARTS: dict[str, tuple[Callable[[Path], None], Callable[[Path], None]]] = {}


def register_part(name: str, dump: Callable[[Path], None], load: Callable[[Path], None]) -> None:
    _PARTS[name] = (dump, load)


class RestoreRefused(Exception):
    """The archive is not a good backup, or the target already holds an instance; the message says which."""


@dataclass
class BackupSummary:
    path: Path
    size: int
    files: int
    manifest: dict


def backup(output: Path | None = None) -> BackupSummary:
    """Write a backup archive of this instance to `output` (default: FACTORY_DATA_DIR/backups/backup-<time>.tar)."""
    data_dir = Path(settings.DATA_DIR)
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    output = Path(output) if output else data_dir / "backups" / f"backup-{stamp}.tar"
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(f".{output.name}.partial")
    listed: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="backup-") as scratch, tarfile.open(partial, "w") as archive:
        database_member, database_file = _database_snapshot(Path(scratch))
        listed[database_member] = _add(archive, database_member, database_file)
        for path in data_files(data_dir):
            member = DATA_PREFIX + path.relative_to(data_dir).as_posix()
            if _is_sqlite(path):
                copy = Path(scratch) / "sqlite-copy"
                _sqlite_copy(path, copy)
                listed[member] = _add(archive, member, copy)
                copy.unlink()
            else:
                try:
                    listed[member] = _add(archive, member, path)
                except FileNotFoundError:
                    continue  # removed since it was listed (a stale index generation, a deleted document)
        for name, (dump, _) in sorted(_PARTS.items()):
            part = Path(scratch) / "parts" / name
            part.mkdir(parents=True)
            dump(part)
            for path in sorted(path for path in part.rglob("*") if path.is_file()):
                member = f"{PARTS_PREFIX}{name}/{path.relative_to(part).as_posix()}"
                listed[member] = _add(archive, member, path)
        manifest = _manifest(listed, database_member)
        encoded = json.dumps(manifest, indent=1, sort_keys=True).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size, info.mtime = len(encoded), int(timezone.now().timestamp())
        archive.addfile(info, io.BytesIO(encoded))
    os.replace(partial, output)
    return BackupSummary(path=output, size=output.stat().st_size, files=len(listed), manifest=manifest)


def _database_snapshot(scratch: Path) -> tuple[str, Path]:
    if connection.vendor == "sqlite":
        copy = scratch / "db.sqlite3"
        _sqlite_copy(Path(connection.settings_dict["NAME"]), copy)
        return SQLITE_MEMBER, copy
    dump = scratch / "data.json"
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        call_command("dumpdata", natural_foreign=True, natural_primary=True, exclude=DUMP_EXCLUDES,
                     output=str(dump), verbosity=0)
    return JSON_MEMBER, dump


def _sqlite_copy(source: Path, target: Path) -> None:
    """A consistent copy of a live SQLite database (WAL included), taken between its writers' transactions."""
    reader, copy = sqlite3.connect(source, timeout=30), sqlite3.connect(target)
    try:
        reader.backup(copy)
    finally:
        copy.close()
        reader.close()


def _is_sqlite(path: Path) -> bool:
    try:
        with path.open("rb") as file:
            return file.read(len(_SQLITE_HEADER)) == _SQLITE_HEADER
    except OSError:
        return False


def data_files(data_dir: Path):
    """The data dir's files to keep, in a stable order; of each index, only what the generation CURRENT names."""
    for directory, subdirs, filenames in os.walk(data_dir):
        here = Path(directory)
        relative = here.relative_to(data_dir).as_posix()
        subdirs[:] = sorted(name for name in subdirs if not _excluded(f"{relative}/{name}".lstrip("./")))
        if (here / "CURRENT").is_file() and any(name.startswith("gen-") for name in subdirs):
            yield from _index_files(here)
            subdirs[:] = []
            continue
        for name in sorted(filenames):
            if not _excluded(f"{relative}/{name}".lstrip("./")) and not name.endswith((".partial", "-wal", "-shm")):
                yield here / name


def _index_files(root: Path):
    """An index directory's files in force (rag_studio/search/embedded/'s layout): CURRENT, the generation it
    names and, where that generation's manifest lists segments, each segment's files with the one deletes file the
    generation uses (segments are shared by generations and never change, so an older deletes file is not needed)."""
    current = (root / "CURRENT").read_text().strip()
    generation = root / current
    yield root / "CURRENT"
    yield from sorted(path for path in generation.iterdir() if path.is_file())
    manifest = json.loads((generation / "manifest.json").read_text(encoding="utf-8"))
    for entry in manifest.get("segments", ()):
        segment = root / entry["name"]
        yield from sorted(path for path in segment.iterdir()
                          if path.is_file() and (not path.name.startswith("deletes-") or path.name == entry["deletes"]))


def _excluded(relative: str) -> bool:
    return relative in EXCLUDED or relative.split("/")[-1].startswith(EXCLUDED_PREFIXES)


def kept(relative: str) -> bool:
    """True when a backup keeps this file: neither it nor a dir it lies in is excluded."""
    parts = relative.split("/")
    return not any(_excluded("/".join(parts[:end])) for end in range(1, len(parts) + 1))


class _Hashing(io.RawIOBase):
    """A file read through a sha256."""

    def __init__(self, stream):
        self._stream, self.digest = stream, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._stream.read(len(buffer))
        self.digest.update(data)
        buffer[:len(data)] = data
        return len(data)


def _add(archive: tarfile.TarFile, member: str, path: Path) -> dict:
    with path.open("rb") as stream:
        info = archive.gettarinfo(fileobj=stream, arcname=member)
        hashing = _Hashing(stream)
        archive.addfile(info, hashing)
    return {"sha256": hashing.digest.hexdigest(), "size": info.size}


def _manifest(listed: dict[str, dict], database_member: str) -> dict:
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "created_at": timezone.now().isoformat(),
        "database": {"engine": connection.vendor, "member": database_member},
        "migrations": _applied_migrations(),
        "files": listed,
        "rows": {model._meta.label: model.objects.count() for model in apps.get_models()},
    }


def _applied_migrations() -> dict[str, str]:
    latest = {}
    for app, name in MigrationRecorder(connection).applied_migrations():
        if app not in latest or name > latest[app]:
            latest[app] = name
    return dict(sorted(latest.items()))


# ---- restore ----


def restore(archive_path: Path) -> dict:
    """Restore an archive into this instance's empty data dir and database; returns its manifest."""
    data_dir = Path(settings.DATA_DIR)
    _refuse_unless_empty(data_dir)
    staging = Path(tempfile.mkdtemp(prefix=".restore-", dir=data_dir))
    try:
        manifest = unpack(archive_path, staging)
        connections.close_all()
        _place_database(manifest, staging)
        for member in manifest["files"]:
            if member.startswith(DATA_PREFIX):
                target = data_dir / member[len(DATA_PREFIX):]
            elif member.startswith(PARTS_PREFIX):
                target = data_dir / RESTORED_PARTS / member[len(PARTS_PREFIX):]
            else:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / member, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    call_command("migrate", verbosity=0, interactive=False)
    if manifest["database"]["member"] == JSON_MEMBER:
        call_command("loaddata", str(data_dir / ".restore-data.json"), verbosity=0)
        (data_dir / ".restore-data.json").unlink()
    try:
        for name, (_, load) in sorted(_PARTS.items()):
            if (data_dir / RESTORED_PARTS / name).is_dir():
                load(data_dir / RESTORED_PARTS / name)
    finally:
        shutil.rmtree(data_dir / RESTORED_PARTS, ignore_errors=True)
    return manifest


def _refuse_unless_empty(data_dir: Path) -> None:
    if connection.introspection.table_names():
        raise RestoreRefused(f"the database ({connection.vendor}: {connection.settings_dict['NAME']}) already has "
                             f"tables; restore into an empty one")
    present = sorted(relative for path in data_dir.rglob("*") if path.is_file()
                     and kept(relative := path.relative_to(data_dir).as_posix()) and relative not in MADE_AT_START)
    if present:
        shown = ", ".join(present[:3]) + (f" and {len(present) - 3} more" if len(present) > 3 else "")
        raise RestoreRefused(f"the data dir {data_dir} is not empty ({shown}); restore into an empty one")


def verify(archive_path: Path) -> dict:
    """Check an archive as restore does, writing nothing: a manifest of this format and version, every member listed
    in it (a plain file at a safe path) with its sha256 and size, and none of it missing. Returns the manifest;
    RestoreRefused names the first fault."""
    return _checked(archive_path, staging=None)


def unpack(archive_path: Path, staging: Path) -> dict:
    """verify's checks while writing every member under `staging`, each file on disk (fsynced) before the next is
    read: a caller moves them into place only once this returned, so a damaged archive changes nothing."""
    return _checked(archive_path, staging)


def _checked(archive_path: Path, staging: Path | None) -> dict:
    try:
        with tarfile.open(archive_path, "r") as archive:
            manifest = _read_manifest(archive)
            listed, seen = manifest["files"], set()
            for member in archive:
                if member.name == MANIFEST:
                    continue
                expected = listed.get(member.name)
                if expected is None or not member.isfile() or not _safe(member.name):
                    raise RestoreRefused(f"member {member.name} is not listed in the manifest")
                with archive.extractfile(member) as source:
                    found = _digest(source) if staging is None else _write_member(source, staging / member.name)
                if found != (expected["sha256"], expected["size"]):
                    raise RestoreRefused(f"member {member.name} does not match its checksum in the manifest (damaged)")
                seen.add(member.name)
    except tarfile.TarError as exc:
        raise RestoreRefused(f"it is not a readable tar archive ({exc})")
    missing = sorted(set(listed) - seen)
    if missing:
        raise RestoreRefused(f"member {missing[0]} is missing from the archive")
    return manifest


def _digest(source, out=None) -> tuple[str, int]:
    """sha256 and size of what `source` holds, copied to `out` on the way where one is given."""
    digest, size = hashlib.sha256(), 0
    while block := source.read(_BLOCK):
        digest.update(block)
        size += len(block)
        if out:
            out.write(block)
    return digest.hexdigest(), size


def _write_member(source, target: Path) -> tuple[str, int]:
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("wb") as out:
        found = _digest(source, out)
        out.flush()
        os.fsync(out.fileno())
    return found


def _read_manifest(archive: tarfile.TarFile) -> dict:
    try:
        member = archive.getmember(MANIFEST)
        manifest = json.loads(archive.extractfile(member).read())
    except (KeyError, ValueError, AttributeError):
        raise RestoreRefused("it has no readable manifest.json; it is not an AI Factory backup")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise RestoreRefused("it is not an AI Factory backup")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise RestoreRefused(f"it has format version {manifest.get('format_version')}; this version reads "
                             f"{FORMAT_VERSION}")
    return manifest


def _safe(name: str) -> bool:
    parts = name.split("/")
    return not name.startswith("/") and ".." not in parts and "" not in parts and "\\" not in name


def _place_database(manifest: dict, staging: Path) -> None:
    member = manifest["database"]["member"]
    if member == SQLITE_MEMBER:
        if connection.vendor != "sqlite":
            raise RestoreRefused(f"the archive holds a SQLite database, and this instance uses {connection.vendor}; "
                                 f"restore it with SQLite (no DATABASE_URL), then back it up again to move it")
        os.replace(staging / member, Path(connection.settings_dict["NAME"]))
    else:
        os.replace(staging / member, Path(settings.DATA_DIR) / ".restore-data.json")
