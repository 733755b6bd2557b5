"""Signed bundles: how assets travel between workspaces and instances.

A bundle is a zip:

    manifest.json   {"format": "ai-factory-bundle", "format_version": 1, "kind": "rag_config" | "app" | ...,
                     "created_at": ISO 8601, "instance_key": base64 Ed25519 public key of the signer,
                     "entries": [{"kind", "name", "checksum", ...}, ...],   the assets it carries
                     "files": {path: {"sha256", "size"}, ...},              every other file in the zip
                     ...sections the exporting studio adds (e.g. "app")}
    signature       base64 of the signer's Ed25519 signature over the exact bytes of manifest.json
    <files>         at the paths the manifest lists

`read_bundle` believes nothing before the signature checks out against a trusted key, and then nothing it has
not hashed: every listed file must be there with its size and sha256, and nothing else may be. Entries are only
ever opened by their listed names, never extracted by the names the zip gives, so a crafted path cannot write
anywhere.

Studios on upper floors register an importer for the bundle kinds they write (`bundle_importer`), so the Assets
page and API import any bundle without this floor importing them.
"""

import base64
import binascii
import hashlib
import json
import posixpath
import re
import zipfile
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from django.conf import settings
from django.utils import timezone

from accounts.errors import ValidationFailed
from accounts.models import Role, Workspace
from accounts.registry import Registry
from accounts.services import Actor, require_role
from assets import signing
from assets.models import Asset

FORMAT = "ai-factory-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SIGNATURE = "signature"
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
MAX_SIGNATURE_BYTES = 1024
MAX_FILES = 100_000
_SHA256 = re.compile(r"[0-9a-f]{64}")
_COPY_BLOCK = 1 << 20


class BundleRejected(ValidationFailed):
    """The bundle cannot be imported; the message names why."""

    code = "bundle_rejected"

    def __init__(self, reason: str):
        super().__init__(f"The bundle was refused: {reason}.", fields={"bundle": [reason]})
        self.reason = reason


def _safe_path(path) -> bool:
    """A relative POSIX path that stays inside the bundle: no absolute paths, '..', backslashes or control
    characters."""
    return (isinstance(path, str) and 0 < len(path) <= 512 and not path.startswith("/") and "\\" not in path
            and not any(ord(char) < 32 for char in path) and posixpath.normpath(path) == path
            and all(part not in ("", ".", "..") for part in path.split("/"))
            and path not in (MANIFEST, SIGNATURE))


def write_bundle(destination, *, kind: str, entries: list[dict], files: dict[str, Path | bytes],
                 sections: dict | None = None) -> dict:
    """Write a signed bundle to `destination` (a path or a binary file) and return its manifest. `files` maps each
    bundle path to a file on disk or to bytes; `sections` are extra top-level manifest keys."""
    manifest = {**(sections or {}), "format": FORMAT, "format_version": FORMAT_VERSION, "kind": kind,
                "created_at": timezone.now().isoformat(), "instance_key": signing.instance_public_key(),
                "entries": entries}
    listed = {}
    with zipfile.ZipFile(destination, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path, source in files.items():
            if not _safe_path(path):
                raise ValueError(f"{path!r} is not a valid bundle path.")
            listed[path] = _write_member(archive, path, source)
        manifest["files"] = listed
        manifest_bytes = json.dumps(manifest, ensure_ascii=False, indent=1, sort_keys=True).encode()
        archive.writestr(MANIFEST, manifest_bytes)
        archive.writestr(SIGNATURE, base64.b64encode(signing.sign(manifest_bytes)))
    return manifest


def _write_member(archive: zipfile.ZipFile, path: str, source: Path | bytes) -> dict:
    digest, size = hashlib.sha256(), 0
    with archive.open(path, "w", force_zip64=True) as member:
        for block in _blocks(source):
            digest.update(block)
            size += len(block)
            member.write(block)
    return {"sha256": digest.hexdigest(), "size": size}


def _blocks(source: Path | bytes):
    if isinstance(source, bytes):
        yield source
        return
    with source.open("rb") as stream:
        while block := stream.read(_COPY_BLOCK):
            yield block


class Bundle:
    """A verified bundle, open for reading. Use it as a context manager."""

    def __init__(self, archive: zipfile.ZipFile, manifest: dict, signer: str):
        self._archive = archive
        self.manifest = manifest
        self.signer = signer  # the fingerprint of the key that signed it

    @property
    def kind(self) -> str:
        return self.manifest.get("kind", "")

    def entry(self, kind: str) -> dict:
        """The bundle's entry of that asset kind."""
        for entry in self.manifest.get("entries") or []:
            if isinstance(entry, dict) and entry.get("kind") == kind:
                return entry
        raise BundleRejected(f"it holds no {kind.replace('_', ' ')}")

    def size(self, path: str) -> int:
        return self._listed(path)["size"]

    def open(self, path: str) -> IO[bytes]:
        self._listed(path)
        return self._archive.open(path)

    def read(self, path: str) -> bytes:
        with self.open(path) as member:
            return member.read()

    def copy_to(self, path: str, target: Path) -> None:
        """Write the file to `target`, hashing it again on the way: what lands on disk is what was verified."""
        digest = hashlib.sha256()
        with self.open(path) as member, target.open("wb") as out:
            while block := member.read(_COPY_BLOCK):
                digest.update(block)
                out.write(block)
        if digest.hexdigest() != self._listed(path)["sha256"]:
            raise BundleRejected(f"file {path} changed while it was imported")

    def _listed(self, path: str) -> dict:
        listed = self.manifest["files"].get(path)
        if listed is None:
            raise BundleRejected(f"the manifest lists no file {path}")
        return listed

    def close(self) -> None:
        self._archive.close()

    def __enter__(self) -> "Bundle":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def read_bundle(file) -> Bundle:
    """Open and verify a bundle (a path or a seekable binary file). Raises BundleRejected naming the first
    problem: not a zip, no or unreadable manifest, no signature, an untrusted signer, a signature that does not
    match, a file missing, unlisted, of another size or checksum, an unsafe path, or too much data."""
    try:
        archive = zipfile.ZipFile(file)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError):
        raise BundleRejected("it is not a zip file")
    try:
        manifest, signer = _verified(archive)
    except BaseException:
        archive.close()
        raise
    return Bundle(archive, manifest, signer)


def _verified(archive: zipfile.ZipFile) -> tuple[dict, str]:
    members = archive.infolist()
    if len(members) > MAX_FILES + 2:
        raise BundleRejected(f"it holds {len(members)} files; the limit is {MAX_FILES}")
    repeated = [name for name, count in Counter(m.filename for m in members).items() if count > 1]
    if repeated:
        raise BundleRejected(f"it holds more than one entry named {repeated[0]}")
    by_name = {member.filename: member for member in members}
    manifest_bytes = _small_member(archive, by_name, MANIFEST, MAX_MANIFEST_BYTES, "it has no manifest.json")
    signature_text = _small_member(archive, by_name, SIGNATURE, MAX_SIGNATURE_BYTES,
                                   "it is not signed (there is no signature file)")
    try:
        manifest = json.loads(manifest_bytes)
    except ValueError:
        raise BundleRejected("manifest.json is not valid JSON")
    if not isinstance(manifest, dict):
        raise BundleRejected("manifest.json is not a JSON object")
    signer = _check_signature(manifest, manifest_bytes, signature_text)
    if manifest.get("format") != FORMAT:
        raise BundleRejected("it is not an AI Factory bundle")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise BundleRejected(f"it has format version {manifest.get('format_version')}; this instance reads "
                             f"version {FORMAT_VERSION}")
    listed = _listed_files(manifest)
    unlisted = sorted(set(by_name) - set(listed) - {MANIFEST, SIGNATURE})
    if unlisted:
        raise BundleRejected(f"file {unlisted[0]} is not listed in the manifest")
    for path, expected in listed.items():
        member = by_name.get(path)
        if member is None:
            raise BundleRejected(f"file {path} is missing")
        if member.file_size != expected["size"]:
            raise BundleRejected(f"file {path} is {member.file_size} bytes; the manifest says {expected['size']}")
        actual = _member_sha256(archive, member)
        if actual != expected["sha256"]:
            raise BundleRejected(f"file {path} checksum mismatch (the manifest says {expected['sha256'][:12]}…, "
                                 f"the file hashes to {actual[:12]}…)")
    return manifest, signer


def _small_member(archive: zipfile.ZipFile, by_name: dict, name: str, limit: int, missing: str) -> bytes:
    member = by_name.get(name)
    if member is None:
        raise BundleRejected(missing)
    if member.file_size > limit:
        raise BundleRejected(f"{name} is {member.file_size} bytes; the limit is {limit}")
    try:
        return archive.read(member)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError) as exc:
        raise BundleRejected(f"{name} is damaged ({exc})")


def _check_signature(manifest: dict, manifest_bytes: bytes, signature_text: bytes) -> str:
    raw_key = signing.decode_public_key(manifest.get("instance_key"))
    if raw_key is None:
        raise BundleRejected("the manifest names no valid signing key")
    signer = signing.fingerprint(raw_key)
    public_key = signing.trusted_key(raw_key)
    if public_key is None:
        raise BundleRejected(f"it is signed by an untrusted key {signer}; to accept bundles from that instance, "
                             f"add its public key to FACTORY_TRUSTED_BUNDLE_KEYS")
    try:
        signature = base64.b64decode(signature_text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise BundleRejected("the signature file is not base64")
    if not signing.signature_matches(public_key, signature, manifest_bytes):
        raise BundleRejected("the signature does not match the manifest (it was changed after signing)")
    return signer


def _listed_files(manifest: dict) -> dict[str, dict]:
    listed = manifest.get("files")
    if not isinstance(listed, dict) or len(listed) > MAX_FILES:
        raise BundleRejected("the manifest's file list is missing or malformed")
    for path, spec in listed.items():
        if not _safe_path(path):
            raise BundleRejected(f"the path {path!r} is not allowed (absolute, or leading out of the bundle)")
        if not (isinstance(spec, dict) and isinstance(spec.get("sha256"), str) and _SHA256.fullmatch(spec["sha256"])
                and type(spec.get("size")) is int and spec["size"] >= 0):
            raise BundleRejected(f"the manifest's entry for {path} has no valid sha256 and size")
    total = sum(spec["size"] for spec in listed.values())
    if total > settings.BUNDLE_MAX_BYTES:
        raise BundleRejected(f"its files add up to {total / 2**20:.0f} MiB; the limit is "
                             f"{settings.BUNDLE_MAX_BYTES / 2**20:.0f} MiB (FACTORY_BUNDLE_MAX_BYTES)")
    return listed


def _member_sha256(archive: zipfile.ZipFile, member: zipfile.ZipInfo) -> str:
    """Hash the member as it decompresses; a zip never yields more than the size it declares, which was checked
    against the manifest's."""
    digest = hashlib.sha256()
    try:
        with archive.open(member) as stream:
            while block := stream.read(_COPY_BLOCK):
                digest.update(block)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError) as exc:
        raise BundleRejected(f"file {member.filename} is damaged ({exc})")
    return digest.hexdigest()


@dataclass
class ImportOutcome:
    """What an import made: the new assets, and anything the user should know (e.g. documents re-ingested)."""

    assets: list[Asset]
    notes: list[str] = field(default_factory=list)


Importer = Callable[..., ImportOutcome]  # (*, actor, workspace, bundle) -> ImportOutcome
_importers: Registry[Importer] = Registry()


def bundle_importer(kind: str):
    """Register the importer of one bundle kind; it gets a verified Bundle and imports it all or nothing."""
    return _importers.registering(kind)


def import_bundle(*, actor: Actor, workspace: Workspace, file) -> ImportOutcome:
    """Verify the bundle, then hand it to the importer of its kind."""
    require_role(actor=actor, workspace=workspace, role=Role.DEVELOPER)
    with read_bundle(file) as bundle:
        importer = _importers.get(bundle.kind)
        if importer is None:
            raise BundleRejected(f"this instance cannot import bundles of kind {bundle.kind!r}")
        return importer(actor=actor, workspace=workspace, bundle=bundle)

