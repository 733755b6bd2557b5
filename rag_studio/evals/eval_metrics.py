"""Retrieval and answer quality metrics, as pure functions.

Answer metrics follow SQuAD (exact match and bag-of-tokens F1) with Chinese handled the usual way: each CJK
character is a token, so no word segmenter decides the score.

Retrieval metrics take `retrieved`, ids (chunk ids or document names) in rank order, and `relevant`, the set of ids
that count as correct. An empty `relevant` set makes every retrieval metric 0.0: there is nothing to find, and the
caller should leave such items out of averages rather than count them as failures.
"""

import math
import re

# CJK ideographs (with extensions A-F and compatibility ideographs) and Japanese kana.
CJK_CHARACTER = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ebef"
# A single CJK character, or a run of other letters and digits; punctuation, whitespace and "_" separate tokens.
OVERLAP_TOKEN = re.compile(rf"[{CJK_CHARACTER}]|(?:(?![{CJK_CHARACTER}])[^\W_])+")
ARTICLES = {"a", "an", "the"}


def tokenize_for_overlap(text: str) -> list[str]:
    """Lowercased tokens: each CJK character on its own, other words and numbers whole, punctuation dropped.

    Punctuation splits words ("state-of-the-art" gives four tokens) rather than being deleted as in SQuAD's script,
    so hyphenated and slashed terms earn partial credit and full-width Chinese punctuation is treated like ASCII.
    """
    return OVERLAP_TOKEN.findall(text.lower())


def _answer_tokens(text: str) -> list[str]:
    return [token for token in tokenize_for_overlap(text) if token not in ARTICLES]


def exact_match(prediction: str, reference: str) -> float:
    """1.0 when both normalise to the same tokens (lowercase, no punctuation or articles, whitespace ignored)."""
    return float(_answer_tokens(prediction) == _answer_tokens(reference))


def token_f1(prediction: str, reference: str) -> float:
    """SQuAD F1 over bags of tokens; two empty answers score 1.0, one empty answer 0.0 (SQuAD 2.0's rule)."""
    predicted, expected = _answer_tokens(prediction), _answer_tokens(reference)
    if not predicted or not expected:
        return float(predicted == expected)
    common = sum(min(predicted.count(token), expected.count(token)) for token in set(predicted))
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


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
