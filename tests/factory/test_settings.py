import os
import subprocess
import sys

from django.conf import settings
from django.db import connection

from tests.conftest import ROOT


def _import_settings(**env):
    return subprocess.run([sys.executable, "-c", "import factory.settings"], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, **env})


def test_production_refuses_the_default_secret_key():
    refused = _import_settings(FACTORY_ENV="prod", FACTORY_SECRET_KEY="")
    assert refused.returncode != 0
    assert "FACTORY_SECRET_KEY must be set" in refused.stderr

    started = _import_settings(FACTORY_ENV="prod", FACTORY_SECRET_KEY="a-long-private-value")
    assert started.returncode == 0, started.stderr


def test_postgres_comes_from_database_url():
    probe = "from django.conf import settings; print(settings.DATABASES['default']['ENGINE'], " \
            "settings.DATABASES['default']['NAME'])"
    done = subprocess.run([sys.executable, "-c", f"import django, os; os.environ.setdefault("
                           f"'DJANGO_SETTINGS_MODULE', 'factory.settings'); django.setup(); {probe}"],
                          cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "DATABASE_URL": "postgres://u:p@db:5432/factory"})
    assert done.stdout.split() == ["django.db.backends.postgresql", "factory"], done.stderr


def test_sqlite_runs_in_wal_mode(db):
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone()[0] == "wal"
    assert str(settings.DATA_DIR) == os.environ["FACTORY_DATA_DIR"]
