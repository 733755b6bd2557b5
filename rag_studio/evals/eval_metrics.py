"""Retrieval and answer quality metrics, as pure functions.

Answer metrics follow SQuAD (exact match and bag-of-tokens F1) with Chinese handled the usual way: each CJK
character is a token, so no word segmenter decides the score.

Retrieval metrics take `retrieved`, ids (chunk ids or document names) in rank order, and `relevant`, the set of ids
that count as correct. An empty `relevant` set makes every retrieval metric 0.0: there is nothing to find, and the
caller should leave such items out of averages rather than count them as failures.
"""

import math

# The answer metrics are serving's, one definition for calibration and RAG evaluation.
from serving.groups.scoring import exact_match, token_f1, tokenize_for_overlap  # noqa: F401


def hit_at_k(retrieved: list[str], relevant: set[str], k: int) -> float:
    """1.0 when any of the top k is relevant."""
    _require_positive_k(k)
    return float(any(item in relevant for item in retrieved[:k]))


def recall_at_k(retrieved: list[str], relevant: set[str], k: int) -> float:
    """Share of the relevant ids found in the top k."""
    _require_positive_k(k)
    if not relevant:
        return 0.0
    return len(relevant.intersection(retrieved[:k])) / len(relevant)


def reciprocal_rank(retrieved: list[str], relevant: set[str]) -> float:
    """1 / rank of the first relevant id (ranks start at 1); 0.0 when none is retrieved."""
    for rank, item in enumerate(retrieved, start=1):
        if item in relevant:
            return 1 / rank
    return 0.0


def ndcg_at_k(retrieved: list[str], relevant: set[str], k: int) -> float:
    """Normalised DCG of the top k with binary relevance.

    A relevant id retrieved again (several chunks of one expected document) still takes up its rank but gains
    nothing, so repeating a hit cannot raise the score.
    """
    _require_positive_k(k)
    if not relevant:
        return 0.0
    credited: set[str] = set()
    dcg = 0.0
    for rank, item in enumerate(retrieved[:k], start=1):
        if item in relevant and item not in credited:
            credited.add(item)
            dcg += 1 / math.log2(rank + 1)
    ideal = sum(1 / math.log2(rank + 1) for rank in range(1, min(len(relevant), k) + 1))
    return dcg / ideal


def _require_positive_k(k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be at least 1; got {k}")
