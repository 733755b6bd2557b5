"""The embedded store's files (the package docstring draws them): their names, the locks, a generation published
atomically, and the removal of what no generation in force uses."""

import fcntl
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

FORMAT_VERSION = 3
# Earlier releases wrote each generation as a whole copy of the index (format 2): read in place, and converted to
# one segment under LOCK by the first write, or the first reader that finds LOCK free (conversion.py).
WHOLE_COPY_FORMAT = 2
CURRENT = "CURRENT"
LOCK = "LOCK"
MERGE_LOCK = "MERGE"
GENERATION_PREFIX = "gen-"
SEGMENT_PREFIX = "seg-"
STAGING_PREFIX = "tmp-"
MERGE_STAGING_PREFIX = "merging-"
DELETES_PREFIX = "deletes-"
_GENERATION_NAME = re.compile(r"gen-(\d+)")
_SEGMENT_NAME = re.compile(r"seg-(\d+)")


def generation_name(number: int) -> str:
    return f"{GENERATION_PREFIX}{number:06d}"


def segment_name(number: int) -> str:
    return f"{SEGMENT_PREFIX}{number:06d}"


def read_current(root: Path) -> int:
    """The generation number CURRENT names, or 0 when nothing was written yet."""
    try:
        name = (root / CURRENT).read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return 0
    return int(_GENERATION_NAME.fullmatch(name).group(1))


def roots_under(roots, under: Path) -> list[Path]:
    """The index roots (resolved paths) at or below the directory `under`."""
    prefix = under.resolve()
    return [root for root in roots if root == prefix or prefix in root.parents]


def make_manifest(dimension: int, next_segment: int, entries: list[dict]) -> dict:
    return {"format": FORMAT_VERSION, "dimension": dimension, "next_segment": next_segment, "segments": entries}


def read_manifest(directory: Path, dimension: int) -> dict:
    manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    if manifest["format"] not in (FORMAT_VERSION, WHOLE_COPY_FORMAT) or manifest["dimension"] != dimension:
        raise ValueError(f"{directory} holds format {manifest['format']}, dimension {manifest['dimension']}; "
                         f"expected format {FORMAT_VERSION} (or {WHOLE_COPY_FORMAT}), dimension {dimension}.")
    return manifest


@contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


@contextmanager
def lock_if_free(path: Path, wait: bool) -> Iterator[bool]:
    """Yields whether this thread got the lock (without waiting for it unless `wait`)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
        else:
            yield True
    finally:
        os.close(fd)


def publish(root: Path, number: int, manifest: dict) -> None:
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=root))
    staging.chmod(0o755)
    (staging / "manifest.json").write_text(json.dumps(manifest, sort_keys=True), encoding="utf-8")
    fsync_tree(staging)
    os.rename(staging, root / generation_name(number))
    fsync_directory(root)
    pointer = root / f"{CURRENT}.tmp"
    with open(pointer, "w", encoding="ascii") as file:
        file.write(generation_name(number) + "\n")
        file.flush()
        os.fsync(file.fileno())
    os.replace(pointer, root / CURRENT)
    fsync_directory(root)


def remove_stale(root: Path, current: int) -> None:
    """Remove staging dirs, every generation but `current` and the newest one before it, and the segments and
    deletes files neither of those two uses.

    Only called under the lock, so no tmp-* dir belongs to a live writer (a live merge stages in merging-*).
    Generations above `current` were renamed into place by a writer that died before swapping CURRENT.
    """
    numbers = sorted(int(match.group(1)) for entry in root.iterdir()
                     if (match := _GENERATION_NAME.fullmatch(entry.name)))
    older = [number for number in numbers if number < current]
    keep = {current, *older[-1:]}
    in_use: dict[str, set[str]] = {}
    for number in keep:
        manifest_path = root / generation_name(number) / "manifest.json"
        if manifest_path.exists():
            # A whole-copy (format 2) generation uses no segments.
            for entry in json.loads(manifest_path.read_text(encoding="utf-8")).get("segments", ()):
                in_use.setdefault(entry["name"], set()).add(entry["deletes"])
    for entry in root.iterdir():
        match = _GENERATION_NAME.fullmatch(entry.name)
        if entry.name.startswith(STAGING_PREFIX) or (match and int(match.group(1)) not in keep) or \
                (_SEGMENT_NAME.fullmatch(entry.name) and entry.name not in in_use):
            shutil.rmtree(entry, ignore_errors=True)
        elif entry.name in in_use:
            for file in entry.iterdir():
                if file.name.startswith(DELETES_PREFIX) and file.name not in in_use[entry.name]:
                    file.unlink(missing_ok=True)


def save_array(path: Path, array: np.ndarray, fsync: bool = False) -> None:
    """np.save, but writing the data with Python's file.write: numpy's own short write on a full disk raises an
    OSError without errno, which ingestion could not tell from a bug (its "free space" message needs ENOSPC)."""
    array = np.ascontiguousarray(array)
    with open(path, "wb") as file:
        np.lib.format.write_array_header_1_0(file, np.lib.format.header_data_from_array_1_0(array))
        file.write(memoryview(array.reshape(-1)).cast("B") if array.size else b"")
        if fsync:
            file.flush()
            os.fsync(file.fileno())


def fsync_tree(directory: Path) -> None:
    for dirpath, _, filenames in os.walk(directory):
        for filename in filenames:
            _fsync(os.path.join(dirpath, filename), os.O_RDONLY)
        fsync_directory(Path(dirpath))


def fsync_directory(directory: Path) -> None:
    _fsync(directory, os.O_RDONLY | os.O_DIRECTORY)


def _fsync(path: Path | str, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
