"""The upgrade checks the backup it takes, and rolls back from it, with assets.backup's own checks (verify and
unpack, as `manage.py restore` does): a backup that would not restore is found out before anything is changed."""

from pathlib import Path

import pytest

from appliance import ai_factory
from assets import backup
from tests.assets import backup_archives

UPLOAD = "rag/kb-1/uploads/report"


def _data_dir(prefix: Path) -> Path:
    """A data dir as the new release left it: the database it migrated, an upload of before, one of its own."""
    data = prefix / "data"
    (data / "rag" / "kb-1" / "uploads").mkdir(parents=True)
    (data / "db.sqlite3").write_bytes(b"the database the new release migrated")
    (data / UPLOAD).write_bytes(b"an upload")
    (data / "rag" / "kb-1" / "uploads" / "made-since").write_bytes(b"an upload to the new release")
    return data


def _files(data: Path) -> dict[str, bytes]:
    return {path.relative_to(data).as_posix(): path.read_bytes() for path in sorted(data.rglob("*")) if path.is_file()}


def test_the_backup_step_refuses_a_backup_whose_file_does_not_match_its_checksum(tmp_path):
    """The running release's `manage.py backup` (here a stand-in that writes a damaged archive) is checked member by
    member, not by its manifest's format alone."""
    members = backup_archives.members()
    damaged = backup_archives.write(tmp_path / "damaged.tar", {**members, backup.DATA_PREFIX + UPLOAD: b"rot"},
                                    listed=members)
    release = tmp_path / "releases" / "old"
    (release / ".venv" / "bin").mkdir(parents=True)
    stand_in = release / ".venv" / "bin" / "python"
    stand_in.write_text(f'#!/bin/sh\n# manage.py backup --output PATH\ncp {damaged} "$4"\n')
    stand_in.chmod(0o755)
    appliance = ai_factory.Appliance(tmp_path, "none")
    _data_dir(tmp_path)
    journal = {"from": str(release), "to": str(tmp_path / "releases" / "new"), "backup": str(tmp_path / "backup.tar"),
               "backup_done": False}

    with pytest.raises(ai_factory.StepFailed, match=f"does not check out: member {backup.DATA_PREFIX}{UPLOAD} does "
                                                    f"not match its checksum"):
        appliance.run_step("backup", journal)
    assert journal["backup_done"] is False


def test_a_rollback_from_a_backup_missing_a_file_is_refused_with_nothing_changed(tmp_path):
    data = _data_dir(tmp_path)
    before = _files(data)
    cut_short = backup_archives.write(tmp_path / "pre-upgrade.tar", {backup.SQLITE_MEMBER: backup_archives.DATABASE},
                                      listed=backup_archives.members())

    with pytest.raises(ai_factory.StepFailed, match=f"cannot be restored, and nothing was changed: member "
                                                    f"{backup.DATA_PREFIX}{UPLOAD} is missing from the archive"):
        ai_factory.restore_in_place(cut_short, data, since=0)
    assert _files(data) == before


def test_a_rollback_puts_back_what_the_backup_holds_and_removes_what_came_since(tmp_path):
    data = _data_dir(tmp_path)
    archive = backup_archives.write(tmp_path / "pre-upgrade.tar", backup_archives.members())

    ai_factory.restore_in_place(archive, data, since=0)

    assert _files(data) == {"db.sqlite3": backup_archives.DATABASE, UPLOAD: backup_archives.UPLOAD}
