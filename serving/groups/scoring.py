"""Answer quality against a reference, for calibration: SQuAD's exact match and bag-of-tokens F1, with each CJK
character a token so that Chinese answers are scored without a word segmenter.

The same definitions as RAG Studio's answer metrics (rag_studio/eval_metrics.py); serving sits below the studios
and cannot import them, so calibration keeps its own copy of these few lines."""

import re

CJK_CHARACTER = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ebef"
OVERLAP_TOKEN = re.compile(rf"[{CJK_CHARACTER}]|(?:(?![{CJK_CHARACTER}])[^\W_])+")
ARTICLES = {"a", "an", "the"}
METRICS = ("token_f1", "exact_match")


def _tokens(text: str) -> list[str]:
    return [token for token in OVERLAP_TOKEN.findall(text.lower()) if token not in ARTICLES]


def exact_match(prediction: str, reference: str) -> float:
    return float(_tokens(prediction) == _tokens(reference))


def token_f1(prediction: str, reference: str) -> float:
    predicted, expected = _tokens(prediction), _tokens(reference)
    if not predicted or not expected:
        return float(predicted == expected)
    common = sum(min(predicted.count(token), expected.count(token)) for token in set(predicted))
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def score(metric: str, prediction: str, reference: str) -> float:
    return {"token_f1": token_f1, "exact_match": exact_match}[metric](prediction, reference)
