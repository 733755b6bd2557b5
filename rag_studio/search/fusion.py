"""Combine dense and keyword hits into one ranking whose scores can be explained to a user.

Each retriever's score is normalised to [0, 1] on its own, in a way that does not depend on the worst hit:
  dense:   the cosine similarity, clamped to [0, 1] (a negative cosine means unrelated: 0);
  keyword: the BM25 score divided by this query's best BM25 score, so the best keyword hit is 1.0 and the
           others say how close they came to it.
Fusion:
  weighted: fused = (dense_weight * dense + keyword_weight * keyword) / (dense_weight + keyword_weight),
            a hit missing from a list counting 0 there. When only one list has hits (dense-only or
            keyword-only retrieval, or a query with no keyword match), fused is that list's score: the
            weights only apportion between two lists that both have hits (both 0 is an error only then).
  rrf:      fused = sum over the lists holding the hit of 1 / (rrf_k + rank), rank starting at 1, divided by
            its largest possible value (lists with hits / (rrf_k + 1)): 1.0 is first in every list, so a score
            threshold (0-1) means the same as with weighted fusion instead of dropping every RRF hit (raw RRF
            sums stay under 2 / (rrf_k + 1), 0.033 at k=60). The normalised scores are filled in for display.
Ties are broken by chunk id so the same inputs always give the same order.
"""

import math
from dataclasses import dataclass

FUSION_METHODS = ("weighted", "rrf")
RRF_K = 60


@dataclass
class ScoredHit:
    chunk_id: int
    dense: float | None  # normalised dense score in [0, 1]; None when not among the dense hits
    keyword: float | None  # normalised keyword score in [0, 1]; None when not among the keyword hits
    fused: float
    dense_raw: float | None  # cosine similarity
    keyword_raw: float | None  # raw BM25 score


def fuse(dense: list[tuple[int, float]], keyword: list[tuple[int, float]], *, method: str = "weighted",
         dense_weight: float = 0.7, keyword_weight: float = 0.3, rrf_k: int = RRF_K,
         top_k: int = 10) -> list[ScoredHit]:
    """The top_k hits of (chunk id, score) lists given best first; see the module docstring for the maths."""
    _validate(method, dense_weight, keyword_weight, rrf_k, top_k)
    dense_raw, keyword_raw = _first_scores(dense), _first_scores(keyword)
    dense_norm = {chunk_id: _clamp(score) for chunk_id, score in dense_raw.items()}
    best_keyword = max(keyword_raw.values(), default=0.0)
    keyword_norm = {chunk_id: _clamp(score / best_keyword) if best_keyword > 0 else 0.0
                    for chunk_id, score in keyword_raw.items()}
    if method == "rrf":
        fused = _reciprocal_rank(dense_raw, keyword_raw, rrf_k)
    else:
        fused = _weighted(dense_norm, keyword_norm, dense_weight, keyword_weight)
    hits = [ScoredHit(chunk_id=chunk_id, dense=dense_norm.get(chunk_id), keyword=keyword_norm.get(chunk_id),
                      fused=score, dense_raw=dense_raw.get(chunk_id), keyword_raw=keyword_raw.get(chunk_id))
            for chunk_id, score in fused.items()]
    hits.sort(key=lambda hit: (-hit.fused, hit.chunk_id))
    return hits[:top_k]


def _validate(method: str, dense_weight: float, keyword_weight: float, rrf_k: int, top_k: int) -> None:
    if method not in FUSION_METHODS:
        raise ValueError(f"method must be one of {', '.join(FUSION_METHODS)}, not {method!r}.")
    for field, value in (("dense_weight", dense_weight), ("keyword_weight", keyword_weight)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{field} must be a finite number >= 0, not {value!r}.")
    if isinstance(rrf_k, bool) or not isinstance(rrf_k, int) or rrf_k < 0:
        raise ValueError(f"rrf_k must be an integer >= 0, not {rrf_k!r}.")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be an integer >= 1, not {top_k!r}.")


def _first_scores(hits: list[tuple[int, float]]) -> dict[int, float]:
    """chunk id -> score in list order, keeping a chunk's first (best) occurrence should a list repeat it."""
    scores: dict[int, float] = {}
    for chunk_id, score in hits:
        scores.setdefault(int(chunk_id), float(score))
    return scores


def _weighted(dense: dict[int, float], keyword: dict[int, float], dense_weight: float,
              keyword_weight: float) -> dict[int, float]:
    if not dense or not keyword:
        return {**dense, **keyword}  # one list (or none): its own scores; weights apportion between two lists
    total = dense_weight + keyword_weight
    if total == 0:
        raise ValueError("dense_weight and keyword_weight cannot both be 0.")
    return {chunk_id: (dense_weight * dense.get(chunk_id, 0.0) + keyword_weight * keyword.get(chunk_id, 0.0)) / total
            for chunk_id in {**dense, **keyword}}


def reciprocal_rank_scores(rankings, rrf_k: int = RRF_K) -> dict:
    """Reciprocal-rank fusion, defined once: each key's sum, over the rankings (each an iterable of keys, best
    first) that hold it, of 1 / (rrf_k + rank), rank starting at 1. Hybrid retrieval fuses its dense and keyword
    lists with it, multi-query RAG the hit lists of its queries."""
    fused: dict = {}
    for ranked in rankings:
        for rank, key in enumerate(ranked, start=1):
            fused[key] = fused.get(key, 0.0) + 1.0 / (rrf_k + rank)
    return fused


def _reciprocal_rank(dense: dict[int, float], keyword: dict[int, float], rrf_k: int) -> dict[int, float]:
    fused = reciprocal_rank_scores((dense, keyword), rrf_k)  # dicts keep list order: best first
    best_possible = sum(1 for ranked in (dense, keyword) if ranked) / (rrf_k + 1)
    return {chunk_id: score / best_possible for chunk_id, score in fused.items()}


def _clamp(score: float) -> float:
    return min(1.0, max(0.0, score))
