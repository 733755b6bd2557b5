"""A knowledge base's dense and keyword indexes in Postgres with the pgvector extension: the store that several nodes
share (FACTORY_RAG_INDEX_BACKEND=pgvector, or a knowledge base's `index_backend`). It implements
index_store.IndexStore with the embedded store's scores, so fusion, explanations and evals do not tell the two apart.

Where: FACTORY_RAG_PGVECTOR_URL when set, else the default database (DATABASE_URL), which must then be Postgres with
the `vector` extension (`CREATE EXTENSION vector;`; Debian/Ubuntu package postgresql-NN-pgvector). The store opens
its own psycopg connection, so the test database's transactions and Django's connection handling stay out of it.

Layout, per knowledge base and index key (a new embedding model or dimension gets a new key, hence a new table; the
old one is dropped when retrieval switches to the new one):

    rag_index_<kb id>_<key hash>   chunk_id bigint primary key, owner text (document id), embedding vector(dim)
                                   (L2-normalised, HNSW index with inner-product ops: inner product = cosine),
                                   tokens tsvector (GIN index), length int (keyword tokens in the chunk)
    rag_index_<kb id>_<hash>_df    lexeme text primary key, rows int: how many rows hold each token (document
                                   frequencies), kept exact by every write; an index of an earlier release, which
                                   has none, gets it built from its rows on first use
    rag_pgvector_index             one row per index: its dimension, a generation number new at every write,
                                   and the sums that make the z-score statistics exact without scanning the table:
                                   row count, total token length, the sum of the vectors and their Gram matrix.

Keyword search: Postgres has no Chinese parser, so the tokens are those of search/keywords.py (jieba words plus CJK
bigrams, identifiers kept whole), computed in Python and stored as a tsvector written literally (the 'simple'
configuration's behaviour: no stemming, no stopwords), each token with positions 1..count so that a row's term
frequency is its number of positions (Postgres keeps at most 256 per token; BM25 saturates long before).
A search costs what it finds, not the size of the index (Lucene's "common terms" idea): the query's tokens are taken
rarest first while their document frequencies add up to at most KEYWORD_CANDIDATES, and the GIN index finds the
rows holding any of those; rows holding only commoner tokens ("what", a word in every other chunk) score little and
are left out, but for a few while the candidates are fewer than asked for: rows holding every commoner token, then
the rarest of them, up to KEYWORD_CANDIDATES in all (the whole answer when no token is that rare). Each
candidate is scored over every query token with BM25 (Lucene's formula, idf from the exact document frequencies and
the stored length sums), so its score is the embedded store's; an index or query small enough scores every
matching row and answers exactly as the embedded store does. Fusion's z-score statistics over every chunk are
exact then too; otherwise the rows left out are estimated from the document frequencies (_fill_keyword_stats).

Dense search: the HNSW index's nearest neighbours by inner product. The mean and spread of the query's cosine over
every chunk (fusion's z-scores) come from the stored sums: mean = q.s / n, mean square = q'Gq / n.

Writes: one transaction per `apply`, which locks the index's row, deletes the owners' rows, COPYs the new ones and
updates the sums and the document frequencies. A worker killed mid-batch leaves the previous state whole; the
document is taken over and the same `apply` run again, so nothing is lost and nothing doubled.
"""

import hashlib
import os
import threading
from collections import Counter
from collections.abc import Callable

import numpy as np
import psycopg
from django.conf import settings
from pgvector.psycopg import register_vector
from psycopg import sql

from rag_studio.search.index_store import (
    BM25_B,
    BM25_K1,
    Hits,
    IndexDump,
    IndexStore,
    StoreUnavailable,
    Upsert,
    normalised_query,
    validated_batches,
)
from rag_studio.search.keywords import keyword_tokens, tokenizer_for

REGISTRY = "rag_pgvector_index"
# Generation numbers come from one sequence: never reused, even by an index dropped and made again under the same
# name, so a process's cached sums are fresh exactly when the number matches.
GENERATIONS = "rag_pgvector_generation"
# HNSW indexes of pgvector's `vector` type take at most this many dimensions.
MAX_DIMENSIONS = 2000
# Postgres refuses a tsvector lexeme longer than this (bytes); such a "word" (a base64 blob) is never queried.
MAX_LEXEME_BYTES = 2046
MAX_POSITIONS = 256
# The most rows a keyword search scores (see the module docstring): every matching row on an index this small.
KEYWORD_CANDIDATES = 4000
# The HNSW graph's build effort (pgvector's default is 64). Measured on 1M synthetic chunks (tight topic clusters,
# bench.ingest): recall@10 0.921 at ef_search 200 with 64, and no more than 0.948 at any ef_search, as neighbours the
# graph never linked stay out of reach; 1.000 at ef_search 200 with 128, inserts costing about 1.7 times as much.
HNSW_EF_CONSTRUCTION = 128
# How many rows of an index hold each lexeme.
FREQUENCY_TABLE = "CREATE TABLE {} (lexeme text COLLATE \"C\" PRIMARY KEY, rows integer NOT NULL)"
INSTALL_HINT = ("install pgvector on the database server (Debian/Ubuntu: `apt install postgresql-{major}-pgvector`) "
                "and run `CREATE EXTENSION vector;` in that database as a superuser, or keep knowledge bases on the "
                "embedded store (FACTORY_RAG_INDEX_BACKEND=embedded)")


class PgvectorUnavailable(StoreUnavailable):
    """The pgvector backend cannot run here; the message says what to set up."""


class PgvectorStore(IndexStore):
    """One knowledge base + index key's indexes in Postgres."""

    def __init__(self, kb_id: int, key: str, dimension: int, tokenize: Callable[[str], list[str]] = keyword_tokens):
        self.kb_id, self.key, self.dimension, self.tokenize = kb_id, key, dimension, tokenize
        self.table = table_name(kb_id, key)

    @classmethod
    def for_index(cls, kb, key: str) -> "PgvectorStore":
        return cls(kb.pk, key, kb.embedding_dimensions, tokenizer_for(kb, key))

    @classmethod
    def check_available(cls) -> None:
        """Raise PgvectorUnavailable with what to set up, unless the store's database has the vector extension."""
        connect()

    @classmethod
    def drop_knowledge_base(cls, kb_id: int) -> None:
        for (table,) in connect().execute(f"SELECT name FROM {REGISTRY} WHERE kb_id = %s", (kb_id,)).fetchall():
            _drop_table(table)

    def apply(self, *, upserts: dict[str, Upsert] | None = None, removals: list[str] | None = None) -> None:
        """See IndexStore.apply: one transaction."""
        rows = [(chunk_id, str(batch.owner), vector, tokens)
                for batch in validated_batches(upserts, self.dimension, self.tokenize)
                for chunk_id, vector, tokens in zip(batch.chunk_ids.tolist(), batch.vectors, batch.tokens)]
        ids = [row[0] for row in rows]
        replaced = sorted(set(removals or ()) | set((upserts or {})))
        if not replaced:
            return
        connection = connect()
        self._create()
        with connection.transaction():
            sums = _Sums.locked(connection, self.table, self.dimension)
            _build_document_frequencies(connection, self.table)
            gone = connection.execute(
                sql.SQL("DELETE FROM {} WHERE owner = ANY(%s) OR chunk_id = ANY(%s) "
                        "RETURNING embedding, length, tsvector_to_array(tokens)")
                .format(sql.Identifier(self.table)), (replaced, ids), binary=True).fetchall()
            documents = Counter()  # lexeme -> change in the rows holding it
            if gone:
                sums.remove(np.array([row[0].to_numpy() for row in gone], np.float32), sum(row[1] for row in gone))
                for row in gone:
                    documents.subtract(row[2])
            if rows:
                with connection.cursor().copy(sql.SQL("COPY {} (chunk_id, owner, embedding, tokens, length) FROM STDIN")
                                              .format(sql.Identifier(self.table))) as copy:
                    for chunk_id, owner, vector, tokens in rows:
                        copy.write_row((chunk_id, owner, _vector_text(vector), _tsvector(tokens), len(tokens)))
                        documents.update(_lexeme_counts(tokens).keys())
                sums.add(np.array([row[2] for row in rows], np.float32), sum(len(row[3]) for row in rows))
            _save_document_frequencies(connection, self.table, documents)
            sums.save(connection, self.table)

    def search_dense(self, vector: np.ndarray, k: int, stats: dict | None = None) -> Hits:
        """See IndexStore.search_dense; the statistics come from the stored sums (module docstring)."""
        query = normalised_query(vector, self.dimension)
        sums = _current_sums(self.table, self.dimension)
        if sums is None or sums.rows == 0 or k < 1:
            return []
        if stats is not None:
            mean = float(query.astype(np.float64) @ sums.vector_sum) / sums.rows
            square = float(query.astype(np.float64) @ sums.gram @ query.astype(np.float64)) / sums.rows
            stats.update(mean=mean, std=float(np.sqrt(max(square - mean * mean, 0.0))), count=sums.rows)
        connection = connect()
        with connection.transaction():
            # The HNSW scan returns at most ef_search rows (40 by default).
            connection.execute(sql.SQL("SET LOCAL hnsw.ef_search = {}").format(sql.Literal(min(1000, max(200, 4 * k)))))
            if not settings.RAG_INDEX_ANN_SEARCH:  # exact: every row scored, as FACTORY_RAG_INDEX_ANN_SEARCH=off says
                connection.execute("SET LOCAL enable_indexscan = off")
            hits = connection.execute(
                sql.SQL("SELECT chunk_id, -(embedding <#> %s) FROM {} ORDER BY embedding <#> %s LIMIT %s")
                .format(sql.Identifier(self.table)), (query, query, k)).fetchall()
        return sorted(((int(chunk_id), float(score)) for chunk_id, score in hits), key=lambda hit: (-hit[1], hit[0]))

    def search_keyword(self, query: str, k: int, stats: dict | None = None) -> Hits:
        """See IndexStore.search_keyword; the statistics are estimated where common tokens' rows were left out
        (module docstring)."""
        if _current_sums(self.table, self.dimension) is None or k < 1:
            return []
        wanted = _lexeme_counts(self.tokenize(query))
        _document_frequencies_ready(self.table)
        connection = connect()
        with connection.transaction():
            # One snapshot: the sums, the document frequencies and the rows are those of the same write.
            connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            sums = _current_sums(self.table, self.dimension)
            if sums is None or sums.total_length == 0:
                return []
            documents = dict(connection.execute(
                sql.SQL("SELECT lexeme, rows FROM {} WHERE lexeme = ANY(%s)")
                .format(sql.Identifier(_frequency_table(self.table))), (list(wanted),)).fetchall()) if wanted else {}
            matched = _candidates(connection, self.table, documents, sums.rows, k) if documents else []
        chunk_ids, scores, held = _bm25(matched, wanted, documents, sums)
        if stats is not None:
            _fill_keyword_stats(stats, scores, held, wanted, documents, sums.rows)
        best_first = np.lexsort((chunk_ids, -scores))[:k]
        return list(zip(chunk_ids[best_first].tolist(), scores[best_first].tolist()))

    def chunk_ids(self, owner: str) -> list[int]:
        if _current_sums(self.table, self.dimension) is None:
            return []
        return [row[0] for row in connect().execute(
            sql.SQL("SELECT chunk_id FROM {} WHERE owner = %s ORDER BY chunk_id").format(sql.Identifier(self.table)),
            (str(owner),))]

    def vectors(self, chunk_ids: list[int]) -> np.ndarray:
        found = {}
        if chunk_ids and _current_sums(self.table, self.dimension) is not None:
            found = dict(connect().execute(
                sql.SQL("SELECT chunk_id, embedding FROM {} WHERE chunk_id = ANY(%s)")
                .format(sql.Identifier(self.table)),
                ([int(chunk_id) for chunk_id in chunk_ids],), binary=True).fetchall())
        missing = [chunk_id for chunk_id in chunk_ids if chunk_id not in found]
        if missing:
            raise KeyError(f"chunk {missing[0]} is not in the index")
        if not chunk_ids:
            return np.empty((0, self.dimension), np.float32)
        return np.array([found[chunk_id].to_numpy() for chunk_id in chunk_ids], np.float32)

    def count(self) -> int:
        sums = _current_sums(self.table, self.dimension)
        return sums.rows if sums else 0

    def generation(self) -> int:
        sums = _current_sums(self.table, self.dimension)
        return sums.generation if sums else 0

    def search_method(self) -> str:
        """"hnsw": dense search goes through the HNSW index (approximate), unless FACTORY_RAG_INDEX_ANN_SEARCH=off."""
        return "hnsw" if settings.RAG_INDEX_ANN_SEARCH else "exact"

    def merge(self, wait: bool = False) -> int:
        """Nothing to merge: Postgres maintains its indexes as rows are written (the embedded store merges segments)."""
        return 0

    def check_writable_here(self) -> None:
        """Every node writes it: the table is shared."""

    def drop(self) -> None:
        """Remove the index (an old key after a re-index switched away from it, or a copy moved elsewhere)."""
        _drop_table(self.table)

    def dump(self) -> IndexDump | None:
        """Every row, by chunk id: Postgres, not the data dir, holds the index."""
        if self.count() == 0:
            return None
        rows = connect().execute(
            sql.SQL("SELECT chunk_id, owner, embedding FROM {} ORDER BY chunk_id").format(sql.Identifier(self.table)),
            binary=True).fetchall()
        return IndexDump(self.table, np.array([row[0] for row in rows], np.int64), np.array([row[1] for row in rows]),
                         np.array([row[2].to_numpy() for row in rows], np.float32))

    def _create(self) -> None:
        if self.dimension > MAX_DIMENSIONS:
            raise PgvectorUnavailable(f"pgvector's HNSW index takes at most {MAX_DIMENSIONS} dimensions; this "
                                      f"embedding model has {self.dimension}: keep this knowledge base embedded.")
        if (conninfo(), self.table) in _CREATED:
            return
        connection = connect()
        table = sql.Identifier(self.table)
        with connection.transaction():
            # Two workers creating the same table at once would collide in the catalogue.
            connection.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.table,))
            if connection.execute("SELECT to_regclass(%s)", (self.table,)).fetchone()[0] is None:
                # New and empty: its document frequencies are all 0 (an older index's are built from its rows).
                connection.execute(sql.SQL(FREQUENCY_TABLE).format(sql.Identifier(_frequency_table(self.table))))
            connection.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (chunk_id bigint PRIMARY KEY, owner text NOT NULL, "
                "embedding vector({}) NOT NULL, tokens tsvector NOT NULL, length integer NOT NULL)"
            ).format(table, sql.Literal(self.dimension)))
            connection.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (owner)").format(
                sql.Identifier(f"{self.table}_owner"), table))
            connection.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} USING hnsw (embedding vector_ip_ops) "
                                       "WITH (m = 16, ef_construction = {})")
                               .format(sql.Identifier(f"{self.table}_embedding"), table,
                                       sql.Literal(HNSW_EF_CONSTRUCTION)))
            connection.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} USING gin (tokens)").format(
                sql.Identifier(f"{self.table}_tokens"), table))
            connection.execute(
                f"INSERT INTO {REGISTRY} (name, kb_id, key, dimension) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (name) DO NOTHING", (self.table, self.kb_id, self.key, self.dimension))
        _CREATED.add((conninfo(), self.table))


def table_name(kb_id: int, key: str) -> str:
    # Keys hold dots and may be long; a hash keeps the name a plain identifier under Postgres's 63 bytes.
    return f"rag_index_{kb_id}_{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _drop_table(name: str) -> None:
    """Remove one index's tables and registry row; nothing happens if it never existed."""
    connection = connect()
    with connection.transaction():
        connection.execute(sql.SQL("DROP TABLE IF EXISTS {}, {}").format(
            sql.Identifier(name), sql.Identifier(_frequency_table(name))))
        connection.execute(f"DELETE FROM {REGISTRY} WHERE name = %s", (name,))
    _SUMS.pop(name, None)
    _CREATED.discard((conninfo(), name))
    _FREQUENCIES_READY.discard((conninfo(), name))


# ---- the sums behind exact z-score statistics ----


class _Sums:
    def __init__(self, dimension: int, generation: int = 0, rows: int = 0, total_length: int = 0,
                 vector_sum: np.ndarray | None = None, gram: np.ndarray | None = None):
        self.dimension, self.generation, self.rows, self.total_length = dimension, generation, rows, total_length
        self.vector_sum = np.zeros(dimension) if vector_sum is None else vector_sum
        self.gram = np.zeros((dimension, dimension)) if gram is None else gram

    @classmethod
    def from_row(cls, row, dimension: int) -> "_Sums":
        generation, rows, total_length, stored_dimension, vector_sum, gram = row
        if stored_dimension != dimension:
            raise ValueError(f"the index holds dimension {stored_dimension}; expected {dimension}.")
        return cls(dimension, generation, rows, total_length,
                   np.frombuffer(vector_sum, np.float64).copy() if vector_sum else None,
                   np.frombuffer(gram, np.float64).reshape(dimension, dimension).copy() if gram else None)

    @classmethod
    def locked(cls, connection, table: str, dimension: int) -> "_Sums":
        row = connection.execute(f"SELECT generation, rows, total_length, dimension, vector_sum, gram FROM {REGISTRY} "
                                 "WHERE name = %s FOR UPDATE", (table,)).fetchone()
        return cls.from_row(row, dimension)

    def add(self, vectors: np.ndarray, length: int) -> None:
        matrix = vectors.astype(np.float64)
        self.rows += len(matrix)
        self.total_length += length
        self.vector_sum += matrix.sum(axis=0)
        self.gram += matrix.T @ matrix

    def remove(self, vectors: np.ndarray, length: int) -> None:
        matrix = vectors.astype(np.float64)
        self.rows -= len(matrix)
        self.total_length -= length
        self.vector_sum -= matrix.sum(axis=0)
        self.gram -= matrix.T @ matrix
        if self.rows == 0:  # no drift left behind by float sums of what was removed
            self.vector_sum[:], self.gram[:] = 0.0, 0.0

    def save(self, connection, table: str) -> None:
        connection.execute(
            f"UPDATE {REGISTRY} SET generation = nextval('{GENERATIONS}'), rows = %s, total_length = %s, "
            "vector_sum = %s, gram = %s WHERE name = %s",
            (self.rows, self.total_length, self.vector_sum.tobytes(), self.gram.tobytes(), table))


_SUMS: dict[str, _Sums] = {}
# (database, table) this process created or found: each write need not ask again.
_CREATED: set[tuple[str, str]] = set()


def _current_sums(table: str, dimension: int) -> _Sums | None:
    """The index's sums as of its latest write (reloaded when the generation moved), None if it does not exist."""
    connection = connect()
    row = connection.execute(f"SELECT generation FROM {REGISTRY} WHERE name = %s", (table,)).fetchone()
    if row is None:
        return None
    cached = _SUMS.get(table)
    if cached is None or cached.generation != row[0]:
        full = connection.execute(f"SELECT generation, rows, total_length, dimension, vector_sum, gram FROM {REGISTRY} "
                                  "WHERE name = %s", (table,)).fetchone()
        if full is None:
            return None
        cached = _SUMS[table] = _Sums.from_row(full, dimension)
    return cached


# ---- document frequencies ----

_FREQUENCIES_READY: set[tuple[str, str]] = set()  # (database, index table) whose frequency table exists


def _frequency_table(table: str) -> str:
    return f"{table}_df"


def _build_document_frequencies(connection: psycopg.Connection, table: str) -> None:
    """In a transaction holding the index's registry row: give an index made by an earlier release, which has no
    document frequency table, one counted from its rows."""
    if (conninfo(), table) in _FREQUENCIES_READY:
        return
    frequencies = sql.Identifier(_frequency_table(table))
    if connection.execute("SELECT to_regclass(%s)", (_frequency_table(table),)).fetchone()[0] is not None:
        _FREQUENCIES_READY.add((conninfo(), table))  # not before: a table made in this transaction may roll back
        return
    connection.execute(sql.SQL(FREQUENCY_TABLE).format(frequencies))
    connection.execute(sql.SQL("INSERT INTO {} SELECT lexeme, count(*) FROM {}, unnest(tsvector_to_array(tokens)) "
                               "AS lexeme GROUP BY lexeme").format(frequencies, sql.Identifier(table)))


def _document_frequencies_ready(table: str) -> None:
    """Make sure the index has its document frequency table, building it (under the writers' lock) if not."""
    if (conninfo(), table) in _FREQUENCIES_READY:
        return
    connection = connect()
    if connection.execute("SELECT to_regclass(%s)", (_frequency_table(table),)).fetchone()[0] is None:
        with connection.transaction():
            connection.execute(f"SELECT 1 FROM {REGISTRY} WHERE name = %s FOR UPDATE", (table,))
            _build_document_frequencies(connection, table)
    _FREQUENCIES_READY.add((conninfo(), table))


def _save_document_frequencies(connection: psycopg.Connection, table: str, changes: Counter) -> None:
    """Add each lexeme's change in rows holding it; a lexeme no row holds any more is removed."""
    changed = {lexeme: change for lexeme, change in changes.items() if change}
    if not changed:
        return
    frequencies = sql.Identifier(_frequency_table(table))
    connection.execute(
        sql.SQL("INSERT INTO {} AS f (lexeme, rows) SELECT * FROM unnest(%s::text[], %s::integer[]) "
                "ON CONFLICT (lexeme) DO UPDATE SET rows = f.rows + excluded.rows").format(frequencies),
        (list(changed), list(changed.values())))
    fewer = [lexeme for lexeme, change in changed.items() if change < 0]
    if fewer:
        connection.execute(sql.SQL("DELETE FROM {} WHERE lexeme = ANY(%s) AND rows <= 0").format(frequencies),
                           (fewer,))


# ---- keyword scoring ----


def _lexeme_counts(tokens: list[str]) -> Counter:
    """Each token a tsvector can hold, with its count."""
    return Counter(token for token in tokens if len(token.encode()) <= MAX_LEXEME_BYTES)


def _selective(documents: dict[str, int], rows: int) -> list[str]:
    """The query's rarest tokens whose rows add up to at most KEYWORD_CANDIDATES: all of them on an index that
    small."""
    if rows <= KEYWORD_CANDIDATES:
        return sorted(documents)
    chosen, total = [], 0
    for lexeme in sorted(documents, key=lambda token: (documents[token], token)):
        total += documents[lexeme]
        if total > KEYWORD_CANDIDATES:
            break
        chosen.append(lexeme)
    return chosen


def _candidates(connection: psycopg.Connection, table: str, documents: dict[str, int], rows: int,
                k: int) -> list[tuple]:
    """(chunk id, length, lexeme, term frequency) of each query token each candidate row holds. The candidates: the
    rows holding a selective token; while fewer than k (and KEYWORD_CANDIDATES), rows holding every other token,
    then rows holding the rarest other one."""
    lexemes = sorted(documents)
    # setweight + ts_filter keep a row's query tokens only, in C: unnesting whole tsvectors costs far more.
    scored = sql.SQL("SELECT c.chunk_id, c.length, t.lexeme, cardinality(t.positions) "
                     "FROM (SELECT chunk_id, length, tokens FROM {} WHERE tokens @@ %s::tsquery LIMIT %s) AS c "
                     "CROSS JOIN LATERAL unnest(ts_filter(setweight(c.tokens, 'A', %s::text[]), '{{a}}')) AS t"
                     ).format(sql.Identifier(table))
    selective = _selective(documents, rows)
    common = sorted(set(lexemes) - set(selective), key=lambda token: (documents[token], token))
    tiers = [" | ".join(map(_quoted, selective))] if selective else []
    if common:
        tiers.append(" & ".join(map(_quoted, common)))
    if len(common) > 1:
        tiers.append(_quoted(common[0]))
    matched, found, taken = [], set(), []
    for tier in tiers:
        if taken and len(found) >= min(k, KEYWORD_CANDIDATES):
            break
        limit = None if selective and not taken else KEYWORD_CANDIDATES - len(found)  # every selective row
        query = " & ".join([f"({tier})", *(f"!({earlier})" for earlier in taken)])
        tier_rows = connection.execute(scored, (query, limit, lexemes)).fetchall()
        matched += tier_rows
        found.update(row[0] for row in tier_rows)
        taken.append(tier)
    return matched


def _idf(documents, rows: int):
    return np.log1p((rows - documents + 0.5) / (documents + 0.5))


def _bm25(matched: list[tuple], wanted: Counter, documents: dict[str, int],
          sums: _Sums) -> tuple[np.ndarray, np.ndarray, dict[str, tuple[int, float]]]:
    """(chunk ids, float32 BM25 scores) of the candidate rows, as the embedded store scores them, and for each query
    token the candidates hold: (how many hold it, the sum of its terms in their scores)."""
    if not matched:
        return np.empty(0, np.int64), np.empty(0, np.float32), {}
    chunk, length, lexeme, frequency = zip(*matched)
    chunk_ids, row = np.unique(np.array(chunk, np.int64), return_inverse=True)
    lexemes, column = np.unique(np.array(lexeme, dtype=object), return_inverse=True)
    idf = _idf(np.array([documents[token] for token in lexemes], np.float64), sums.rows).astype(np.float32)
    mean_length = sums.total_length / sums.rows
    norm = (BM25_K1 * (1 - BM25_B + BM25_B * np.array(length, np.float64) / mean_length)).astype(np.float32)
    frequency = np.array(frequency, np.float32)
    repeats = np.array([wanted[token] for token in lexemes], np.float32)  # a repeated query token counts again
    terms = repeats[column] * idf[column] * frequency / (frequency + norm)
    held = dict(zip(lexemes.tolist(), zip(np.bincount(column, minlength=len(lexemes)).tolist(),
                                          np.bincount(column, weights=terms, minlength=len(lexemes)).tolist())))
    return chunk_ids, np.bincount(row, weights=terms, minlength=len(chunk_ids)).astype(np.float32), held


def _fill_keyword_stats(stats: dict, scores: np.ndarray, held: dict[str, tuple[int, float]], wanted: Counter,
                        documents: dict[str, int], rows: int) -> None:
    """Mean and spread of the BM25 score over every row, and how many rows match: exact when every row holding a
    query token was scored. Rows holding a token but left out (a common token) are estimated from the document
    frequencies: each such row gets the token's mean term among the scored rows holding it (tf 1 at the mean
    length if none does), and tokens fall on the unscored rows independently."""
    scored = len(scores)
    total, square = float(scores.sum(dtype=np.float64)), float(np.square(scores, dtype=np.float64).sum())
    unscored = []  # (rows, estimated term) per token
    for lexeme, holding in documents.items():
        count, term_sum = held.get(lexeme, (0, 0.0))
        if holding > count and rows > scored:
            term = term_sum / count if count else wanted[lexeme] * float(_idf(holding, rows)) / (1 + BM25_K1)
            unscored.append((holding - count, term))
    rest, none_held = rows - scored, 1.0
    for at, (count, term) in enumerate(unscored):
        total += count * term
        square += count * term * term + sum(2 * term * other_term * count * other_count / rest
                                            for other_count, other_term in unscored[at + 1:])
        none_held *= 1 - count / rest
    mean = total / rows
    stats.update(mean=mean, std=float(np.sqrt(max(square / rows - mean * mean, 0.0))), count=rows,
                 matches=scored + round(rest * (1 - none_held)))


def _vector_text(vector: np.ndarray) -> str:
    # pgvector's own dumper converts element by element (1 ms a 384-d vector); tolist() is 5x faster, and a float32
    # read back from its float64 repr is exact.
    return "[" + ",".join(map(repr, vector.tolist())) + "]"


def _quoted(token: str) -> str:
    return "'" + token.replace("\\", "\\\\").replace("'", "''") + "'"


def _tsvector(tokens: list[str]) -> str:
    """A tsvector literal of the tokens as they are, each with positions 1..count (its term frequency)."""
    counts = _lexeme_counts(tokens)
    return " ".join(f"{_quoted(token)}:{','.join(map(str, range(1, min(count, MAX_POSITIONS) + 1)))}"
                    for token, count in counts.items())


# ---- the connection: one per process and thread ----

_CONNECTIONS: dict[tuple[int, int, str], psycopg.Connection] = {}
_CONNECTIONS_LOCK = threading.Lock()


def conninfo() -> str:
    """Where the store lives: FACTORY_RAG_PGVECTOR_URL, else the default database when it is Postgres."""
    if settings.RAG_PGVECTOR_URL:
        return settings.RAG_PGVECTOR_URL
    database = settings.DATABASES["default"]
    if database["ENGINE"] != "django.db.backends.postgresql":
        raise PgvectorUnavailable(
            "The pgvector index backend needs Postgres with the vector extension, and the database is "
            f"{database['ENGINE'].rsplit('.', 1)[-1]}: set DATABASE_URL (or FACTORY_RAG_PGVECTOR_URL) to a Postgres "
            f"database, then {INSTALL_HINT.format(major='NN')}.")
    django_only = {"pool", "server_side_binding", "isolation_level", "assume_role", "cursor_factory", "context"}
    options = {key: value for key, value in database.get("OPTIONS", {}).items() if key not in django_only}
    parts = {"dbname": database["NAME"], "user": database.get("USER"), "password": database.get("PASSWORD"),
             "host": database.get("HOST"), "port": database.get("PORT"), **options}
    return psycopg.conninfo.make_conninfo(**{key: str(value) for key, value in parts.items() if value})


def connect() -> psycopg.Connection:
    # Celery forks its pool processes: a connection opened before the fork must not be used after it.
    where = conninfo()
    slot = (os.getpid(), threading.get_ident(), where)
    connection = _CONNECTIONS.get(slot)
    if connection is not None and not connection.closed and not connection.broken:
        return connection
    connection = psycopg.connect(where, autocommit=True)
    _prepare(connection)
    with _CONNECTIONS_LOCK:
        _CONNECTIONS[slot] = connection
    return connection


def _prepare(connection: psycopg.Connection) -> None:
    """Make sure of the vector extension and the registry table, then teach psycopg the vector type."""
    installed = connection.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone()
    if installed is None:
        try:
            connection.execute("CREATE EXTENSION IF NOT EXISTS vector")
        except psycopg.Error as exc:
            major, database = connection.info.server_version // 10000, connection.info.dbname
            connection.close()
            raise PgvectorUnavailable(
                f"The pgvector index backend needs the Postgres extension `vector` in database "
                f"{database!r}, which could not be created ({str(exc).strip().splitlines()[0]}): "
                f"{INSTALL_HINT.format(major=major)}.") from exc
    register_vector(connection)
    with connection.transaction():
        connection.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (REGISTRY,))
        connection.execute(
            f"CREATE TABLE IF NOT EXISTS {REGISTRY} (name text PRIMARY KEY, kb_id bigint NOT NULL, key text NOT NULL, "
            "dimension integer NOT NULL, generation bigint NOT NULL DEFAULT 0, rows bigint NOT NULL DEFAULT 0, "
            "total_length bigint NOT NULL DEFAULT 0, vector_sum bytea, gram bytea)")
        connection.execute(f"CREATE SEQUENCE IF NOT EXISTS {GENERATIONS}")
