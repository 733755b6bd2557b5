"""Move a knowledge base's live index between the embedded store and pgvector while it keeps serving (`manage.py
move_index`): build a copy in the other store from the stored vectors (nothing is embedded again), catch up with
writes made meanwhile, switch `index_backend` in one row update, catch up once more with writes that were already
under way on the old store, then drop the old copy. Retrieval reads the old store until the switch and the new one
after it; at no point is the knowledge base unsearchable."""

import copy
import time
from collections.abc import Callable

from django.db import transaction

from rag_studio import files
from rag_studio.models import Chunk, IndexBackend, KnowledgeBase
from rag_studio.search.index_store import IndexStore
from rag_studio.search.stores import check_available, store_for

# Owners copied in one write to the new store.
BATCH_OWNERS = 64


class MoveRefused(Exception):
    """The move cannot start; the message says why."""


def move_index(kb: KnowledgeBase, to: str, *, settle_s: float = 5.0, log: Callable[[str], None] = print) -> int:
    """Move `kb`'s live index to the backend `to`; returns the chunks in the new store. `settle_s`: how long an
    index write that read the old backend just before the switch is given to land before the last catch-up."""
    if to not in IndexBackend.values:
        raise MoveRefused(f"--to must be one of {', '.join(IndexBackend.values)}, not {to!r}.")
    if kb.index_backend == to:
        raise MoveRefused(f"Knowledge base {kb.pk} ({kb.name}) is already on {to}.")
    if kb.building_key:
        raise MoveRefused(f"Knowledge base {kb.pk} ({kb.name}) is being re-indexed into {kb.building_key}; move it "
                          f"once that is done.")
    check_available(to)
    source = store_for(kb)
    target = store_for(_on(kb, to))
    copied: set[str] = set()
    seen = -1
    while seen != source.generation():  # catch up until a pass saw no new write
        seen = source.generation()
        changed = _sync(kb, source, target, copied)
        log(f"copied {changed} documents' chunks to {to}")
    with transaction.atomic():
        switched = KnowledgeBase.objects.select_for_update().get(pk=kb.pk)
        if switched.index_key != kb.index_key or switched.building_key:
            raise MoveRefused(f"Knowledge base {kb.pk} started a re-index during the move; nothing was switched.")
        switched.index_backend = to
        switched.index_home = files.index_home()  # an embedded copy is in this node's data dir
        switched.save(update_fields=["index_backend", "index_home", "updated_at"])
    log(f"retrieval now reads {to}")
    time.sleep(settle_s)
    changed = _sync(kb, source, target, copied)
    log(f"caught up with {changed} documents written during the switch")
    source.drop()
    kb.index_backend = to
    return target.count()


def _on(kb: KnowledgeBase, backend: str) -> KnowledgeBase:
    # A copy with every other field: the new index is tokenised as the old one was (keywords.tokenizer_for).
    other = copy.copy(kb)
    other.index_backend = backend
    return other


def _sync(kb: KnowledgeBase, source: IndexStore, target: IndexStore, copied: set[str]) -> int:
    """Make `target` hold exactly what `source` holds for every document of `kb` (and for the owners copied
    before, in case their document was deleted since); returns how many owners changed."""
    owners = {str(pk) for pk in kb.documents.values_list("pk", flat=True)} | copied
    upserts, removals, changed = {}, [], 0
    for owner in sorted(owners, key=int):
        wanted = source.chunk_ids(owner)
        if sorted(wanted) == sorted(target.chunk_ids(owner)):
            continue
        changed += 1
        if not wanted:
            removals.append(owner)
            continue
        texts = dict(Chunk.objects.filter(pk__in=wanted).values_list("pk", "text"))
        if len(texts) < len(wanted):
            continue  # its document is being deleted: the next pass removes it
        upserts[owner] = (wanted, source.vectors(wanted), [texts[chunk_id] for chunk_id in wanted])
        if len(upserts) >= BATCH_OWNERS:
            target.apply(upserts=upserts)
            copied.update(upserts)
            upserts = {}
    if upserts or removals:
        target.apply(upserts=upserts, removals=removals)
        copied.update(upserts)
    return changed
