"""Agents' long-term memory: a LangGraph Store kept in the platform's own database, with an embedding index.

LangGraph ships stores for SQLite and Postgres, but their vector search needs the sqlite-vec extension loaded into
SQLite (CPython builds without loadable extensions, such as pyenv's, cannot) or pgvector installed in Postgres. This
one keeps items as rows through Django (so they live, migrate and back up with everything else, on SQLite or
Postgres) and ranks a search by cosine similarity with numpy over the namespace's vectors: an agent's memories for
one end user are a few hundred rows, not an index's worth.
"""

import asyncio
from collections.abc import Callable, Iterable

import numpy as np
from django.db import transaction
from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    get_text_at_path,
)

from agent_studio.models import MemoryItem
from rag_studio.vectors import normalised

SEPARATOR = "\x1f"  # between namespace parts: a character no label contains


def _joined(namespace: tuple[str, ...]) -> str:
    return SEPARATOR.join(namespace)


def _split(namespace: str) -> tuple[str, ...]:
    return tuple(namespace.split(SEPARATOR))


class DatabaseStore(BaseStore):
    def __init__(self, *, embed: Callable[[list[str]], np.ndarray], fields: tuple[str, ...] = ("text",)):
        self._embed = embed
        self._fields = fields

    def batch(self, ops: Iterable) -> list[Result]:
        return [self._one(op) for op in ops]

    async def abatch(self, ops: Iterable) -> list[Result]:
        return await asyncio.to_thread(self.batch, list(ops))

    def _one(self, op) -> Result:
        if isinstance(op, GetOp):
            row = MemoryItem.objects.filter(namespace=_joined(op.namespace), key=op.key).first()
            return self._item(row) if row else None
        if isinstance(op, PutOp):
            return self._put(op)
        if isinstance(op, SearchOp):
            return self._search(op)
        if isinstance(op, ListNamespacesOp):
            return self._namespaces(op)
        raise TypeError(f"Unknown store operation {type(op).__name__}")

    def _text(self, value: dict, fields) -> str:
        parts = []
        for field in fields:
            parts += [str(text) for text in get_text_at_path(value, field)]
        return "\n".join(parts)

    def _put(self, op: PutOp) -> None:
        namespace = _joined(op.namespace)
        if op.value is None:
            MemoryItem.objects.filter(namespace=namespace, key=op.key).delete()
            return None
        vector = None
        if op.index is not False:
            text = self._text(dict(op.value), op.index or self._fields)
            if text:
                vector = np.asarray(self._embed([text])[0], dtype=np.float32).tobytes()
        with transaction.atomic():
            MemoryItem.objects.update_or_create(namespace=namespace, key=op.key,
                                                defaults={"value": dict(op.value), "vector": vector})
        return None

    def _search(self, op: SearchOp) -> list[SearchItem]:
        prefix = _joined(op.namespace_prefix)
        rows = MemoryItem.objects.filter(namespace__startswith=prefix)
        rows = [row for row in rows if row.namespace == prefix or row.namespace.startswith(prefix + SEPARATOR)]
        for key, wanted in (op.filter or {}).items():
            rows = [row for row in rows if row.value.get(key) == wanted]
        scores: dict[int, float] = {}
        if op.query:
            with_vectors = [row for row in rows if row.vector]
            if with_vectors:
                query = normalised([self._embed([op.query])[0]])[0]
                matrix = normalised(np.stack([np.frombuffer(row.vector, dtype=np.float32) for row in with_vectors]))
                similarities = matrix @ query
                scores = {row.pk: float(score) for row, score in zip(with_vectors, similarities)}
            rows.sort(key=lambda row: scores.get(row.pk, -2.0), reverse=True)
        else:
            rows.sort(key=lambda row: row.updated_at, reverse=True)
        page = rows[op.offset:op.offset + op.limit]
        return [SearchItem(namespace=_split(row.namespace), key=row.key, value=row.value,
                           created_at=row.created_at, updated_at=row.updated_at,
                           score=scores.get(row.pk) if op.query else None) for row in page]

    def _namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        found = sorted({_split(namespace) for namespace in
                        MemoryItem.objects.values_list("namespace", flat=True).distinct()})
        for condition in op.match_conditions or ():
            size = len(condition.path)
            if condition.match_type == "prefix":
                found = [ns for ns in found if ns[:size] == tuple(condition.path)]
            else:
                found = [ns for ns in found if ns[-size:] == tuple(condition.path)]
        if op.max_depth is not None:
            found = sorted({ns[:op.max_depth] for ns in found})
        return found[op.offset:op.offset + op.limit]

    @staticmethod
    def _item(row: MemoryItem) -> Item:
        return Item(value=row.value, key=row.key, namespace=_split(row.namespace), created_at=row.created_at,
                    updated_at=row.updated_at)

