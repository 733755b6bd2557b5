"""The indexes a copy of the data dir does not hold, in `manage.py backup` / `restore` (assets.backup.register_part):
each index whose store dumps it (a knowledge base on pgvector: its live index and one being built) as its chunk ids,
owners and vectors; restored by writing them back through the store with the chunks' texts from the restored
database, so the keyword side is tokenised as at ingestion. An instance without a pgvector knowledge base writes
nothing and never connects to Postgres."""

import json
from pathlib import Path

import numpy as np

from rag_studio.models import Chunk, KnowledgeBase
from rag_studio.search.stores import store_for

# The part's name in archives (the pgvector store was the first to keep indexes outside the data dir).
PART = "pgvector"
# Owners written back in one transaction.
BATCH_OWNERS = 64


def dump(directory: Path) -> None:
    for kb in KnowledgeBase.objects.order_by("pk"):
        for key in filter(None, [kb.index_key, kb.building_key]):
            rows = store_for(kb, key).dump()
            if rows is None:
                continue
            np.savez(directory / f"{rows.name}.npz", chunk_ids=rows.chunk_ids, owners=rows.owners,
                     vectors=rows.vectors)
            (directory / f"{rows.name}.json").write_text(json.dumps(
                {"kb": kb.pk, "key": key, "dimension": kb.embedding_dimensions}), encoding="utf-8")


def load(directory: Path) -> None:
    for meta_path in sorted(directory.glob("*.json")):
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        kb = KnowledgeBase.objects.filter(pk=meta["kb"]).first()
        if kb is None:
            continue  # created after the database was read: none of its chunks are there to index
        with np.load(meta_path.with_suffix(".npz")) as saved:
            chunk_ids, owners, vectors = saved["chunk_ids"], saved["owners"], saved["vectors"]
        store = store_for(kb, meta["key"])
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
