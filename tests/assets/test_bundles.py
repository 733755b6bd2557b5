"""The signed bundle envelope: what it writes, and every way a changed or foreign bundle is refused by name."""

import base64
import io
import os
import stat
import struct
import zipfile

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings as django_settings

from assets import signing
from assets.bundles import BundleRejected, read_bundle, write_bundle
from tests.assets.tampering import flip_byte, manifest_of, members, pack, public_key_text, signed

REPORT = b"Quarterly report. " * 200


def _bundle(**files: bytes) -> bytes:
    out = io.BytesIO()
    contents = files or {"documents/report.txt": REPORT, "index/chunks.jsonl": b'{"text": "hello"}\n'}
    write_bundle(out, kind="rag_config", entries=[{"kind": "knowledge_base", "name": "Reports"}],
                 files=contents, sections={"app": {"slug": "reports-bot"}})
    return out.getvalue()


def _refusal(data: bytes) -> str:
    with pytest.raises(BundleRejected) as refused:
        read_bundle(io.BytesIO(data))
    assert refused.value.status == 400
    return refused.value.message


def test_a_bundle_lists_every_file_with_its_checksum_and_reads_back_verified():
    data = _bundle()
    manifest = manifest_of(data)
    assert manifest["format"] == "ai-factory-bundle" and manifest["format_version"] == 1
    assert manifest["kind"] == "rag_config" and manifest["app"] == {"slug": "reports-bot"}
    assert manifest["instance_key"] == signing.instance_public_key()
    assert manifest["files"]["documents/report.txt"]["size"] == len(REPORT)
    assert set(members(data)) == {"manifest.json", "signature", "documents/report.txt", "index/chunks.jsonl"}
    with read_bundle(io.BytesIO(data)) as bundle:
        assert bundle.read("documents/report.txt") == REPORT
        assert bundle.entry("knowledge_base")["name"] == "Reports"
        assert bundle.signer == signing.instance_fingerprint()


def test_the_instance_key_is_made_once_and_kept_private():
    path = django_settings.DATA_DIR / signing.KEY_FILENAME
    first = signing.instance_public_key()
    assert path.exists() and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert signing.instance_public_key() == first and len(base64.b64decode(first)) == 32


def test_a_flipped_byte_in_a_file_is_a_named_checksum_mismatch():
    contents = members(_bundle())
    contents["documents/report.txt"] = flip_byte(contents["documents/report.txt"])
    assert "file documents/report.txt checksum mismatch" in _refusal(pack(contents))


def test_a_byte_flipped_inside_the_zip_itself_names_the_damaged_file():
    out = io.BytesIO()
    write_bundle(out, kind="rag_config", entries=[], files={"documents/report.txt": REPORT})
    data = out.getvalue()
    header = zipfile.ZipFile(io.BytesIO(data)).getinfo("documents/report.txt").header_offset
    name_length, extra_length = struct.unpack("<HH", data[header + 26:header + 30])
    compressed_at = header + 30 + name_length + extra_length
    assert "file documents/report.txt is damaged" in _refusal(flip_byte(data, compressed_at + 10))


def test_an_edited_manifest_no_longer_matches_its_signature():
    contents = members(_bundle())
    contents["manifest.json"] = contents["manifest.json"].replace(b"reports-bot", b"evil-bot")
    assert "the signature does not match the manifest" in _refusal(pack(contents))


def test_missing_and_unlisted_files_are_named():
    contents = members(_bundle())
    del contents["index/chunks.jsonl"]
    assert "file index/chunks.jsonl is missing" in _refusal(pack(contents))
    contents = members(_bundle())
    contents["documents/extra.exe"] = b"MZ"
    assert "file documents/extra.exe is not listed in the manifest" in _refusal(pack(contents))


def test_a_bundle_from_an_untrusted_instance_names_its_key_until_that_key_is_trusted(settings):
    other_instance = Ed25519PrivateKey.generate()
    data = _bundle()
    foreign = signed(members(data), manifest_of(data), other_instance)
    fingerprint = signing.fingerprint(base64.b64decode(public_key_text(other_instance)))
    assert f"signed by an untrusted key {fingerprint}" in _refusal(foreign)

    settings.TRUSTED_BUNDLE_KEYS = [public_key_text(other_instance)]
    with read_bundle(io.BytesIO(foreign)) as bundle:
        assert bundle.signer == fingerprint


def test_unsigned_unreadable_and_escaping_bundles_are_refused():
    assert "it is not a zip file" in _refusal(b"PK\x03\x04 this is not really a zip")
    assert "it is not a zip file" in _refusal(b"%PDF-1.7 hello")
    contents = members(_bundle())
    del contents["signature"]
    assert "it is not signed" in _refusal(pack(contents))
    contents = members(_bundle())
    assert "manifest.json is not valid JSON" in _refusal(pack({**contents, "manifest.json": b"{nope"}))

    manifest = manifest_of(_bundle())
    manifest["files"]["../../etc/cron.d/evil"] = manifest["files"].pop("documents/report.txt")
    escaping = signed({"../../etc/cron.d/evil": REPORT}, manifest, signing.instance_key())
    assert "the path '../../etc/cron.d/evil' is not allowed" in _refusal(escaping)


def test_a_bundle_over_the_size_limit_is_refused_before_it_is_read(settings):
    settings.BUNDLE_MAX_BYTES = 1000
    assert "the limit is" in _refusal(_bundle())
