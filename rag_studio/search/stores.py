"""Which store keeps a knowledge base's indexes: the one place that reads a backend's name (the knowledge base's
`index_backend`, or FACTORY_RAG_INDEX_BACKEND for new ones). Everything else holds an index_store.IndexStore."""

from rag_studio.models import IndexBackend
from rag_studio.search.embedded.store import EmbeddedStore
from rag_studio.search.index_store import IndexStore


def store_for(kb, key: str | None = None) -> IndexStore:
    """The store of a knowledge base's index `key` (its live index by default)."""
    return _store_class(kb.index_backend).for_index(kb, key or kb.index_key)


def check_available(backend: str) -> None:
    """Raise StoreUnavailable, saying what to set up, unless knowledge bases can keep their indexes on `backend`."""
    _store_class(backend).check_available()


def drop_knowledge_base(kb_id: int, backend: str) -> None:
    """Remove every index that knowledge base `kb_id` has on `backend`."""
    _store_class(backend).drop_knowledge_base(kb_id)


def _store_class(backend: str) -> type[IndexStore]:
    if backend == IndexBackend.PGVECTOR:
        from rag_studio.search.pgvector_store import PgvectorStore  # psycopg and pgvector load where a base uses them

        return PgvectorStore
    return EmbeddedStore
