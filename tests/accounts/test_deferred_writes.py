"""Writes no request waits for (accounts/deferred_writes.py): rows queue until the writer's thread takes them in a
batch on its own connection; a database that cannot take a batch now gets it again, a row it refuses is dropped
alone, and past the queue's bound rows are dropped with an error in the log."""

import logging

import pytest
from django.db import OperationalError

from accounts import deferred_writes
from accounts.deferred_writes import DeferredWriter
from accounts.models import Workspace

pytestmark = pytest.mark.django_db(transaction=True)
# Long enough that nothing is written before the test flushes.
HELD_S = 30.0


def _slugs() -> list[str]:
    return sorted(Workspace.objects.values_list("slug", flat=True))


def test_rows_wait_for_their_batch_and_a_flush_writes_them_all():
    writer = DeferredWriter(linger_s=HELD_S)
    renamed = Workspace.objects.create(name="Old", slug="old")
    for slug in ("a", "b", "c"):
        writer.insert(Workspace(name=slug.upper(), slug=slug))
    writer.update(Workspace, renamed.pk, name="New")

    assert _slugs() == ["old"]
    assert writer.flush(10)
    assert _slugs() == ["a", "b", "c", "old"] and Workspace.objects.get(slug="old").name == "New"


def test_a_row_the_database_refuses_is_dropped_alone(caplog):
    Workspace.objects.create(name="Taken", slug="taken")
    writer = DeferredWriter(linger_s=HELD_S)
    for slug in ("before", "taken", "after"):
        writer.insert(Workspace(name=slug, slug=slug))

    with caplog.at_level(logging.ERROR, logger=deferred_writes.__name__):
        assert writer.flush(10)
    assert _slugs() == ["after", "before", "taken"]
    assert "dropped a Workspace the database refused" in caplog.text


def test_a_batch_the_database_cannot_take_now_is_written_once_it_can(monkeypatch, caplog):
    refusals = [OperationalError("database is locked")] * 2
    save = deferred_writes._save

    def locked_twice(batch):
        if refusals:
            raise refusals.pop()
        save(batch)

    monkeypatch.setattr(deferred_writes, "_save", locked_twice)
    monkeypatch.setattr(deferred_writes, "RETRY_FIRST_S", 0.01)
    writer = DeferredWriter(linger_s=HELD_S)
    writer.insert(Workspace(name="Kept", slug="kept"))

    with caplog.at_level(logging.WARNING, logger=deferred_writes.__name__):
        assert writer.flush(10)
    assert _slugs() == ["kept"] and refusals == []
    assert caplog.text.count("could not take 1 rows (database is locked)") == 2


def test_past_the_bound_new_rows_are_dropped_with_one_error(caplog):
    writer = DeferredWriter(linger_s=HELD_S, max_queued=2)
    with caplog.at_level(logging.ERROR, logger=deferred_writes.__name__):
        for slug in ("one", "two", "three", "four"):
            writer.insert(Workspace(name=slug, slug=slug))
        assert writer.flush(10)

    assert _slugs() == ["one", "two"]
    assert caplog.text.count("2 rows are waiting for the database") == 1
