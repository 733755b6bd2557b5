"""Answer quality against a reference, for calibration: SQuAD's exact match and bag-of-tokens F1, with each CJK
character a token so that Chinese answers are scored without a word segmenter.

The same definitions as RAG Studio's answer metrics (rag_studio/evals/eval_metrics.py); serving sits below the studios
and cannot import them, so calibration keeps its own copy of these few lines."""

import re

JUDGE = "judge"
# What the judge deployment is asked; its first number, from 0 to 10, is the grade.
JUDGE_PROMPT = """Grade an answer against the reference answer.

Question: {question}
Reference answer: {reference}
Answer to grade: {answer}

Reply with one number from 0 (wrong or unrelated) to 10 (says what the reference says)."""
GRADE = re.compile(r"\d+(?:\.\d+)?")

CJK_CHARACTER = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ebef"
OVERLAP_TOKEN = re.compile(rf"[{CJK_CHARACTER}]|(?:(?![{CJK_CHARACTER}])[^\W_])+")
ARTICLES = {"a", "an", "the"}
METRICS = ("token_f1", "exact_match", JUDGE)


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


def judge_grade(reply: str) -> float | None:
    """The judge's grade in [0, 1] from its reply's first number, or None when it gave none."""
    found = GRADE.search(reply or "")
    return min(10.0, float(found.group())) / 10 if found else None


def score(metric: str, prediction: str, reference: str) -> float:
    return {"token_f1": token_f1, "exact_match": exact_match}[metric](prediction, reference)
