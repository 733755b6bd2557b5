"""fuse(): explainable hybrid scores, checked against hand-computed values; the release that changed the default."""

import importlib
import math

import pytest
from django.apps import apps as django_apps

from rag_studio.models import KnowledgeBase
from rag_studio.search.fusion import ScoredHit, fuse
from rag_studio.search.retrieval_config import DEFAULT_RETRIEVAL, validate_retrieval
from rag_studio.services import create_knowledge_base

# chunk 1: dense only; chunk 2: both lists; chunk 3: dense only, negative cosine; chunk 4: keyword only
DENSE = [(1, 0.9), (2, 0.5), (3, -0.2)]
KEYWORD = [(2, 10.0), (4, 5.0)]


def by_id(hits: list[ScoredHit]) -> dict[int, ScoredHit]:
    return {hit.chunk_id: hit for hit in hits}


def test_weighted_fusion_by_hand():
    hits = fuse(DENSE, KEYWORD, method="weighted", normalisation="max", dense_weight=0.7, keyword_weight=0.3)

    assert [hit.chunk_id for hit in hits] == [2, 1, 4, 3]
    scored = by_id(hits)
    assert scored[2] == ScoredHit(chunk_id=2, dense=0.5, keyword=1.0, fused=pytest.approx(0.7 * 0.5 + 0.3 * 1.0),
                                  dense_raw=0.5, keyword_raw=10.0)
    assert scored[1] == ScoredHit(chunk_id=1, dense=0.9, keyword=None, fused=pytest.approx(0.63), dense_raw=0.9,
                                  keyword_raw=None)
    assert scored[4] == ScoredHit(chunk_id=4, dense=None, keyword=0.5, fused=pytest.approx(0.15), dense_raw=None,
                                  keyword_raw=5.0)
    # a negative cosine clamps to 0 but keeps its raw value for display
    assert (scored[3].dense, scored[3].fused, scored[3].dense_raw) == (0.0, 0.0, -0.2)


@pytest.mark.parametrize("normalisation", ["max", "zscore"])
def test_weights_are_normalised_to_sum_to_one(normalisation):
    assert [hit.fused for hit in fuse(DENSE, KEYWORD, normalisation=normalisation, dense_weight=7,
                                      keyword_weight=3)] == \
        pytest.approx([hit.fused for hit in fuse(DENSE, KEYWORD, normalisation=normalisation, dense_weight=0.7,
                                                 keyword_weight=0.3)])


def test_max_normalisation_by_hand_with_equal_weights():
    hits = by_id(fuse(DENSE, KEYWORD, normalisation="max", dense_weight=1, keyword_weight=1))
    assert hits[2].fused == pytest.approx((0.5 + 1.0) / 2)
    assert hits[4].fused == pytest.approx(0.5 / 2)


def test_keyword_scores_are_relative_to_the_best_keyword_hit_of_the_query():
    hits = by_id(fuse([], [(8, 12.0), (9, 3.0), (7, 0.6)], top_k=10))
    assert (hits[8].keyword, hits[9].keyword, hits[7].keyword) == pytest.approx((1.0, 0.25, 0.05))


def test_one_empty_list_gives_dense_only_or_keyword_only_scores():
    dense_only = fuse(DENSE, [], normalisation="max", dense_weight=0.7, keyword_weight=0.3)
    assert [(hit.chunk_id, hit.fused, hit.keyword) for hit in dense_only] == [(1, 0.9, None), (2, 0.5, None),
                                                                              (3, 0.0, None)]
    keyword_only = fuse([], KEYWORD, normalisation="max", dense_weight=0.7, keyword_weight=0.3)
    assert [(hit.chunk_id, hit.fused, hit.dense) for hit in keyword_only] == [(2, 1.0, None), (4, 0.5, None)]
    # weights only apportion between two lists: a zero weight does not zero a list searched alone
    assert [hit.fused for hit in fuse(DENSE, [], normalisation="max", dense_weight=0, keyword_weight=1)] == \
        [0.9, 0.5, 0.0]
    zscore_alone = fuse(DENSE, [], dense_weight=0, keyword_weight=1)
    assert [hit.chunk_id for hit in zscore_alone] == [1, 2, 3] and zscore_alone[0].fused > 0.5
    assert fuse([], []) == []


def test_rrf_by_hand():
    hits = fuse(DENSE, KEYWORD, method="rrf", rrf_k=60)

    assert [hit.chunk_id for hit in hits] == [2, 1, 4, 3]
    scored = by_id(hits)
    best_possible = 2 / 61  # first in both lists
    assert scored[2].fused == pytest.approx((1 / 62 + 1 / 61) / best_possible)  # rank 2 in dense, 1 in keyword
    assert scored[1].fused == pytest.approx(1 / 61 / best_possible)
    assert scored[4].fused == pytest.approx(1 / 62 / best_possible)
    assert scored[3].fused == pytest.approx(1 / 63 / best_possible)
    # the normalised scores are still filled in for display
    assert (scored[2].dense, scored[2].keyword, scored[4].keyword, scored[1].keyword) == (0.5, 1.0, 0.5, None)


def test_rrf_with_a_small_k():
    hits = by_id(fuse([(5, 0.1), (6, 0.05)], [(6, 2.0)], method="rrf", rrf_k=0))
    assert hits[6].fused == pytest.approx((1 / 2 + 1 / 1) / 2)
    assert hits[5].fused == pytest.approx(1 / 1 / 2)


def test_rrf_scores_run_from_0_to_1_so_a_score_threshold_keeps_good_hits():
    hits = fuse([(1, 0.9), (2, 0.8)], [(1, 7.0), (3, 2.0)], method="rrf", rrf_k=60)
    assert hits[0].chunk_id == 1 and hits[0].fused == pytest.approx(1.0)  # first in both lists
    assert all(0 < hit.fused <= 1 for hit in hits)
    alone = fuse([(1, 0.9), (2, 0.8)], [], method="rrf")
    assert alone[0].fused == pytest.approx(1.0)


@pytest.mark.parametrize("normalisation", ["max", "zscore"])
def test_ties_are_broken_by_chunk_id_and_top_k_cuts(normalisation):
    hits = fuse([(30, 0.5), (10, 0.5), (20, 0.5), (40, 0.1)], [], normalisation=normalisation, top_k=3)
    assert [hit.chunk_id for hit in hits] == [10, 20, 30]


def test_a_chunk_repeated_in_a_list_counts_once_at_its_best_position():
    hits = fuse([(1, 0.9), (1, 0.3), (2, 0.5)], [], method="rrf")
    assert [(hit.chunk_id, hit.dense) for hit in hits] == [(1, 0.9), (2, 0.5)]
    assert hits[1].fused == pytest.approx((1 / 62) / (1 / 61))  # rank 2 of one list


@pytest.mark.parametrize("kwargs, field", [
    ({"method": "max"}, "method"),
    ({"dense_weight": -0.1}, "dense_weight"),
    ({"keyword_weight": float("nan")}, "keyword_weight"),
    ({"keyword_weight": "0.3"}, "keyword_weight"),
    ({"dense_weight": True}, "dense_weight"),
    ({"rrf_k": -1}, "rrf_k"),
    ({"rrf_k": 1.5}, "rrf_k"),
    ({"normalisation": "minmax"}, "normalisation"),
    ({"max_per_document": -1}, "max_per_document"),
    ({"max_per_document": 2.0}, "max_per_document"),
    ({"top_k": 0}, "top_k"),
])
def test_invalid_arguments_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        fuse(DENSE, KEYWORD, **kwargs)


@pytest.mark.parametrize("normalisation", ["max", "zscore"])
def test_both_weights_zero_is_refused_when_both_lists_have_hits(normalisation):
    with pytest.raises(ValueError, match="dense_weight and keyword_weight"):
        fuse(DENSE, KEYWORD, normalisation=normalisation, dense_weight=0, keyword_weight=0)


# Issue 22, from the Chinese samples on multilingual-e5: the embedding's cosines crowd into a narrow band over the
# whole index (mean 0.85, spread 0.016), dense is sure of chunk 1 (0.884, three spreads above the rest) and keyword
# weakly prefers chunk 2, which jieba happened to segment like the query (1.21 against 1.03; most chunks score 0).
# With BM25 / best and clamped cosines the keyword top hit took the full keyword weight and won; in z-scores dense's
# standing out counts as much as keyword's.
E5_DENSE = [(1, 0.884), (2, 0.855), (3, 0.852), (4, 0.848)]
E5_KEYWORD = [(2, 1.21), (1, 1.03)]
E5_DENSE_STATS = {"mean": 0.848, "std": 0.016, "count": 22}
E5_KEYWORD_STATS = {"mean": 0.102, "std": 0.34, "count": 22, "matches": 2}


def test_a_chunk_both_sides_rank_highly_is_not_beaten_by_the_keyword_top_hit():
    before = fuse(E5_DENSE, E5_KEYWORD, normalisation="max", dense_weight=0.7, keyword_weight=0.3)
    assert before[0].chunk_id == 2  # the old fusion: keyword's top hit wins although dense is sure of chunk 1
    after = fuse(E5_DENSE, E5_KEYWORD, normalisation="zscore", dense_stats=E5_DENSE_STATS,
                 keyword_stats=E5_KEYWORD_STATS)
    assert [hit.chunk_id for hit in after][:2] == [1, 2]
    # display scores are unchanged; fused is the standard normal CDF of the weighted z, in [0, 1]
    top = after[0]
    assert (top.dense, top.keyword, top.dense_raw, top.keyword_raw) == pytest.approx((0.884, 1.03 / 1.21, 0.884, 1.03))
    z = ((0.884 - 0.848) / 0.016 + (1.03 - 0.102) / 0.34) / 2
    assert top.fused == pytest.approx(0.5 * (1 + math.erf(z / math.sqrt(2))))


def test_zscore_without_index_statistics_uses_the_lists_own():
    assert [hit.chunk_id for hit in fuse(E5_DENSE, E5_KEYWORD)][0] == 1
    assert all(0 <= hit.fused <= 1 for hit in fuse(DENSE, KEYWORD))


def test_a_side_that_tells_chunks_apart_outweighs_one_that_does_not():
    """With index-wide z-scores (`zscore`), an English-only model reading Chinese: cosines of noise, nowhere near a
    standout, move little; keyword is sure."""
    noise = [(5, 0.60), (6, 0.59), (7, 0.58), (8, 0.57)]
    noise_stats = {"mean": 0.45, "std": 0.10, "count": 22}
    sure = [(8, 6.0), (5, 0.6)]
    sure_stats = {"mean": 0.35, "std": 1.3, "count": 22, "matches": 2}
    hits = fuse(noise, sure, normalisation="zscore", dense_stats=noise_stats, keyword_stats=sure_stats)
    assert hits[0].chunk_id == 8


def test_a_keyword_list_holding_every_match_gives_the_rest_a_bm25_of_0():
    stats = {"mean": 0.1, "std": 0.5, "matches": 1}
    hits = by_id(fuse([(1, 0.5), (2, 0.4)], [(2, 3.0)], normalisation="zscore", dense_stats={"mean": 0.3, "std": 0.1},
                      keyword_stats=stats))
    z_missing = (0.0 - 0.1) / 0.5  # chunk 1: no keyword match at all
    assert hits[1].fused == pytest.approx(0.5 * (1 + math.erf(((0.5 - 0.3) / 0.1 + z_missing) / 2 / math.sqrt(2))))


def test_max_per_document_caps_hits_of_one_document_and_lets_others_move_up():
    dense = [(1, 0.9), (2, 0.85), (3, 0.8), (4, 0.7), (5, 0.6)]
    documents = {1: 10, 2: 10, 3: 10, 4: 20, 5: 30}
    uncapped = fuse(dense, [], normalisation="max", top_k=3, document_of=documents)
    assert [hit.chunk_id for hit in uncapped] == [1, 2, 3]
    capped = fuse(dense, [], normalisation="max", top_k=3, document_of=documents, max_per_document=1)
    assert [hit.chunk_id for hit in capped] == [1, 4, 5]
    two = fuse(dense, [], normalisation="max", top_k=10, document_of=documents, max_per_document=2)
    assert [hit.chunk_id for hit in two] == [1, 2, 4, 5]


def test_rrf_k_changes_the_fused_order():
    dense = [(1, 0.9), (2, 0.8), (3, 0.7)]
    keyword = [(3, 5.0), (4, 4.0), (2, 3.0)]
    # chunk 2 (ranks 2 and 3) against chunk 3 (ranks 3 and 1): a small k rewards the first place
    assert fuse(dense, keyword, method="rrf", rrf_k=1)[0].chunk_id == 3
    small = by_id(fuse(dense, keyword, method="rrf", rrf_k=1))
    large = by_id(fuse(dense, keyword, method="rrf", rrf_k=200))
    assert small[3].fused == pytest.approx((1 / 4 + 1 / 2) / (2 / 2))
    assert large[3].fused == pytest.approx((1 / 203 + 1 / 201) / (2 / 201))


def test_among_the_candidates_a_keyword_match_no_longer_outweighs_a_dense_standout():
    """Issue 34: over the whole index most BM25 scores are 0, so any keyword match stands many spreads out and
    decided alone; among each side's candidates the chunk dense search is sure of, which keyword search also
    found, comes first (the default, `zscore_candidates`)."""
    dense = [(1, 0.80), (2, 0.60), (3, 0.58), (4, 0.57)]
    keyword = [(2, 2.0), (1, 1.2), (5, 1.1)]
    index_stats = {"dense_stats": {"mean": 0.3, "std": 0.1, "count": 500},
                   "keyword_stats": {"mean": 0.05, "std": 0.2, "count": 500, "matches": 3}}
    assert fuse(dense, keyword, normalisation="zscore", **index_stats)[0].chunk_id == 2
    among = fuse(dense, keyword, **index_stats)
    assert [hit.chunk_id for hit in among][:2] == [1, 2]
    assert among == fuse(dense, keyword, normalisation="zscore")  # the index's statistics play no part
    assert validate_retrieval(None)["normalisation"] == "zscore_candidates"


@pytest.mark.django_db
def test_the_release_moves_knowledge_bases_on_the_old_default_and_leaves_chosen_settings(acme, ann):
    migration = importlib.import_module("rag_studio.migrations.0010_default_zscore_candidates")
    untouched = create_knowledge_base(actor=ann, workspace=acme, name="Untouched")
    chosen = create_knowledge_base(actor=ann, workspace=acme, name="Chosen")
    KnowledgeBase.objects.filter(pk=untouched.pk).update(retrieval=migration.OLD_DEFAULT)
    KnowledgeBase.objects.filter(pk=chosen.pk).update(retrieval={**migration.OLD_DEFAULT, "top_k": 8})

    migration.forwards(django_apps, None)
    assert KnowledgeBase.objects.get(pk=untouched.pk).retrieval == DEFAULT_RETRIEVAL
    assert KnowledgeBase.objects.get(pk=chosen.pk).retrieval == {**migration.OLD_DEFAULT, "top_k": 8}

    migration.backwards(django_apps, None)
    assert KnowledgeBase.objects.get(pk=untouched.pk).retrieval == migration.OLD_DEFAULT
