"""Combine dense and keyword hits into one ranking whose scores can be explained to a user.

Per-retriever scores shown on each hit, in [0, 1], for display (and for the "max" normalisation below):
  dense:   the cosine similarity, clamped to [0, 1] (a negative cosine means unrelated: 0);
  keyword: the BM25 score divided by this query's best BM25 score, so the best keyword hit is 1.0 and the
           others say how close they came to it.
Fusion:
  weighted: a weighted mean of the two lists' scores, normalised one of three ways (`normalisation`):
            zscore_candidates (the default): as zscore below, with each side's mean and spread taken over its own
              candidates (the lists given) rather than the whole index. Keyword scores over the whole index are
              mostly 0, so any match stood many spreads out and keyword search outweighed dense search whenever it
              matched at all; among the candidates both sides stand out in like units. On bench.rag_quality's man
              pages (hit@5, English / Chinese) it found 0.983 / 0.983 against zscore's 0.917 / 0.950, and 0.875
              against 0.850 on the Python docs; it gave up one of 28 Chinese questions where an English-only model
              read Chinese (0.964 against 1.000), the case zscore was made for.
            zscore: each side's raw score as standard deviations above the mean score of every
              chunk in the index for this query (z = (score - mean) / std; index_store gives the statistics,
              else they come from the lists themselves), fused = Phi((dense_weight * z_dense + keyword_weight *
              z_keyword) / (dense_weight + keyword_weight)), Phi the standard normal CDF, so fused is in [0, 1]
              ("outscores that share of the index", 0.5 = an average chunk) and the ranking is by the weighted z.
              A hit missing from one list takes that list's lowest fetched score there (it scored at most that),
              or a BM25 of 0 when the keyword list holds every match. Why: cosines of one embedding model crowd
              into a narrow band (multilingual-e5: 0.82-0.89 over a whole knowledge base) while BM25 / best spans
              0-1, so under "max" the keyword side decided alone; z-scores put both sides in units of how far a
              hit stands out from the rest, and a side that cannot tell chunks apart (an English-only model
              reading Chinese) stands nothing out and moves little.
            max: fused = (dense_weight * dense + keyword_weight * keyword) / (dense_weight + keyword_weight), the
              display scores above, a hit missing from a list counting 0 there (the behaviour before z-scores).
            When only one list has hits (dense-only or keyword-only retrieval, or a query with no keyword match),
            fused is that list's score: the weights only apportion between two lists that both have hits (both 0
            is an error only then).
  rrf:      fused = sum over the lists holding the hit of 1 / (rrf_k + rank), rank starting at 1, divided by
            its largest possible value (lists with hits / (rrf_k + 1)): 1.0 is first in every list, so a score
            threshold (0-1) means the same as with weighted fusion instead of dropping every RRF hit (raw RRF
            sums stay under 2 / (rrf_k + 1), 0.033 at k=60). The normalised scores are filled in for display.
max_per_document: with a chunk -> document mapping, at most that many hits of one document are kept (0: no cap),
after fusion and before top_k is cut, so lower-ranked chunks of other documents move up.
Ties are broken by chunk id so the same inputs always give the same order.
"""

import math
from dataclasses import dataclass

FUSION_METHODS = ("weighted", "rrf")
NORMALISATIONS = ("zscore_candidates", "zscore", "max")
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
         normalisation: str = "zscore_candidates", dense_weight: float = 0.5, keyword_weight: float = 0.5,
         rrf_k: int = RRF_K, top_k: int = 10, dense_stats: dict | None = None, keyword_stats: dict | None = None,
         document_of: dict[int, int] | None = None, max_per_document: int = 0) -> list[ScoredHit]:
    """The top_k hits of (chunk id, score) lists given best first; see the module docstring for the maths.
    dense_stats / keyword_stats: {"mean", "std"[, "matches"]} of the query's scores over the whole index."""
    _validate(method, normalisation, dense_weight, keyword_weight, rrf_k, top_k, max_per_document)
    dense_raw, keyword_raw = _first_scores(dense), _first_scores(keyword)
    dense_norm = {chunk_id: _clamp(score) for chunk_id, score in dense_raw.items()}
    best_keyword = max(keyword_raw.values(), default=0.0)
    keyword_norm = {chunk_id: _clamp(score / best_keyword) if best_keyword > 0 else 0.0
                    for chunk_id, score in keyword_raw.items()}
    if method == "rrf":
        fused = _reciprocal_rank(dense_raw, keyword_raw, rrf_k)
        order = fused
    elif normalisation in ("zscore", "zscore_candidates"):
        if normalisation == "zscore_candidates":
            dense_stats = keyword_stats = None  # each list's own
        order = _weighted_z(dense_raw, keyword_raw, dense_stats, keyword_stats, dense_weight, keyword_weight)
        fused = {chunk_id: _normal_cdf(z) for chunk_id, z in order.items()}
    else:
        fused = _weighted(dense_norm, keyword_norm, dense_weight, keyword_weight)
        order = fused
    ranked = sorted(fused, key=lambda chunk_id: (-order[chunk_id], chunk_id))
    if max_per_document and document_of:
        ranked = _cap_per_document(ranked, document_of, max_per_document)
    return [ScoredHit(chunk_id=chunk_id, dense=dense_norm.get(chunk_id), keyword=keyword_norm.get(chunk_id),
                      fused=fused[chunk_id], dense_raw=dense_raw.get(chunk_id), keyword_raw=keyword_raw.get(chunk_id))
            for chunk_id in ranked[:top_k]]


def _validate(method: str, normalisation: str, dense_weight: float, keyword_weight: float, rrf_k: int, top_k: int,
              max_per_document: int) -> None:
    if method not in FUSION_METHODS:
        raise ValueError(f"method must be one of {', '.join(FUSION_METHODS)}, not {method!r}.")
    if normalisation not in NORMALISATIONS:
        raise ValueError(f"normalisation must be one of {', '.join(NORMALISATIONS)}, not {normalisation!r}.")
    for field, value in (("dense_weight", dense_weight), ("keyword_weight", keyword_weight)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{field} must be a finite number >= 0, not {value!r}.")
    for field, value, low in (("rrf_k", rrf_k, 0), ("top_k", top_k, 1), ("max_per_document", max_per_document, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{field} must be an integer >= {low}, not {value!r}.")


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


def _z_scores(raw: dict[int, float], stats: dict | None) -> tuple[dict[int, float], float]:
    """Each hit's z-score, and the z a chunk missing from the list is given: the lowest fetched score's, or a
    score of 0 when `stats` says the list holds every match (a keyword list: the rest scored 0)."""
    if stats is None:  # no index statistics: the list's own
        values = list(raw.values())
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    else:
        mean, std = float(stats["mean"]), float(stats["std"])
    std = std if std > 1e-12 else 1.0  # every chunk scored the same: z is 0 for all of them

    def z(score: float) -> float:
        return (score - mean) / std

    missing = min(raw.values())
    if stats is not None and "matches" in stats and stats["matches"] <= len(raw):
        missing = 0.0
    return {chunk_id: z(score) for chunk_id, score in raw.items()}, z(missing)


def _weighted_z(dense: dict[int, float], keyword: dict[int, float], dense_stats: dict | None,
                keyword_stats: dict | None, dense_weight: float, keyword_weight: float) -> dict[int, float]:
    if not dense or not keyword:
        raw, stats = (dense, dense_stats) if dense else (keyword, keyword_stats)
        return _z_scores(raw, stats)[0] if raw else {}
    total = dense_weight + keyword_weight
    if total == 0:
        raise ValueError("dense_weight and keyword_weight cannot both be 0.")
    (dense_z, dense_missing), (keyword_z, keyword_missing) = (_z_scores(dense, dense_stats),
                                                              _z_scores(keyword, keyword_stats))
    return {chunk_id: (dense_weight * dense_z.get(chunk_id, dense_missing)
                       + keyword_weight * keyword_z.get(chunk_id, keyword_missing)) / total
            for chunk_id in {**dense, **keyword}}


def _cap_per_document(ranked: list[int], document_of: dict[int, int], cap: int) -> list[int]:
    kept, counts = [], {}
    for chunk_id in ranked:
        document = document_of.get(chunk_id)
        if document is not None:
            if counts.get(document, 0) >= cap:
                continue
            counts[document] = counts.get(document, 0) + 1
        kept.append(chunk_id)
    return kept


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


def _normal_cdf(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def _clamp(score: float) -> float:
    return min(1.0, max(0.0, score))
