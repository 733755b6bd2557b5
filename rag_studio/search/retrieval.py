"""Dense, keyword and hybrid search over a knowledge base, with optional rerank. Every hit carries each score
that led to its rank, which is what hit testing shows."""

import math
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import lru_cache

from accounts.errors import ValidationFailed
from rag_studio.embedding import Embedder
from rag_studio.gateway_client import openai_client
from rag_studio.models import Chunk, KnowledgeBase
from rag_studio.search.fusion import fuse
from rag_studio.search.retrieval_config import validate_retrieval
from rag_studio.search.stores import store_for
from serving.selectors import models_visible_to

MAX_QUERY_CHARS = 2000
LLM_RERANK_PROMPT = (
    "Rate how well the passage answers the question, from 0 (unrelated) to 10 (answers it fully). "
    "Reply with the number only.\n\nQuestion: {question}\n\nPassage: {passage}\n\nRating:"
)


@dataclass
class Hit:
    chunk_id: int
    document_id: int
    filename: str
    text: str
    page: int | None
    start: int
    end: int
    heading: str
    parent_id: int | None
    dense: float | None
    keyword: float | None
    fused: float
    dense_raw: float | None
    keyword_raw: float | None
    rerank: float | None = None
    rank: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Retrieval:
    query: str
    settings: dict
    hits: list[Hit]
    timings_ms: dict = field(default_factory=dict)
    rerank_unparseable: int = 0


def retrieve(kb: KnowledgeBase, query: str, overrides: dict | None = None) -> Retrieval:
    query = (query or "").strip()
    if not query:
        raise ValidationFailed("The query is empty.", fields={"query": ["The query is empty."]})
    if len(query) > MAX_QUERY_CHARS:
        raise ValidationFailed(f"The query is {len(query)} characters; the limit is {MAX_QUERY_CHARS}.",
                               fields={"query": ["too long"]})
    try:
        config = validate_retrieval({**kb.retrieval, **(overrides or {})})
    except ValueError as exc:
        raise ValidationFailed(str(exc), fields={"retrieval": [str(exc)]})
    timings, started = {}, time.perf_counter()
    store = store_for(kb)
    candidates = max(config["candidates"], config["top_k"], config["rerank"]["top_k"])
    dense, keyword, rows = [], [], {}
    # Each side's mean and spread over the whole index: only z-scores over the index read them, so only they are
    # worked out (pgvector estimates the keyword side's from its frequency table).
    over_index = config["fusion"] == "weighted" and config["normalisation"] == "zscore"
    dense_stats, keyword_stats = ({}, {}) if over_index else (None, None)
    # The query embeds on the model's own thread while this one searches the keyword index and loads those hits'
    # rows: torch, numpy and SQLite all let go of the GIL, so the two overlap on two cores.
    embedding = Embedder.for_knowledge_base(kb).embed_soon([query]) if config["mode"] != "keyword" else None
    if config["mode"] in ("keyword", "hybrid"):
        mark = time.perf_counter()
        keyword = store.search_keyword(query, candidates, keyword_stats)
        timings["keyword"] = _ms(mark)
        mark = time.perf_counter()
        rows = _hit_rows(kb, [chunk_id for chunk_id, _ in keyword])
        timings["hydrate"] = _ms(mark)
    if embedding is not None:
        vector = embedding.result()[0]
        timings["embed"] = _ms(started)  # until the vector was there, keyword work alongside included
        mark = time.perf_counter()
        dense = store.search_dense(vector, candidates, dense_stats)
        timings["dense"] = _ms(mark)
    mark = time.perf_counter()
    # Every candidate's row before fusing: max_per_document needs each one's document.
    rows.update(_hit_rows(kb, [chunk_id for chunk_id, _ in dense if chunk_id not in rows]))
    scored = fuse(dense, keyword, method=config["fusion"], normalisation=config["normalisation"],
                  dense_weight=config["dense_weight"], keyword_weight=config["keyword_weight"],
                  rrf_k=config["rrf_k"], top_k=candidates, dense_stats=dense_stats or None,
                  keyword_stats=keyword_stats or None, max_per_document=config["max_per_document"],
                  document_of={chunk_id: row["document_id"] for chunk_id, row in rows.items()})
    hits = [h for h in _hydrate(kb, scored, rows) if h.fused >= config["score_threshold"]]
    timings["fuse"] = _ms(mark)
    result = Retrieval(query=query, settings=config, hits=hits, timings_ms=timings)
    if config["rerank"]["kind"] != "none":
        mark = time.perf_counter()
        _rerank(kb, result)
        timings["rerank"] = _ms(mark)
    else:
        result.hits = hits[:config["top_k"]]
    for rank, hit in enumerate(result.hits, start=1):
        hit.rank = rank
    timings["total"] = _ms(started)
    return result


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 2)


# Only the columns a hit shows, parent's included: the query runs on every search, and a full Chunk with its
# document and parent cost more to build than the search itself.
HIT_COLUMNS = ("id", "knowledge_base_id", "document_id", "document__filename", "parent_id", "text", "page", "start",
               "end", "heading", "parent__text", "parent__page", "parent__start", "parent__end", "parent__heading")


def _hit_rows(kb: KnowledgeBase, chunk_ids: list[int]) -> dict[int, dict]:
    if not chunk_ids:
        return {}
    return {row["id"]: row for row in Chunk.objects.filter(pk__in=chunk_ids).order_by().values(*HIT_COLUMNS)}


def _hydrate(kb: KnowledgeBase, scored, rows: dict[int, dict]) -> list[Hit]:
    """Attach chunk text and location from `rows`; a child chunk returns its parent's text, once per parent."""
    hits, seen_parents = [], set()
    for score in scored:
        row = rows.get(score.chunk_id)
        if row is None or row["knowledge_base_id"] != kb.pk:
            continue  # its document was deleted after the index was read
        parent_id = row["parent_id"]
        if parent_id is not None:
            if parent_id in seen_parents:
                continue
            seen_parents.add(parent_id)
        shown = "" if parent_id is None else "parent__"
        hits.append(Hit(
            chunk_id=row["id"], document_id=row["document_id"], filename=row["document__filename"],
            text=row[f"{shown}text"], page=row[f"{shown}page"], start=row[f"{shown}start"], end=row[f"{shown}end"],
            heading=row[f"{shown}heading"] or row["heading"], parent_id=parent_id, dense=score.dense,
            keyword=score.keyword, fused=round(score.fused, 6), dense_raw=score.dense_raw,
            keyword_raw=score.keyword_raw))
    return hits


def _rerank(kb: KnowledgeBase, result: Retrieval) -> None:
    rerank = result.settings["rerank"]
    if rerank["kind"] == "cross_encoder":
        scores = _cross_encoder_scores(kb, rerank["model"], result.query, [h.text for h in result.hits])
    else:
        scores = _llm_scores(kb, rerank["model"], result.query, [h.text for h in result.hits])
        result.rerank_unparseable = sum(s is None for s in scores)
    for hit, score in zip(result.hits, scores):
        hit.rerank = None if score is None else round(float(score), 6)
    kept = [h for h in result.hits if h.rerank is not None and h.rerank >= rerank["threshold"]]
    kept.sort(key=lambda h: (-h.rerank, -h.fused, h.chunk_id))
    result.hits = kept[:rerank["top_k"]]


@lru_cache(maxsize=2)
def _cross_encoder(path: str):
    from sentence_transformers import CrossEncoder

    return CrossEncoder(path, device="cpu")


def _cross_encoder_scores(kb: KnowledgeBase, name: str, query: str, passages: list[str]) -> list[float]:
    model = models_visible_to(workspace=kb.workspace_id).filter(name=name).first()
    if model is None or not model.path:
        raise ValidationFailed(f"No local cross-encoder model named '{name}' is registered.",
                               fields={"rerank": ["unknown model"]})
    if not passages:
        return []
    scores = _cross_encoder(model.path).predict([(query, p) for p in passages], convert_to_numpy=True)
    # Cross-encoders without a sigmoid head return logits; squash them so thresholds mean the same everywhere.
    return [s if 0.0 <= s <= 1.0 else 1 / (1 + math.exp(-s)) for s in scores.tolist()]


def _llm_scores(kb: KnowledgeBase, model: str, query: str, passages: list[str]) -> list[float | None]:
    client = openai_client(kb.workspace_id)

    def score(passage: str) -> float | None:
        reply = client.chat.completions.create(
            model=model, max_tokens=4, temperature=0,
            messages=[{"role": "user", "content": LLM_RERANK_PROMPT.format(question=query, passage=passage[:1500])}])
        return parse_rating(reply.choices[0].message.content or "")

    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(score, passages))


def parse_rating(text: str) -> float | None:
    """The first number 0–10 in a model's reply, as a share of 10; None when there is none."""
    match = re.search(r"\d+(?:\.\d+)?", text)
    if match is None or float(match.group()) > 10:
        return None
    return float(match.group()) / 10
