"""Retrieval settings, stored on a knowledge base (its defaults) and on a RAG config (which may override them).

Fusion settings (rag_studio.search.fusion has the maths): fusion "weighted" or "rrf"; normalisation
"zscore_candidates" (the default), "zscore" or "max" for weighted fusion; dense_weight and keyword_weight 0-1; rrf_k
1-200 (RRF's rank offset: larger flattens the difference between ranks); max_per_document 0-50, at most that many
hits of one document in the final list (0: no cap), applied after fusion and before top_k or rerank's input is cut.

DEFAULT_RETRIEVAL's fusion, on bench.rag_quality (hit@5 / MRR): z-scores with equal weights hold one default at least
as good as the better of dense and keyword alone on the English docs (MiniLM) and the Chinese samples on MiniLM and on
multilingual-e5, where the former default (clamped cosine and BM25 / best, 0.7/0.3) lost MRR to one half on both
Chinese sets: its keyword top hit always took the full keyword weight while e5's cosines differ by hundredths. Its
z-scores are now taken among each side's candidates (issue 34): over the whole index keyword search still outweighed
dense search, below dense alone on the man pages of bench.rag_quality (fusion.py has the figures).
"""

import copy

from rag_studio.search.fusion import FUSION_METHODS, NORMALISATIONS

RETRIEVAL_MODES = ("dense", "keyword", "hybrid")
RERANK_KINDS = ("none", "cross_encoder", "llm")
DEFAULT_RETRIEVAL = {
    "mode": "hybrid",
    "top_k": 5,
    "candidates": 30,
    "fusion": "weighted",
    "normalisation": "zscore_candidates",
    "dense_weight": 0.5,
    "keyword_weight": 0.5,
    "rrf_k": 60,
    "max_per_document": 0,
    "score_threshold": 0.0,
    "rerank": {"kind": "none", "model": "", "top_k": 5, "threshold": 0.0},
}


def _number(config: dict, field: str, kind, low, high):
    value = config[field]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and int(value) != value):
        raise ValueError(f"{field} must be {'an integer' if kind is int else 'a number'}, not {value!r}.")
    if not low <= value <= high:
        raise ValueError(f"{field} must be between {low} and {high}, not {value}.")
    return kind(value)


def validate_retrieval(config: dict | None) -> dict:
    """Defaults filled in; a ValueError names the first bad field."""
    if config is not None and not isinstance(config, dict):
        raise ValueError("retrieval settings must be an object.")
    merged = copy.deepcopy(DEFAULT_RETRIEVAL)
    for key, value in (config or {}).items():
        if key not in merged:
            raise ValueError(f"Unknown retrieval setting '{key}'. Known: {', '.join(DEFAULT_RETRIEVAL)}.")
        if key == "rerank":
            if not isinstance(value, dict):
                raise ValueError("rerank must be an object.")
            unknown = set(value) - set(merged["rerank"])
            if unknown:
                raise ValueError(f"Unknown rerank setting '{sorted(unknown)[0]}'.")
            merged["rerank"].update(value)
        else:
            merged[key] = value
    if merged["mode"] not in RETRIEVAL_MODES:
        raise ValueError(f"mode must be one of {', '.join(RETRIEVAL_MODES)}, not {merged['mode']!r}.")
    if merged["fusion"] not in FUSION_METHODS:
        raise ValueError(f"fusion must be one of {', '.join(FUSION_METHODS)}, not {merged['fusion']!r}.")
    if merged["normalisation"] not in NORMALISATIONS:
        raise ValueError(f"normalisation must be one of {', '.join(NORMALISATIONS)}, not {merged['normalisation']!r}.")
    merged["top_k"] = _number(merged, "top_k", int, 1, 50)
    merged["candidates"] = _number(merged, "candidates", int, 1, 500)
    merged["dense_weight"] = _number(merged, "dense_weight", float, 0, 1)
    merged["keyword_weight"] = _number(merged, "keyword_weight", float, 0, 1)
    merged["rrf_k"] = _number(merged, "rrf_k", int, 1, 200)
    merged["max_per_document"] = _number(merged, "max_per_document", int, 0, 50)
    if merged["mode"] == "hybrid" and merged["fusion"] == "weighted" and \
            merged["dense_weight"] + merged["keyword_weight"] == 0:
        raise ValueError("dense_weight and keyword_weight cannot both be 0.")
    merged["score_threshold"] = _number(merged, "score_threshold", float, 0, 1)
    rerank = merged["rerank"]
    if rerank["kind"] not in RERANK_KINDS:
        raise ValueError(f"rerank.kind must be one of {', '.join(RERANK_KINDS)}, not {rerank['kind']!r}.")
    if rerank["kind"] != "none" and not rerank["model"]:
        raise ValueError(f"rerank.model is required for a {rerank['kind']} reranker.")
    rerank["top_k"] = _number(rerank, "top_k", int, 1, 50)
    rerank["threshold"] = _number(rerank, "threshold", float, 0, 1)
    return merged


def is_default(retrieval: dict) -> bool:
    """Whether the settings are a new knowledge base's, i.e. the user has not chosen their own. One default serves
    English and Chinese: on the shipped sample sets z-score fusion 0.5/0.5 was at least as good as the better of
    dense and keyword alone in both languages (bench.rag_quality, bench.rag_tuning); RRF k=30 ranked answers higher
    on the 40 English pages the questions come from but fell below keyword alone with 300 pages (hit@5 0.750 vs
    0.850) and below keyword on the Chinese samples. The Optimise job fits a knowledge base's own."""
    return validate_retrieval(retrieval) == validate_retrieval(None)
