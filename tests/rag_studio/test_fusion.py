"""fuse(): explainable hybrid scores, checked against hand-computed values."""

import pytest

from rag_studio.search.fusion import ScoredHit, fuse

# chunk 1: dense only; chunk 2: both lists; chunk 3: dense only, negative cosine; chunk 4: keyword only
DENSE = [(1, 0.9), (2, 0.5), (3, -0.2)]
KEYWORD = [(2, 10.0), (4, 5.0)]


def by_id(hits: list[ScoredHit]) -> dict[int, ScoredHit]:
    return {hit.chunk_id: hit for hit in hits}


def test_weighted_fusion_by_hand():
    hits = fuse(DENSE, KEYWORD, method="weighted", dense_weight=0.7, keyword_weight=0.3)

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


def test_weights_are_normalised_to_sum_to_one():
    assert [hit.fused for hit in fuse(DENSE, KEYWORD, dense_weight=7, keyword_weight=3)] == \
        pytest.approx([hit.fused for hit in fuse(DENSE, KEYWORD, dense_weight=0.7, keyword_weight=0.3)])
    hits = by_id(fuse(DENSE, KEYWORD, dense_weight=1, keyword_weight=1))
    assert hits[2].fused == pytest.approx((0.5 + 1.0) / 2)
    assert hits[4].fused == pytest.approx(0.5 / 2)


def test_keyword_scores_are_relative_to_the_best_keyword_hit_of_the_query():
    hits = by_id(fuse([], [(8, 12.0), (9, 3.0), (7, 0.6)], top_k=10))
    assert (hits[8].keyword, hits[9].keyword, hits[7].keyword) == pytest.approx((1.0, 0.25, 0.05))


def test_one_empty_list_gives_dense_only_or_keyword_only_scores():
    dense_only = fuse(DENSE, [], dense_weight=0.7, keyword_weight=0.3)
    assert [(hit.chunk_id, hit.fused, hit.keyword) for hit in dense_only] == [(1, 0.9, None), (2, 0.5, None),
                                                                              (3, 0.0, None)]
    keyword_only = fuse([], KEYWORD, dense_weight=0.7, keyword_weight=0.3)
    assert [(hit.chunk_id, hit.fused, hit.dense) for hit in keyword_only] == [(2, 1.0, None), (4, 0.5, None)]
    # weights only apportion between two lists: a zero weight does not zero a list searched alone
    assert [hit.fused for hit in fuse(DENSE, [], dense_weight=0, keyword_weight=1)] == [0.9, 0.5, 0.0]
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


def test_ties_are_broken_by_chunk_id_and_top_k_cuts():
    hits = fuse([(30, 0.5), (10, 0.5), (20, 0.5), (40, 0.1)], [], top_k=3)
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
    ({"top_k": 0}, "top_k"),
])
def test_invalid_arguments_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        fuse(DENSE, KEYWORD, **kwargs)


def test_both_weights_zero_is_refused_when_both_lists_have_hits():
    with pytest.raises(ValueError, match="dense_weight and keyword_weight"):
        fuse(DENSE, KEYWORD, dense_weight=0, keyword_weight=0)
