"""Backup and restore, as an operator runs them: `manage.py backup` on a working instance, `manage.py restore` into
an empty data dir in another process, and the restored instance retrieves the same hits and builds the same
prompts for a probe set; a damaged archive or a data dir in use is refused with nothing changed."""

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from accounts.services import Actor, create_workspace
from assets import backup
from rag_studio import services
from rag_studio.pipeline.ingestion import ingest
from rag_studio.rag import format_context
from rag_studio.search.retrieval import retrieve
from serving.presets import register_presets
from tests.assets import backup_archives
from tests.conftest import ROOT
from tests.rag_studio.conftest import SAMPLE_FILES, sample

PROBES = ["How many days of annual leave do employees get?", "What does error code E204 mean?", "保修期是多久？",
          "battery charging time", "payload of the NW-7 robot"]
PROBE_SCRIPT = """
import json, sys
import django
django.setup()
from rag_studio.models import KnowledgeBase, RagConfig
from rag_studio.rag import format_context
from rag_studio.search.retrieval import retrieve
kb = KnowledgeBase.objects.get(name="Northwind")
config = RagConfig.objects.get(name="Handbook QA")
probes = {}
for query in json.loads(sys.argv[1]):
    hits = retrieve(kb, query).hits
    probes[query] = {"hits": [[h.chunk_id, h.filename, h.fused] for h in hits], "context": format_context(hits)}
print(json.dumps({"probes": probes, "config": config.versions.first().settings,
                  "statuses": sorted(kb.documents.values_list("filename", "status"))}))
"""


def _probe_here(kb) -> dict:
    probes = {}
    for query in PROBES:
        hits = retrieve(kb, query).hits
        probes[query] = {"hits": [[h.chunk_id, h.filename, h.fused] for h in hits], "context": format_context(hits)}
    return probes


def _in_data_dir(data_dir: Path, *argv: str) -> subprocess.CompletedProcess:
    """A platform process on another data dir (its own SQLite database), as on a machine restored from backup."""
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    env.update(FACTORY_DATA_DIR=str(data_dir), DJANGO_SETTINGS_MODULE="factory.settings")
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def instance(transactional_db):
    """A working instance: a knowledge base with the sample documents indexed and a RAG config."""
    register_presets(lambda line: None)
    owner = Actor(user=get_user_model().objects.create_user(username="ops", password="x" * 12))
    workspace = create_workspace(actor=owner, name="Northwind")
    kb = services.create_knowledge_base(actor=owner, workspace=workspace, name="Northwind")
    for outcome in services.upload_documents(actor=owner, kb=kb, uploads=[sample(n) for n in SAMPLE_FILES]):
        assert ingest(outcome.document.pk, "pytest") == "indexed"
    kb.refresh_from_db()  # as ingestion left it: its language recorded
    from serving.models import Deployment, Model

    Deployment.objects.create(workspace=None, name="smollm2-135m-instruct", engine="llamacpp",
                              model=Model.objects.get(name="smollm2-135m-instruct"))
    config = services.save_rag_config(actor=owner, workspace=workspace, name="Handbook QA", knowledge_base=kb,
                                      template="citations", model="smollm2-135m-instruct",
                                      prompt="Answer from {context}: {question}")
    return {"kb": kb, "config": config}


def test_a_restored_instance_retrieves_the_same_hits_and_builds_the_same_prompts(instance, tmp_path):
    archive = tmp_path / "instance.tar"
    call_command("backup", output=archive, verbosity=0)
    manifest = json.loads(tarfile.open(archive).extractfile(backup.MANIFEST).read())
    assert manifest["database"] == {"engine": "sqlite", "member": backup.SQLITE_MEMBER}
    assert manifest["rows"]["rag_studio.Document"] == 3 and manifest["migrations"]["rag_studio"]
    kb = instance["kb"]
    uploads = {f"data/rag/kb-{kb.pk}/uploads/{document.sha256}": document.sha256 for document in kb.documents.all()}
    assert all(manifest["files"][member]["sha256"] == sha256 for member, sha256 in uploads.items())
    assert len(uploads) == 3

    restored_dir = tmp_path / "restored"
    restored = _in_data_dir(restored_dir, "manage.py", "restore", str(archive))
    assert restored.returncode == 0, restored.stderr[-2000:]
    assert "restored" in restored.stdout

    probe = _in_data_dir(restored_dir, "-c", PROBE_SCRIPT, json.dumps(PROBES))
    assert probe.returncode == 0, probe.stderr[-2000:]
    answer = json.loads(probe.stdout.strip().splitlines()[-1])
    assert answer["probes"] == _probe_here(instance["kb"])
    assert answer["config"] == instance["config"].versions.first().settings
    assert answer["statuses"] == sorted([name, "indexed"] for name in SAMPLE_FILES)


@pytest.mark.slow
def test_a_damaged_archive_is_refused_and_the_data_dir_stays_empty(instance, tmp_path):
    archive = tmp_path / "instance.tar"
    call_command("backup", output=archive, verbosity=0)
    data = bytearray(archive.read_bytes())
    offset = data.find(sample("northwind-support-faq.md").stream.read(64))  # inside a stored document
    assert offset > 0
    data[offset] ^= 0x01
    damaged = tmp_path / "damaged.tar"
    damaged.write_bytes(bytes(data))

    restored_dir = tmp_path / "restored"
    refused = _in_data_dir(restored_dir, "manage.py", "restore", str(damaged))

    assert refused.returncode != 0
    assert "does not match its checksum in the manifest (damaged)" in refused.stderr
    assert {path.name for path in restored_dir.rglob("*") if path.is_file()} <= {"secret_key", "db.sqlite3"}


def test_a_data_dir_in_use_is_not_overwritten(tmp_path):
    archive = backup_archives.write(tmp_path / "instance.tar", backup_archives.members())
    in_use = tmp_path / "in-use"
    in_use.mkdir()
    (in_use / "rag").mkdir()
    (in_use / "rag" / "notes.txt").write_text("someone's data")

    refused = _in_data_dir(in_use, "manage.py", "restore", str(archive))

    assert refused.returncode != 0 and "is not empty (rag/notes.txt)" in refused.stderr
    assert (in_use / "rag" / "notes.txt").read_text() == "someone's data"



UPLOAD_MEMBER = f"{backup.DATA_PREFIX}rag/kb-1/uploads/report"
WHOLE = backup_archives.members()
VERSION = backup.FORMAT_VERSION
# What is in the tar, what its manifest lists and its format version; the fault the checks name.
DAMAGED = {
    "a changed byte": ({**WHOLE, UPLOAD_MEMBER: WHOLE[UPLOAD_MEMBER][:-1] + b"\x00"}, WHOLE, VERSION,
                       f"member {UPLOAD_MEMBER} does not match its checksum in the manifest (damaged)"),
    "a member missing": ({backup.SQLITE_MEMBER: backup_archives.DATABASE}, WHOLE, VERSION,
                         f"member {UPLOAD_MEMBER} is missing from the archive"),
    "a member slipped in": ({**WHOLE, "data/extra": b"x"}, WHOLE, VERSION,
                            "member data/extra is not listed in the manifest"),
    "a path out of the data dir": ({**WHOLE, "data/../../etc/cron.d/x": b"x"},
                                   {**WHOLE, "data/../../etc/cron.d/x": b"x"}, VERSION,
                                   "member data/../../etc/cron.d/x is not listed in the manifest"),
    "another format version": (WHOLE, WHOLE, VERSION + 1,
                               f"it has format version {VERSION + 1}; this version reads {VERSION}"),
}


@pytest.mark.parametrize("damage", DAMAGED)
def test_verify_and_unpack_refuse_a_damaged_archive_naming_the_fault(damage, tmp_path):
    contents, listed, version, fault = DAMAGED[damage]
    archive = backup_archives.write(tmp_path / "backup.tar", contents, listed=listed, format_version=version)

    with pytest.raises(backup.RestoreRefused, match=re.escape(fault)):
        backup.verify(archive)
    with pytest.raises(backup.RestoreRefused, match=re.escape(fault)):
        backup.unpack(archive, tmp_path / "staging")


def test_a_copy_cut_short_is_refused(tmp_path):
    archive = backup_archives.write(tmp_path / "backup.tar", WHOLE)
    archive.write_bytes(archive.read_bytes()[:len(backup_archives.DATABASE) + 4096])  # inside the upload's bytes

    with pytest.raises(backup.RestoreRefused, match="it is not a readable tar archive"):
        backup.verify(archive)


def test_unpack_writes_every_member_of_a_good_archive_and_verify_writes_nothing(tmp_path):
    archive = backup_archives.write(tmp_path / "backup.tar", WHOLE)

    assert set(backup.verify(archive)["files"]) == set(WHOLE)
    assert [path.name for path in tmp_path.iterdir()] == ["backup.tar"]
    manifest = backup.unpack(archive, tmp_path / "staging")
    assert {name: (tmp_path / "staging" / name).read_bytes() for name in manifest["files"]} == WHOLE
