"""The pgvector indexes in `manage.py backup` / `restore` (assets.backup.register_part): each index of a knowledge
base on pgvector (its live one and one being built) as its chunk ids, owners and vectors; restored by writing them
back through the store with the chunks' texts from the restored database, so the keyword side is tokenised as at
ingestion. An instance without a pgvector knowledge base writes nothing and never connects to Postgres."""

import json
from pathlib import Path

import numpy as np
from psycopg import sql

from rag_studio.models import Chunk, IndexBackend, KnowledgeBase
from rag_studio.search import pgvector_store
from rag_studio.search.pgvector_store import PgvectorStore

# Owners written back in one transaction.
BATCH_OWNERS = 64


def dump(directory: Path) -> None:
    for kb in KnowledgeBase.objects.filter(index_backend=IndexBackend.PGVECTOR).order_by("pk"):
        for key in filter(None, [kb.index_key, kb.building_key]):
            table = pgvector_store.table_name(kb.pk, key)
            if PgvectorStore(kb.pk, key, kb.embedding_dimensions).count() == 0:
                continue
            rows = pgvector_store.connect().execute(
                sql.SQL("SELECT chunk_id, owner, embedding FROM {} ORDER BY chunk_id").format(sql.Identifier(table)),
                binary=True).fetchall()
            np.savez(directory / f"{table}.npz", chunk_ids=np.array([row[0] for row in rows], np.int64),
                     owners=np.array([row[1] for row in rows]),
                     vectors=np.array([row[2].to_numpy() for row in rows], np.float32))
            (directory / f"{table}.json").write_text(json.dumps(
                {"kb": kb.pk, "key": key, "dimension": kb.embedding_dimensions}), encoding="utf-8")


def load(directory: Path) -> None:
    for meta_path in sorted(directory.glob("*.json")):
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        with np.load(meta_path.with_suffix(".npz")) as saved:
            chunk_ids, owners, vectors = saved["chunk_ids"], saved["owners"], saved["vectors"]
        store = PgvectorStore(meta["kb"], meta["key"], meta["dimension"])
        texts = dict(Chunk.objects.filter(knowledge_base_id=meta["kb"]).values_list("pk", "text"))
        upserts = {}
        for owner in np.unique(owners).tolist():
            rows = np.flatnonzero(owners == owner)
            ids = chunk_ids[rows].tolist()
            if all(chunk_id in texts for chunk_id in ids):  # else its document came after the database was read
                upserts[owner] = (ids, vectors[rows], [texts[chunk_id] for chunk_id in ids])
            if len(upserts) >= BATCH_OWNERS:
                store.apply(upserts=upserts)
                upserts = {}
        store.apply(upserts=upserts)
