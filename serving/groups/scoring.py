"""Answer quality against a reference: SQuAD's exact match and bag-of-tokens F1, with each CJK character a token so
that Chinese answers are scored without a word segmenter. Calibration scores with them, and RAG Studio's answer
metrics (rag_studio/evals/eval_metrics.py) are these same functions: serving sits below the studios, so the one
definition lives here."""

import re

JUDGE = "judge"
# What the judge deployment is asked; its first number, from 0 to 10, is the grade.
JUDGE_PROMPT = """Grade an answer against the reference answer.

Question: {question}
Reference answer: {reference}
Answer to grade: {answer}

Reply with one number from 0 (wrong or unrelated) to 10 (says what the reference says)."""
GRADE = re.compile(r"\d+(?:\.\d+)?")

# CJK ideographs (with extensions A-F and compatibility ideographs) and Japanese kana.
CJK_CHARACTER = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ebef"
# A single CJK character, or a run of other letters and digits; punctuation, whitespace and "_" separate tokens.
OVERLAP_TOKEN = re.compile(rf"[{CJK_CHARACTER}]|(?:(?![{CJK_CHARACTER}])[^\W_])+")
ARTICLES = {"a", "an", "the"}
METRICS = ("token_f1", "exact_match", JUDGE)


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


def judge_grade(reply: str) -> float | None:
    """The judge's grade in [0, 1] from its reply's first number, or None when it gave none."""
    found = GRADE.search(reply or "")
    return min(10.0, float(found.group())) / 10 if found else None


def score(metric: str, prediction: str, reference: str) -> float:
    return {"token_f1": token_f1, "exact_match": exact_match}[metric](prediction, reference)
