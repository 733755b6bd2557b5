"""Secrets at rest: an external model's API key is stored encrypted, read back in the clear by the platform only, and
re-encrypted by key rotation."""

import subprocess
import sys
import time

import pytest
from cryptography.fernet import Fernet
from django.core.management import CommandError, call_command
from django.db import connection

from accounts.services import SYSTEM
from serving import services
from serving.models import Model
from tests.conftest import ROOT
from workbridge import vault

pytestmark = pytest.mark.django_db


@pytest.fixture
def keys(monkeypatch):
    """Sets FACTORY_SECRETS_KEY to the given keys (first encrypts) for the rest of the test."""

    def use(*keys: bytes) -> None:
        monkeypatch.setenv("FACTORY_SECRETS_KEY", ",".join(key.decode() for key in keys))
        vault._fernet.cache_clear()

    yield use
    vault._fernet.cache_clear()


def _stored(model: Model) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT api_key FROM serving_model WHERE id = %s", [model.pk])
        return cursor.fetchone()[0]


@pytest.fixture
def remote(settings) -> Model:
    settings.EGRESS_ALLOW = ["localhost"]
    return services.register_model(actor=SYSTEM, workspace=None, name="remote", url="http://localhost:9/v1",
                                   api_key="sk-live-0123456789abcdef")


def test_an_external_models_key_is_encrypted_in_the_database_and_clear_to_the_platform(remote):
    stored = _stored(remote)

    assert stored.startswith(vault.PREFIX) and "sk-live" not in stored
    assert Model.objects.get(pk=remote.pk).api_key == "sk-live-0123456789abcdef"
    assert vault.mask("sk-live-0123456789abcdef") == "••••••••cdef"


def test_without_a_configured_key_one_is_made_once_in_the_data_dir(settings, keys, monkeypatch):
    monkeypatch.delenv("FACTORY_SECRETS_KEY", raising=False)
    vault._fernet.cache_clear()
    token = vault.encrypt("hello")

    key_file = settings.DATA_DIR / "secrets.key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    vault._fernet.cache_clear()
    assert vault.decrypt(token) == "hello"


def test_rotation_re_encrypts_with_the_new_key_and_the_old_one_can_then_go(remote, keys):
    old, new = Fernet.generate_key(), Fernet.generate_key()
    keys(old)
    Model.objects.filter(pk=remote.pk).update(api_key="sk-rotate-me")
    written_with_old = _stored(remote)

    keys(new, old)
    call_command("rotate_secrets", stdout=open("/dev/null", "w"))
    keys(new)

    assert _stored(remote) != written_with_old
    assert Model.objects.get(pk=remote.pk).api_key == "sk-rotate-me"


def test_a_secret_no_configured_key_decrypts_loads_as_unreadable_and_keeps_its_stored_value(remote, keys):
    written_with = Fernet.generate_key()
    keys(written_with)
    Model.objects.filter(pk=remote.pk).update(api_key="sk-written-with-a-lost-key")
    stored = _stored(remote)

    keys(Fernet.generate_key())
    model = Model.objects.get(pk=remote.pk)  # the row loads: one unreadable secret takes nothing else down
    assert vault.unreadable(model.api_key) and not model.api_key
    assert vault.mask(model.api_key) == "cannot be decrypted: enter it again"
    model.save()
    assert _stored(remote) == stored
    with pytest.raises(CommandError, match=f"serving.Model.api_key of row {remote.pk}"):
        call_command("rotate_secrets", stdout=open("/dev/null", "w"))
    assert _stored(remote) == stored

    keys(written_with)
    assert Model.objects.get(pk=remote.pk).api_key == "sk-written-with-a-lost-key"


CHILD = """
import os, sys, time
from pathlib import Path

import django

django.setup()
from django.conf import settings

from tests.conftest import ROOT
from workbridge import vault

base, rounds = Path(sys.argv[1]), int(sys.argv[2])
print("ready", flush=True)
go = base / "go"
while not go.exists():
    time.sleep(0.005)
start = float(go.read_text())
for round in range(rounds):
    time.sleep(max(0.0, start + round * 0.05 - time.time()))
    settings.DATA_DIR = base / f"round-{round}"
    vault._fernet.cache_clear()
    print(round, vault.encrypt(f"from {os.getpid()}"), flush=True)
"""


def test_processes_starting_together_on_an_empty_data_dir_make_one_key_and_read_each_others_secrets(tmp_path,
                                                                                                  monkeypatch):
    monkeypatch.delenv("FACTORY_SECRETS_KEY", raising=False)
    rounds = 25
    children = [subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), str(rounds)], cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    for child in children:
        assert child.stdout.readline().strip() == "ready", child.stderr.read()
    (tmp_path / "go").write_text(str(time.time() + 0.5))
    outputs = [child.communicate(timeout=120) for child in children]

    for child, (out, err) in zip(children, outputs):
        assert child.returncode == 0, err
    for round in range(rounds):
        key = Fernet((tmp_path / f"round-{round}" / "secrets.key").read_bytes().strip())
        for child, (out, _) in zip(children, outputs):
            token = dict(line.split(" ", 1) for line in out.splitlines())[str(round)]
            assert key.decrypt(token.removeprefix(vault.PREFIX).encode()).decode() == f"from {child.pid}"


def test_a_key_stored_before_encryption_reads_as_typed_and_is_encrypted_by_the_migration(remote):
    from importlib import import_module

    from django.apps import apps

    with connection.cursor() as cursor:
        cursor.execute("UPDATE serving_model SET api_key = 'sk-plain' WHERE id = %s", [remote.pk])
    assert Model.objects.get(pk=remote.pk).api_key == "sk-plain"

    import_module("serving.migrations.0004_encrypt_external_api_keys").encrypt_stored_keys(apps, None)

    assert _stored(remote).startswith(vault.PREFIX)
    assert Model.objects.get(pk=remote.pk).api_key == "sk-plain"
