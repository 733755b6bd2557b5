"""Knowledge bases on the pgvector backend, against a real Postgres with the vector extension (the pgvector_url
fixture): the store answers as the embedded one, uploaded documents are ingested into it and found, the sample
eval numbers match between the backends, a batch insert killed midway leaves nothing half done, the keyword
document frequencies stay exact (and an older index gets them), a common query word costs only the rows it
needs, a missing extension says what to install, and `manage.py move_index` moves a knowledge base both ways while
it serves."""

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import textwrap

import numpy as np
import psycopg
import pytest
from django.core.management import call_command
from psycopg import sql

from accounts.errors import ServiceUnavailable
from rag_studio import files, services
from rag_studio.evals.evaluation import score_retrieval
from rag_studio.models import Document, DocumentStatus, KnowledgeBase
from rag_studio.pipeline.ingestion import ingest
from rag_studio.search import pgvector_store
from rag_studio.search.embedded.store import EmbeddedStore
from rag_studio.search.pgvector_store import PgvectorStore, PgvectorUnavailable
from rag_studio.search.retrieval import retrieve
from rag_studio.search.stores import store_for
from tests.conftest import ROOT, wait_for
from tests.rag_studio.conftest import SAMPLE_FILES, SAMPLES, ingested_kb, sample

DIMENSION = 16
TEXTS = [
    "The warranty period is two years from delivery.",
    "Shift handover starts at 16:00; the night shift takes over at midnight.",
    "Connector NW-7 is described in manual v1.2, section 4.",
    "保修期为两年，自交货之日起计算。",
    "中班十六点开始，夜班零点接班。",
    "数据库每天凌晨两点备份，保留三十天。",
    "Refunds are paid within 14 days of the returned goods arriving.",
    "反应釜压力超过零点八兆帕时立即停止进料。",
]


def _upserts(seed: int = 7) -> dict:
    vectors = np.random.default_rng(seed).normal(size=(len(TEXTS) * 3, DIMENSION)).astype(np.float32)
    upserts = {}
    for owner in range(3):
        ids = [owner * 100 + i for i in range(len(TEXTS))]
        texts = [f"{text} (copy {owner})" if owner else text for text in TEXTS]
        upserts[str(owner + 1)] = (ids, vectors[owner * len(TEXTS):(owner + 1) * len(TEXTS)], texts)
    return upserts


def _rounded(hits):
    return [(chunk_id, round(score, 4)) for chunk_id, score in hits]


def test_the_pgvector_store_answers_as_the_embedded_store_does(on_pgvector, tmp_path):
    pgvector, embedded = PgvectorStore(1, "model.test.v1", DIMENSION), EmbeddedStore(tmp_path / "index", DIMENSION)
    for store in (pgvector, embedded):
        store.apply(upserts=_upserts())
        store.apply(upserts={"2": _upserts()["2"]})  # written again (a worker taking over): nothing doubles
    query = np.random.default_rng(1).normal(size=DIMENSION)

    answers = {}
    for name, store in (("pgvector", pgvector), ("embedded", embedded)):
        dense_stats, keyword_stats, chinese_stats = {}, {}, {}
        answers[name] = {
            "dense": _rounded(store.search_dense(query, 10, dense_stats)),
            "keyword": _rounded(store.search_keyword("warranty NW-7 manual", 10, keyword_stats)),
            "chinese": _rounded(store.search_keyword("夜班几点接班", 10, chinese_stats)),
            "stats": [{key: round(value, 5) for key, value in stats.items()}
                      for stats in (dense_stats, keyword_stats, chinese_stats)],
            "owner": store.chunk_ids("2"), "count": store.count(),
        }
        assert np.allclose(store.vectors([203, 5]), embedded.vectors([203, 5]), atol=1e-6)

    assert answers["pgvector"] == answers["embedded"]
    assert answers["pgvector"]["count"] == 3 * len(TEXTS)
    assert [chunk_id for chunk_id, _ in answers["pgvector"]["chinese"]][:1] in ([4], [104], [204])
    assert answers["pgvector"]["keyword"][0][0] in (0, 2)  # the warranty or the NW-7 chunk, not a refund

    pgvector.apply(removals=["2"])
    assert pgvector.chunk_ids("2") == [] and pgvector.count() == 2 * len(TEXTS)
    with pytest.raises(KeyError, match="chunk 103"):
        pgvector.vectors([203, 103])


def test_a_document_uploaded_to_a_pgvector_knowledge_base_is_indexed_there_and_found(on_pgvector, acme, ann):
    kb = ingested_kb(ann, acme, name="Northwind on pgvector", files=["northwind-support-faq.md"])

    hits = retrieve(kb, "Can the robot be used in a freezer warehouse?", {"top_k": 3}).hits

    assert kb.index_backend == "pgvector"
    assert store_for(kb).count() == kb.documents.get().chunks.filter(searchable=True).count() > 0
    assert any("approved for ambient warehouses only" in hit.text for hit in hits)
    assert hits[0].dense is not None and hits[0].keyword is not None  # both sides explained, as on the embedded store
    assert not files.index_dir(kb.pk, kb.index_key).exists()


def _eval_numbers(kb: KnowledgeBase) -> dict:
    questions = [json.loads(line) for name in ("northwind-eval.jsonl", "huadong-eval.jsonl")
                 for line in (SAMPLES / name).read_text(encoding="utf-8").splitlines() if line.strip()]
    totals: dict[str, float] = {}
    for question in questions:
        hits = retrieve(kb, question["question"], {"top_k": 5}).hits
        for metric, value in score_retrieval(hits, question["expected_sources"], 5).items():
            totals[metric] = totals.get(metric, 0.0) + value
    return {metric: total / len(questions) for metric, total in totals.items()}


def test_the_sample_eval_numbers_match_and_move_index_moves_a_base_both_ways(on_pgvector, acme, ann, settings):
    settings.RAG_INDEX_BACKEND = "embedded"
    chinese = ["huadong-plant-handbook.md", "huadong-shift-handover.txt", "huadong-maintenance-rules.docx"]
    kb = ingested_kb(ann, acme, name="Samples", files=SAMPLE_FILES + chinese)
    embedded = _eval_numbers(kb)

    call_command("move_index", str(kb.pk), "--to", "pgvector", "--settle-s", "0", stdout=io.StringIO())
    kb.refresh_from_db()
    on_pgvector = _eval_numbers(kb)
    pgvector_chunks = store_for(kb).count()

    assert kb.index_backend == "pgvector"
    assert not files.index_dir(kb.pk, kb.index_key).exists()  # the old copy is gone once retrieval moved
    assert embedded["hit@k"] > 0.8, embedded
    assert on_pgvector == pytest.approx(embedded, abs=0.01)

    call_command("move_index", str(kb.pk), "--to", "embedded", "--settle-s", "0", stdout=io.StringIO())
    kb.refresh_from_db()
    assert kb.index_backend == "embedded" and store_for(kb).count() == pgvector_chunks
    assert _eval_numbers(kb) == pytest.approx(embedded, abs=0.01)
    with psycopg.connect(settings.RAG_PGVECTOR_URL) as connection:
        assert connection.execute("SELECT count(*) FROM rag_pgvector_index WHERE key = %s",
                                  (kb.index_key,)).fetchone() == (0,)


def test_move_index_refuses_what_it_cannot_do(on_pgvector, acme, ann):
    kb = services.create_knowledge_base(actor=ann, workspace=acme, name="Already there")
    with pytest.raises(Exception, match="already on pgvector"):
        call_command("move_index", str(kb.pk), "--to", "pgvector")
    with pytest.raises(Exception, match="no knowledge base 999999"):
        call_command("move_index", "999999", "--to", "embedded")


def test_a_worker_killed_mid_batch_insert_loses_and_doubles_nothing(on_pgvector):
    store = PgvectorStore(2, "model.kill.v1", 384)
    rng = np.random.default_rng(3)
    store.apply(upserts={"1": ([1, 2], rng.normal(size=(2, 384)), ["first", "second"])})
    before = store.count(), store.generation()
    # A worker inserting 20,000 chunks in one batch, killed while its COPY runs.
    script = textwrap.dedent("""
        import django, numpy as np
        django.setup()
        from rag_studio.search.pgvector_store import PgvectorStore
        ids = list(range(1000, 21000))
        vectors = np.random.default_rng(4).normal(size=(len(ids), 384))
        PgvectorStore(2, "model.kill.v1", 384).apply(upserts={"2": (ids, vectors, [f"chunk {i}" for i in ids])})
    """)
    worker = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, start_new_session=True,
                              env={**os.environ, "DJANGO_SETTINGS_MODULE": "factory.settings",
                                   "FACTORY_RAG_PGVECTOR_URL": on_pgvector})
    with psycopg.connect(on_pgvector, autocommit=True) as watcher:
        def copying():
            return watcher.execute("SELECT pid FROM pg_stat_activity WHERE query LIKE 'COPY \"rag_index_2_%' "
                                   "AND state = 'active'").fetchone()

        backend = wait_for(copying, timeout=60, interval=0.05, what="the worker's COPY to start")
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        wait_for(lambda: watcher.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", backend).fetchone() is None,
                 timeout=30, what="Postgres to end the dead worker's session")

    assert (store.count(), store.generation()) == before
    assert store.chunk_ids("2") == [] and store.chunk_ids("1") == [1, 2]
    assert _kept_and_counted_frequencies(on_pgvector, store) == ({"first": 1, "second": 1},) * 2
    # The document is taken over and the same write run again: each chunk once.
    ids = list(range(1000, 1100))
    store.apply(upserts={"2": (ids, rng.normal(size=(len(ids), 384)), [f"chunk {i}" for i in ids])})
    store.apply(upserts={"2": (ids, rng.normal(size=(len(ids), 384)), [f"chunk {i}" for i in ids])})
    assert store.count() == 102 and store.chunk_ids("2") == ids
    kept, counted = _kept_and_counted_frequencies(on_pgvector, store)
    assert kept == counted and kept["chunk"] == 100


def _kept_and_counted_frequencies(url: str, store: PgvectorStore) -> tuple[dict, dict]:
    """The index's document frequency table, and the frequencies counted afresh from its rows."""
    with psycopg.connect(url) as connection:
        kept = dict(connection.execute(
            sql.SQL("SELECT lexeme, rows FROM {}").format(sql.Identifier(f"{store.table}_df"))).fetchall())
        counted = dict(connection.execute(
            sql.SQL("SELECT lexeme, count(*) FROM {}, unnest(tsvector_to_array(tokens)) AS lexeme GROUP BY lexeme")
            .format(sql.Identifier(store.table))).fetchall())
    return kept, counted


def test_the_document_frequencies_stay_exact_through_every_write(on_pgvector):
    store = PgvectorStore(3, "model.frequencies.v1", DIMENSION)
    upserts = _upserts()
    store.apply(upserts=upserts)
    kept, counted = _kept_and_counted_frequencies(on_pgvector, store)
    assert kept == counted and kept["warranti"] == 3  # "warranty", stemmed, in one chunk of each of 3 owners

    store.apply(upserts={"2": upserts["2"]})  # written again: nothing doubles
    assert _kept_and_counted_frequencies(on_pgvector, store) == (kept, counted)
    ids, vectors, _ = upserts["2"]
    store.apply(upserts={"2": (ids[:2], vectors[:2], ["Warranty claims go to the plant office.", "夜班零点接班"])},
                removals=["3"])
    kept, counted = _kept_and_counted_frequencies(on_pgvector, store)
    assert kept == counted and kept["warranti"] == 2 and kept["plant"] == 1 and "refund" in kept

    store.apply(removals=["1", "2"])
    assert _kept_and_counted_frequencies(on_pgvector, store) == ({}, {})
    assert store.search_keyword("warranty", 10) == []


def test_an_index_of_the_previous_release_gets_its_document_frequencies(on_pgvector, monkeypatch):
    store = PgvectorStore(4, "model.previous.v1", DIMENSION)
    store.apply(upserts=_upserts())
    stats_before = {}
    before = store.search_keyword("warranty NW-7 manual", 10, stats_before)
    # What the previous release left: the same index with no frequency table, in a process that never saw one.
    with psycopg.connect(on_pgvector, autocommit=True) as connection:
        connection.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(f"{store.table}_df")))
    monkeypatch.setattr(pgvector_store, "_FREQUENCIES_READY", set())

    stats_after = {}
    assert store.search_keyword("warranty NW-7 manual", 10, stats_after) == before and stats_after == stats_before
    kept, counted = _kept_and_counted_frequencies(on_pgvector, store)
    assert kept == counted and kept["nw-7"] == 3

    # A write finding no frequency table builds one too, then keeps it exact.
    with psycopg.connect(on_pgvector, autocommit=True) as connection:
        connection.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(f"{store.table}_df")))
    monkeypatch.setattr(pgvector_store, "_FREQUENCIES_READY", set())
    store.apply(removals=["3"])
    kept, counted = _kept_and_counted_frequencies(on_pgvector, store)
    assert kept == counted and kept["nw-7"] == 2


def _pump_room_texts() -> list[str]:
    """60 chunks: "pump" in 50 of them, "valve" in 35, "boiler" in 20, "impeller" in one (chunk 7)."""
    texts = []
    for i in range(60):
        words = ["pump"] * (i < 50) + ["valve"] * (i < 30 or 50 <= i < 55) + ["boiler"] * (i >= 40)
        texts.append(f"Inspection note {i}: " + " ".join(words + ["impeller"] * (i == 7)) + ".")
    return texts


def test_a_common_word_in_the_query_costs_no_more_than_the_rows_it_finds(on_pgvector, tmp_path, monkeypatch):
    monkeypatch.setattr(pgvector_store, "KEYWORD_CANDIDATES", 10)  # "pump", "valve" and "boiler" are common here
    texts = _pump_room_texts()
    vectors = np.random.default_rng(5).normal(size=(len(texts), DIMENSION))
    pgvector, embedded = PgvectorStore(5, "model.pumps.v1", DIMENSION), EmbeddedStore(tmp_path / "index", DIMENSION)
    for store in (pgvector, embedded):
        store.apply(upserts={"room": (list(range(len(texts))), vectors, texts)})

    stats, exact_stats = {}, {}
    hits = pgvector.search_keyword("pump impeller", 30, stats)
    everything = embedded.search_keyword("pump impeller", 60, exact_stats)
    # The rare word's chunk first, then a few of the 49 with only "pump" (not all: they cost without adding much),
    # each with the score the embedded store gives it.
    assert _rounded(hits[:1]) == _rounded(everything[:1]) and hits[0][0] == 7
    assert len(hits) == 10 and all(chunk_id < 50 for chunk_id, _ in hits)
    assert set(_rounded(hits)) <= set(_rounded(everything))
    assert len(everything) == 50 and stats["matches"] == exact_stats["matches"] == 50
    assert stats["mean"] == pytest.approx(exact_stats["mean"], rel=0.1)
    assert stats["std"] == pytest.approx(exact_stats["std"], rel=0.25)

    # No word rare enough: the rows holding every word, at most KEYWORD_CANDIDATES of them.
    both = pgvector.search_keyword("pump valve", 30)
    assert len(both) == 10 and all(chunk_id < 30 for chunk_id, _ in both)
    # Fewer rows hold every word than asked for: rows holding the rarer one ("boiler") fill up, below them.
    ranked = [chunk_id for chunk_id, _ in pgvector.search_keyword("valve boiler", 30)]
    assert sorted(ranked[:5]) == [50, 51, 52, 53, 54] and len(ranked) == 10
    assert all(40 <= chunk_id < 50 or 55 <= chunk_id < 60 for chunk_id in ranked[5:])


def test_a_missing_vector_extension_names_what_to_install(pgvector_url, settings, acme, ann):
    with psycopg.connect(pgvector_url, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS plain_app")
        admin.execute("DROP ROLE IF EXISTS plain_app")
        admin.execute("CREATE ROLE plain_app LOGIN")
        admin.execute("CREATE DATABASE plain_app OWNER plain_app")
    settings.RAG_INDEX_BACKEND = "pgvector"
    settings.RAG_PGVECTOR_URL = psycopg.conninfo.make_conninfo(pgvector_url, user="plain_app", dbname="plain_app")

    with pytest.raises(PgvectorUnavailable) as refused:
        PgvectorStore.check_available()
    with pytest.raises(ServiceUnavailable, match="CREATE EXTENSION vector"):
        services.create_knowledge_base(actor=ann, workspace=acme, name="Nowhere to go")

    assert "CREATE EXTENSION vector;" in str(refused.value)
    assert "apt install postgresql-18-pgvector" in str(refused.value)
    assert "'plain_app'" in str(refused.value)
    assert not KnowledgeBase.objects.filter(name="Nowhere to go").exists()

    settings.RAG_PGVECTOR_URL = ""  # the default database, SQLite in the tests: not a place for vectors
    with pytest.raises(PgvectorUnavailable, match="set DATABASE_URL .* to a Postgres database"):
        PgvectorStore.check_available()


def test_a_worker_with_a_data_dir_of_its_own_refuses_to_split_an_embedded_index(acme, ann):
    kb = services.create_knowledge_base(actor=ann, workspace=acme, name="Lives on node A")
    assert kb.index_home == files.index_home() and kb.index_backend == "embedded"
    KnowledgeBase.objects.filter(pk=kb.pk).update(index_home={"node": "node-a", "data_dir": "another-disk"})
    document = services.upload_documents(actor=ann, kb=kb, uploads=[sample("northwind-support-faq.md")])[0].document

    assert ingest(document.pk, "pytest") == "failed"
    document = Document.objects.get(pk=document.pk)
    assert document.status == DocumentStatus.FAILED and document.error_code == "index_elsewhere"
    assert "node 'node-a'" in document.error and f"move_index {kb.pk} --to pgvector" in document.error
    assert not files.index_dir(kb.pk, kb.index_key).exists()


PROBE_SCRIPT = """
import json, sys
import django
django.setup()
from rag_studio.models import KnowledgeBase
from rag_studio.search.retrieval import retrieve
kb = KnowledgeBase.objects.get(name=sys.argv[1])
print(json.dumps({"backend": kb.index_backend,
                  "hits": [[h.chunk_id, round(h.fused, 4)] for h in retrieve(kb, sys.argv[2]).hits]}))
"""


@pytest.mark.slow
def test_a_backup_carries_the_pgvector_index_and_a_restore_puts_it_back(pgvector_url, settings, transactional_db,
                                                                        tmp_path):
    from django.contrib.auth import get_user_model

    from accounts.services import Actor, create_workspace
    from serving.presets import register_presets

    settings.RAG_INDEX_BACKEND, settings.RAG_PGVECTOR_URL = "pgvector", pgvector_url
    register_presets(lambda line: None)
    owner = Actor(user=get_user_model().objects.create_user(username="ops", password="x" * 12))
    kb = ingested_kb(owner, create_workspace(actor=owner, name="Ops"), name="Backed up",
                     files=["northwind-support-faq.md"])
    question = "Can the robot be used in a freezer warehouse?"
    here = [[hit.chunk_id, round(hit.fused, 4)] for hit in retrieve(kb, question).hits]
    archive = tmp_path / "instance.tar"
    call_command("backup", output=archive, verbosity=0)
    with psycopg.connect(pgvector_url, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS restored")
        admin.execute("CREATE DATABASE restored")
    restored_url = psycopg.conninfo.make_conninfo(pgvector_url, dbname="restored")
    env = {**{key: value for key, value in os.environ.items() if key != "DATABASE_URL"},
           "FACTORY_DATA_DIR": str(tmp_path / "restored"), "DJANGO_SETTINGS_MODULE": "factory.settings",
           "FACTORY_RAG_PGVECTOR_URL": restored_url}

    restored = subprocess.run([sys.executable, "manage.py", "restore", str(archive)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
    assert restored.returncode == 0, restored.stderr[-2000:]
    probe = subprocess.run([sys.executable, "-c", PROBE_SCRIPT, "Backed up", question], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)

    assert probe.returncode == 0, probe.stderr[-2000:]
    assert json.loads(probe.stdout.strip().splitlines()[-1]) == {"backend": "pgvector", "hits": here}
    # Its index is in Postgres only: the restore wrote no embedded index for it (other tests' bases may have one).
    assert here and not list((tmp_path / "restored").glob(f"rag/kb-{kb.pk}/indexes/*/CURRENT"))
    manifest = json.loads(tarfile.open(archive).extractfile("manifest.json").read())
    assert any(member.startswith("parts/pgvector/rag_index_") for member in manifest["files"])


def test_a_reindex_builds_a_new_table_beside_the_live_one_and_drops_the_old_at_the_switch(on_pgvector, acme, ann):
    kb = ingested_kb(ann, acme, name="Re-indexed", files=["northwind-support-faq.md"])
    old_key, chunks = kb.index_key, store_for(kb).count()

    new_key = services.start_reindex(actor=ann, kb=kb)
    assert PgvectorStore(kb.pk, old_key, kb.embedding_dimensions).count() == chunks  # still the live one
    for document in kb.documents.all():
        assert ingest(document.pk, "pytest") == "indexed"
    kb.refresh_from_db()

    assert kb.index_key == new_key != old_key and store_for(kb).count() == chunks
    with psycopg.connect(on_pgvector) as connection:
        assert connection.execute("SELECT key FROM rag_pgvector_index WHERE kb_id = %s", (kb.pk,)).fetchall() == [
            (new_key,)]
        assert connection.execute("SELECT to_regclass(%s)", (pgvector_store.table_name(kb.pk, old_key),)).fetchone() \
            == (None,)
    assert any("ambient warehouses" in hit.text for hit in retrieve(kb, "freezer warehouse robot").hits)
