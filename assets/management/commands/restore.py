from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from assets import backup


class Command(BaseCommand):
    help = ("Restore an archive written by `manage.py backup` into this instance's data dir and database, which "
            "must be empty. Every file is checked against the manifest before anything is put in place.")
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("archive", type=Path)

    def handle(self, *args, archive, **options):
        if not archive.is_file():
            raise CommandError(f"{archive} does not exist.")
        try:
            manifest = backup.restore(archive)
        except backup.RestoreRefused as exc:
            raise CommandError(f"The restore was refused: {exc}.")
        files = sum(1 for member in manifest["files"] if member.startswith(backup.DATA_PREFIX))
        self.stdout.write(f"==> restored {files} files and the database ({manifest['database']['engine']}) from "
                          f"the backup of {manifest['created_at']}")
