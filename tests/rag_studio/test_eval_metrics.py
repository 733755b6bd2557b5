"""Answer and retrieval metrics on hand-computed examples, and reading uploaded eval sets."""

import json
import math

import pytest

from rag_studio.evals.eval_files import EvalFileError, EvalItemDraft, parse_eval_file
from rag_studio.evals.eval_metrics import (
    exact_match,
    hit_at_k,
    ndcg_at_k,
    recall_at_k,
    reciprocal_rank,
    token_f1,
    tokenize_for_overlap,
)

# Answer metrics

def test_tokens_are_lowercased_words_and_single_cjk_characters_without_punctuation():
    assert tokenize_for_overlap("Hello, World! 你好。GPT-4o 使用“VPN”") == [
        "hello", "world", "你", "好", "gpt", "4o", "使", "用", "vpn"]


def test_exact_match_ignores_case_punctuation_articles_and_spacing():
    assert exact_match("The Eiffel Tower.", "eiffel   tower") == 1.0
    assert exact_match("巴黎。", "巴 黎") == 1.0
    assert exact_match("Paris", "Paris, France") == 0.0


def test_token_f1_on_english():
    # Without articles: prediction {cat, sat, on, mat}, reference {cat, on, mat}: P = 3/4, R = 1.
    assert token_f1("The cat sat on the mat", "a cat on a mat") == pytest.approx(2 * 0.75 / 1.75)


def test_token_f1_on_chinese_counts_characters():
    # Prediction 首 都 是 北 京, reference 北 京: P = 2/5, R = 1, F1 = 2 * 0.4 / 1.4.
    assert token_f1("首都是北京", "北京") == pytest.approx(4 / 7)
    # Mixed text: 密 码 至 少 12 个 字 符 against 至 少 12 个 字 符: P = 6/8, R = 1.
    assert token_f1("密码至少12个字符", "至少 12 个字符。") == pytest.approx(2 * 0.75 / 1.75)


def test_token_f1_counts_repeated_tokens_once_per_match():
    # Prediction {yes, yes, yes}, reference {yes}: one common token, P = 1/3, R = 1.
    assert token_f1("yes yes yes", "yes") == pytest.approx(0.5)


def test_token_f1_edge_cases():
    assert token_f1("completely different", "nothing shared") == 0.0
    assert token_f1("", "") == 1.0
    assert token_f1("the", "answer") == 0.0


# Retrieval metrics

def test_hit_recall_and_reciprocal_rank():
    retrieved = ["intro.pdf", "faq.md", "policy.pdf", "vpn.docx"]
    relevant = {"policy.pdf", "vpn.docx", "missing.pdf"}

    assert hit_at_k(retrieved, relevant, 2) == 0.0
    assert hit_at_k(retrieved, relevant, 3) == 1.0
    assert recall_at_k(retrieved, relevant, 3) == pytest.approx(1 / 3)
    assert recall_at_k(retrieved, relevant, 10) == pytest.approx(2 / 3)
    assert reciprocal_rank(retrieved, relevant) == pytest.approx(1 / 3)
    assert reciprocal_rank(retrieved, {"missing.pdf"}) == 0.0


def test_ndcg_with_a_single_hit_at_rank_three():
    # DCG = 1 / log2(3 + 1) = 0.5; the ideal ranking puts the one relevant id first: IDCG = 1.
    assert ndcg_at_k(["a", "b", "c", "d"], {"c"}, 5) == pytest.approx(0.5)


def test_ndcg_with_two_relevant_ids():
    dcg = 1 / math.log2(3) + 1 / math.log2(5)   # hits at ranks 2 and 4
    ideal = 1 + 1 / math.log2(3)                 # both at the top
    assert ndcg_at_k(["x", "a", "y", "b"], {"a", "b"}, 4) == pytest.approx(dcg / ideal)
    # A cut-off of 2 keeps only the rank-2 hit; the ideal is still two hits at the top.
    assert ndcg_at_k(["x", "a", "y", "b"], {"a", "b"}, 2) == pytest.approx((1 / math.log2(3)) / ideal)
    assert ndcg_at_k(["a", "b"], {"a", "b"}, 10) == pytest.approx(1.0)


def test_ndcg_counts_a_repeated_hit_once():
    # "a" at ranks 1 and 2 (two chunks of one document), "b" at rank 3: DCG = 1 + 0 + 1/log2(4).
    expected = (1 + 0.5) / (1 + 1 / math.log2(3))
    assert ndcg_at_k(["a", "a", "b"], {"a", "b"}, 3) == pytest.approx(expected)
    assert ndcg_at_k(["a", "a", "a"], {"a"}, 3) == pytest.approx(1.0)


def test_nothing_relevant_scores_zero_everywhere():
    retrieved = ["a", "b"]
    assert hit_at_k(retrieved, set(), 2) == 0.0
    assert recall_at_k(retrieved, set(), 2) == 0.0
    assert reciprocal_rank(retrieved, set()) == 0.0
    assert ndcg_at_k(retrieved, set(), 2) == 0.0


def test_nothing_retrieved_scores_zero():
    assert recall_at_k([], {"a"}, 5) == 0.0
    assert ndcg_at_k([], {"a"}, 5) == 0.0


@pytest.mark.parametrize("metric", [hit_at_k, recall_at_k, ndcg_at_k])
def test_k_must_be_positive(metric):
    with pytest.raises(ValueError, match="k must be at least 1"):
        metric(["a"], {"a"}, 0)


# Eval files

def test_csv_with_aliases_quoted_newlines_and_several_sources():
    content = (
        "\ufeffQuery,Ground Truth,Sources,notes\r\n"
        "How long must passwords be?,At least 12 characters.,policy.pdf | handbook.docx,checked\r\n"
        "\r\n"
        '"如何申请VPN？","联系IT部门，\n填写申请表。",vpn.md,\r\n'
        "Who owns the data?,,,\r\n"
    ).encode("utf-8")

    assert parse_eval_file(content, "Eval Set.CSV") == [
        EvalItemDraft("How long must passwords be?", "At least 12 characters.", ["policy.pdf", "handbook.docx"]),
        EvalItemDraft("如何申请VPN？", "联系IT部门，\n填写申请表。", ["vpn.md"]),
        EvalItemDraft("Who owns the data?", "", []),
    ]


def test_csv_with_only_a_question_column():
    assert parse_eval_file(b"question\nWhat is RAG?\n", "set.csv") == [EvalItemDraft("What is RAG?", "", [])]


def test_json_lines_with_string_and_list_sources():
    lines = [
        {"question": "How long must passwords be?", "expected_answer": "12 characters",
         "expected_sources": "policy.pdf|handbook.docx"},
        {"Query": "如何申请VPN？", "answer": "联系IT部门。", "sources": ["vpn.md", " faq.md "], "id": 7},
        {"question": "How many regions?", "ground_truth": 3, "expected_document": None},
        {"question": "Who owns the data?"},
    ]
    content = ("\n".join(json.dumps(line, ensure_ascii=False) for line in lines[:2]) + "\n\n   \n"
               + "\n".join(json.dumps(line) for line in lines[2:]) + "\n").encode("utf-8")

    expected = [
        EvalItemDraft("How long must passwords be?", "12 characters", ["policy.pdf", "handbook.docx"]),
        EvalItemDraft("如何申请VPN？", "联系IT部门。", ["vpn.md", "faq.md"]),
        EvalItemDraft("How many regions?", "3", []),
        EvalItemDraft("Who owns the data?", "", []),
    ]
    assert parse_eval_file(content, "set.jsonl") == expected
    assert parse_eval_file(content, "set.json") == expected


def test_error_text_names_the_line():
    assert str(EvalFileError(7, "missing 'question'")) == "line 7: missing 'question'"
    assert str(EvalFileError(None, "the file has no items")) == "the file has no items"
    assert EvalFileError(7, "missing 'question'").line == 7


def jsonl(*records: object) -> bytes:
    return "\n".join(json.dumps(record) for record in records).encode()


@pytest.mark.parametrize(("content", "filename", "line", "message"), [
    ("question\nok\n".encode() + b"\xff\xfe\n", "set.csv", 3, "not UTF-8"),
    ("\ufeffquestion\n".encode() + "Où?".encode("latin-1"), "set.csv", 2, "not UTF-8"),
    (b"question\nok\n", "set.xlsx", None, "not a .csv, .jsonl or .json"),
    (b"prompt,answer\nWhat?,This.\n", "set.csv", 1, "no question column"),
    (b"question,query\nA?,B?\n", "set.csv", 1, "both 'question' and 'query'"),
    # The quoted answer spans lines 2-3, so the record with the empty question starts on line 4.
    (b'question,answer\nA?,"two\nlines"\n  ,orphan answer\n', "set.csv", 4, "missing 'question'"),
    (jsonl({"question": "A?"}) + b"\n\n{not json}\n", "set.jsonl", 3, "not valid JSON"),
    (jsonl({"question": "A?"}, ["B?", "b"]), "set.jsonl", 2, "expected a JSON object, got an array"),
    (jsonl({"answer": "no question"}), "set.jsonl", 1, "missing 'question'"),
    (jsonl({"question": ["A?"]}), "set.jsonl", 1, "'question' must be text"),
    (jsonl({"question": "A?", "expected_sources": 3}), "set.jsonl", 1,
     "'expected_sources' must be a string or a list of strings, got a number"),
    (jsonl({"question": "A?"}, {"question": "B?", "sources": ["a.pdf", 2]}), "set.jsonl", 2, "non-text items"),
    (b"question\nA?\n" + b'"' + b"x" * 200_000 + b'"\n', "set.csv", 3, "not readable as CSV: field larger"),
    (b"", "set.csv", None, "no items"),
    (b"question,answer\n\n", "set.csv", None, "no items"),
    (b"\n \n", "set.jsonl", None, "no items"),
])
def test_malformed_files_are_refused_with_the_line(content, filename, line, message):
    with pytest.raises(EvalFileError, match=message) as raised:
        parse_eval_file(content, filename)

    assert raised.value.line == line


def test_more_than_5000_items_are_refused_at_the_first_one_too_many():
    assert len(parse_eval_file(jsonl(*[{"question": f"Q{n}?"} for n in range(5000)]), "set.jsonl")) == 5000
    csv_content = ("question\n" + "".join(f"Q{n}?\n" for n in range(5001))).encode()

    with pytest.raises(EvalFileError, match="more than 5000 items") as raised:
        parse_eval_file(csv_content, "set.csv")

    assert raised.value.line == 5002
