import os
import subprocess
import sys

from django.conf import settings
from django.db import connection

from tests.conftest import ROOT


def _import_settings(**env):
    return subprocess.run([sys.executable, "-c", "import factory.settings"], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, **env})


PRODUCTION = {"FACTORY_ENV": "prod", "FACTORY_SECRET_KEY": "a1b2c3d4e5-" * 6,
              "FACTORY_ALLOWED_HOSTS": "factory.example"}


def test_production_refuses_a_missing_or_short_secret_key_and_a_missing_host_list():
    for key in ("", "a-long-private-value"):
        refused = _import_settings(**PRODUCTION | {"FACTORY_SECRET_KEY": key})
        assert refused.returncode != 0
        assert "FACTORY_SECRET_KEY must be set to a private random value of at least 50" in refused.stderr
    refused = _import_settings(**PRODUCTION | {"FACTORY_ALLOWED_HOSTS": ""})
    assert refused.returncode != 0 and "FACTORY_ALLOWED_HOSTS must name the hosts" in refused.stderr

    started = _import_settings(**PRODUCTION)
    assert started.returncode == 0, started.stderr


def test_the_production_deploy_check_finds_nothing_to_secure(tmp_path):
    checked = subprocess.run([sys.executable, "manage.py", "check", "--deploy"], cwd=ROOT, capture_output=True,
                             text=True, env={**os.environ, **PRODUCTION, "FACTORY_DATA_DIR": str(tmp_path)})
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "security." not in checked.stdout + checked.stderr


def test_without_a_configured_key_each_installation_makes_its_own(tmp_path):
    probe = "from django.conf import settings; print(settings.SECRET_KEY)"
    env = {**os.environ, "FACTORY_DATA_DIR": str(tmp_path), "FACTORY_SECRET_KEY": "",
           "DJANGO_SETTINGS_MODULE": "factory.settings"}
    def run():
        return subprocess.run([sys.executable, "-c", f"import django; django.setup(); {probe}"], cwd=ROOT,
                              capture_output=True, text=True, env=env).stdout.strip()
    first = run()
    assert len(first) >= 50 and run() == first
    assert (tmp_path / "secret_key").stat().st_mode & 0o777 == 0o600
    env["FACTORY_DATA_DIR"] = str(tmp_path / "another")
    assert run() != first


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
