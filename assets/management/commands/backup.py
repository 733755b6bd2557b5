from pathlib import Path

from django.core.management.base import BaseCommand

from assets import backup


class Command(BaseCommand):
    help = ("Write one archive of this instance: the database, uploads, indexes, models and keys in the data dir, "
            "with a manifest of checksums (see assets/backup.py). Restore it with `manage.py restore`.")

    def add_arguments(self, parser):
        parser.add_argument("--output", type=Path, help="the archive to write (default: data dir/backups/)")

    def handle(self, *args, output=None, **options):
        summary = backup.backup(output)
        self.stdout.write(f"==> wrote {summary.path} ({summary.size / 2**20:.1f} MiB, {summary.files} files, "
                          f"database: {summary.manifest['database']['engine']})")
