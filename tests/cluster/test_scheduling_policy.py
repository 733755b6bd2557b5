"""The pool's scheduling policy (cluster/scheduling/policy.py) on hand-built pools: gangs, quotas, classes,
reasons, fair share, preemption and elastic jobs. The same function the database pass and bench.pool_sim call."""

from cluster.scheduling.policy import Quota, Settings, Stop, Workload, schedule

SLOT = "cpu-slot"
SETTINGS = Settings(min_run_s=600, grace_s=120, aging_s=3600, starving_s=1800)


def job(id, workspace, devices=1, *, priority="normal", at=0.0, most=None, allocation=None, started=None,
        checkpoint=None, **fields) -> Workload:
    return Workload(id=id, workspace=workspace, kind=SLOT, min_devices=devices, max_devices=most or devices,
                    priority=priority, submitted_at=at, allocation=allocation or {}, started_at=started,
                    last_checkpoint_at=checkpoint, **fields)


def run(workloads, *, nodes=None, quotas=None, now=1000.0):
    return schedule(capacity=nodes or {"a": {SLOT: 2}, "b": {SLOT: 2}}, quotas=quotas or {},
                    workloads=workloads, now=now, settings=SETTINGS)


def test_a_gang_is_placed_whole_on_one_node_or_waits_saying_why():
    decisions = run([job(1, "A", 3)])
    assert decisions.admit == []
    assert "no single node has 3 free" in decisions.reasons[1]

    spread = run([job(1, "A", 3, spread=True)])
    assert spread.admit[0].allocation == {"a": 2, "b": 1}

    fits = run([job(1, "A", 2, at=0), job(2, "B", 1, at=1)])
    assert sorted((a.workload, sum(a.allocation.values())) for a in fits.admit) == [(1, 2), (2, 1)]
    assert len({node for a in fits.admit for node in a.allocation}) == 2


def test_without_quotas_one_workspace_gets_the_whole_pool_as_before():
    decisions = run([job(1, "A", 2), job(2, "A", 2, at=1)])
    assert len(decisions.admit) == 2


def test_the_reason_names_the_quota_its_users_what_can_be_borrowed_and_the_place_in_line():
    quotas = {"A": {SLOT: Quota(nominal=2, borrowing_limit=0)}, "B": {SLOT: Quota(nominal=2)}}
    running = job(41, "A", 2, allocation={"a": 2}, started=0)
    decisions = run([running, job(50, "A", 2, at=5), job(51, "A", 2, at=9)], quotas=quotas)
    assert decisions.reasons[50] == ("waiting: needs 2 cpu-slot; 2 of 2 cpu-slot in your quota in use by job 41; "
                                     "your borrowing limit of 0 is reached; number 1 in your queue")
    assert decisions.reasons[51].endswith("number 2 in your queue")


def test_idle_quota_is_lent_within_the_lending_limit_and_borrowing_within_the_borrowing_limit():
    quotas = {"A": {SLOT: Quota(nominal=1, borrowing_limit=1)}, "B": {SLOT: Quota(nominal=3, lending_limit=1)}}
    decisions = run([job(1, "A", 1), job(2, "A", 1, at=1), job(3, "A", 1, at=2)], quotas=quotas)
    # A's own 1, then 1 borrowed of B's idle 3, of which B lends 1: the third waits.
    assert [a.workload for a in decisions.admit] == [1, 2]
    assert "your borrowing limit of 1 is reached" in decisions.reasons[3]


def test_workspaces_share_by_quota_not_by_class_or_backlog_and_a_job_waiting_aging_s_goes_first():
    holding = job(1, "A", 2, allocation={"a": 2}, started=0)
    decisions = run([holding, job(2, "A", 1, at=0), job(3, "B", 1, at=500), job(4, "B", 1, at=501)],
                    nodes={"a": {SLOT: 2}, "b": {SLOT: 2}})
    # B holds nothing, so both its jobs go before A's older one.
    assert [a.workload for a in decisions.admit] == [3, 4]

    quotas = {"A": {SLOT: Quota(nominal=2)}, "B": {SLOT: Quota(nominal=2)}}
    one_free = {"a": {SLOT: 2}, "b": {SLOT: 1}}
    backlog = [job(10 + n, "A", 1, priority="high", at=n) for n in range(5)]
    guaranteed = run([holding, *backlog, job(3, "B", 1, priority="low", at=900)], nodes=one_free, quotas=quotas)
    # A is at its quota: B's low job, within B's quota, goes before A's older, higher backlog that would borrow.
    assert [a.workload for a in guaranteed.admit] == [3]

    aged = run([holding, job(2, "A", 1, at=0), job(3, "B", 1, at=9000)], nodes=one_free, quotas=quotas,
               now=9001.0)
    # A's job waited past aging_s (an hour here): it goes before fair share, so nothing waits for ever.
    assert [a.workload for a in aged.admit] == [2]


def test_a_low_job_waiting_promote_s_goes_before_its_workspaces_newer_work_which_then_does_not_stop_it():
    settings = Settings(min_run_s=0, promote_s=3600)
    old_low, new_normal = job(1, "A", 2, priority="low", at=0), job(2, "A", 2, at=3000)
    decisions = schedule(capacity={"a": {SLOT: 2}}, quotas={}, workloads=[old_low, new_normal], now=4000.0,
                         settings=settings)
    assert [a.workload for a in decisions.admit] == [1]

    started = job(1, "A", 2, priority="low", at=0, allocation={"a": 2}, started=4000)
    later = schedule(capacity={"a": {SLOT: 2}}, quotas={}, workloads=[started, new_normal], now=5000.0,
                     settings=settings)
    # It started as a normal job: A's normal job waits its turn rather than stopping it (a preemption loop).
    assert later.stop == [] and later.reasons[2].startswith("waiting:")


def test_a_higher_class_goes_first_and_preempts_the_victim_losing_least_progress():
    old_checkpoint = job(1, "A", 1, priority="low", allocation={"a": 1}, started=0, checkpoint=100)
    fresh_checkpoint = job(2, "A", 1, priority="low", allocation={"a": 1}, started=0, checkpoint=990)
    normal = job(3, "A", 1, priority="normal", allocation={"b": 1}, started=0, checkpoint=995)
    busy = job(4, "B", 1, allocation={"b": 1}, started=0)
    urgent = job(5, "A", 1, priority="urgent", at=999)
    decisions = run([old_checkpoint, fresh_checkpoint, normal, busy, urgent],
                    quotas={"A": {SLOT: Quota(nominal=3)}, "B": {SLOT: Quota(nominal=1)}})
    # Least progress lost first (job 3's 5 s), whatever its class; B's job within B's quota is never a victim.
    assert decisions.stop == [Stop(workload=3, by=5, keep={})]
    assert decisions.nominate[5]
    assert decisions.reasons[5].startswith("preempting job")


def test_victims_are_chosen_by_least_progress_lost_then_lowest_class():
    a = job(1, "A", 1, priority="low", allocation={"a": 1}, started=0, checkpoint=100)
    b = job(2, "A", 1, priority="normal", allocation={"a": 1}, started=0, checkpoint=900)
    c = job(3, "A", 1, priority="low", allocation={"b": 2}, started=0, checkpoint=900, most=2)
    urgent = job(4, "A", 1, priority="urgent", at=999)
    decisions = run([a, b, c, urgent])
    # 2 and 3 lose 100 s, 1 loses 900 s; of 2 and 3, the lower class; an elastic victim shrinks, not stops.
    assert decisions.stop == [Stop(workload=3, by=4, keep={"b": 1})]


def test_a_queue_reclaims_its_quota_from_a_borrower_of_any_class_but_not_from_one_within_its_own():
    quotas = {"A": {SLOT: Quota(nominal=2)}, "B": {SLOT: Quota(nominal=2)}}
    borrower = job(1, "B", 2, priority="high", allocation={"a": 2}, started=0)
    own = job(2, "B", 2, priority="low", allocation={"b": 2}, started=0)
    decisions = run([borrower, own, job(3, "A", 2, priority="low", at=999)], quotas=quotas)
    # B is over its quota, so either of its jobs may go: equal progress lost, so the lower class.
    assert decisions.stop == [Stop(workload=2, by=3, keep={})]

    within = run([job(2, "B", 2, priority="low", allocation={"b": 2}, started=0),
                  job(4, "A", 2, priority="low", allocation={"a": 2}, started=0),
                  job(3, "A", 2, priority="urgent", at=999)], quotas=quotas)
    # A's urgent job may stop A's own low one, never B's work within B's quota.
    assert within.stop == [Stop(workload=4, by=3, keep={})]


def test_a_job_runs_its_minimum_time_before_it_can_be_preempted():
    nodes, quotas = {"a": {SLOT: 2}}, {"A": {SLOT: Quota(nominal=2)}}
    for resumed in (job(1, "B", 2, allocation={"a": 2}, started=900, preemptions=1),
                    job(1, "B", 2, allocation={"a": 2}, started=900)):
        spared = run([resumed, job(3, "A", 2, priority="high", at=950)], nodes=nodes, quotas=quotas)
        assert spared.stop == [] and spared.reasons[3].startswith("waiting:")
        later = run([resumed, job(3, "A", 2, priority="high", at=950)], nodes=nodes, quotas=quotas, now=1600.0)
        assert later.stop == [Stop(workload=1, by=3, keep={})]
        # Urgent work does not wait for it.
        urgent = run([resumed, job(4, "A", 2, priority="urgent", at=990)], nodes=nodes, quotas=quotas)
        assert urgent.stop == [Stop(workload=1, by=4, keep={})]


def test_borrowing_stops_another_workspaces_work_only_while_that_workspace_keeps_the_larger_share():
    one_node = {"a": {SLOT: 10}}
    borrowers = [job(n, "C", 2, priority="low", allocation={"a": 2}, started=0) for n in (1, 2, 3)]
    at_quota = job(4, "A", 4, priority="high", allocation={"a": 4}, started=0)
    high = job(5, "A", 2, priority="high", at=999)
    # C borrows 4 beyond its 2; A is at its 4. A's high job would leave A at 6/4 and C at 4/2: fair, C's low goes.
    fair = run([*borrowers, at_quota, high], nodes=one_node,
               quotas={"A": {SLOT: Quota(nominal=4)}, "C": {SLOT: Quota(nominal=2)}})
    assert [stop.by for stop in fair.stop] == [5]
    # With A's quota 2 and C's 4, A would end at 6/2 against C's 4/4: A's high job waits instead.
    unfair = run([*borrowers, at_quota, high], nodes=one_node,
                 quotas={"A": {SLOT: Quota(nominal=2)}, "C": {SLOT: Quota(nominal=4)}})
    assert unfair.stop == [] and unfair.reasons[5].startswith("waiting:")


def test_a_node_drains_for_a_workspace_below_its_quota_whose_gang_finds_no_room():
    quotas = {"A": {SLOT: Quota(nominal=2)}, "B": {SLOT: Quota(nominal=2)}}
    spread_out = [job(1, "B", 1, allocation={"a": 1}, started=900), job(2, "B", 1, allocation={"b": 1}, started=900)]
    decisions = run([*spread_out, job(3, "A", 2, at=990), job(4, "B", 1, at=995)], quotas=quotas)
    # A's 2 fit on no node and B's work is within its quota: a node is held for A, and B borrows on the other.
    held = decisions.nominate[3]
    assert len(held) == 1 and [set(a.allocation) for a in decisions.admit] == [{"a", "b"} - set(held)]
    # Held across passes, until it starts.
    again = run([*spread_out, job(3, "A", 2, at=990, nominated=held), job(5, "B", 1, at=999)], quotas=quotas)
    assert 3 not in again.nominate and held[0] not in {node for a in again.admit for node in a.allocation}


def test_the_preemptor_waits_for_its_victims_and_then_the_room_is_its_own():
    stopping = job(1, "B", 2, priority="low", allocation={"a": 2}, started=0, stopping_since=990.0, stopping_for=3)
    decisions = run([stopping, job(3, "A", 2, priority="urgent", at=980)], nodes={"a": {SLOT: 2}})
    assert decisions.stop == [] and decisions.reasons[3].startswith("waiting for job 1 (low) to checkpoint")

    after = run([job(3, "A", 2, priority="normal", at=980, nominated=("a",)), job(4, "B", 2, priority="high", at=1)],
                nodes={"a": {SLOT: 2}})
    assert [a.workload for a in after.admit] == [3]


def test_a_victim_still_running_after_the_grace_period_is_stopped():
    late = job(1, "A", 1, allocation={"a": 1}, started=0, stopping_since=800.0, stopping_for=2)
    assert run([late]).kill == [1]


def test_an_elastic_victim_stops_outright_when_shrinking_cannot_make_the_room():
    elastic = job(1, "A", 1, priority="low", most=2, allocation={"a": 2}, started=0, sizes=(1, 2))
    decisions = run([elastic, job(2, "A", 2, priority="urgent", at=999)], nodes={"a": {SLOT: 2}})
    assert decisions.stop == [Stop(workload=1, by=2, keep={})]
    shrink = run([elastic, job(2, "A", 1, priority="urgent", at=999)], nodes={"a": {SLOT: 2}})
    assert shrink.stop == [Stop(workload=1, by=2, keep={"a": 1})]


def test_an_elastic_job_takes_no_more_than_its_quota_while_others_wait():
    quotas = {"A": {SLOT: Quota(nominal=1)}, "B": {SLOT: Quota(nominal=1)}}
    decisions = run([job(1, "A", 1, most=4, sizes=(1, 2, 4)), job(2, "B", 4, at=1)], nodes={"a": {SLOT: 4}},
                    quotas=quotas)
    assert decisions.admit[0].allocation == {"a": 1}


def test_an_elastic_job_starts_on_what_is_free_and_grows_when_devices_stay_free():
    busy = job(1, "B", 2, allocation={"a": 2}, started=0)
    elastic = job(2, "A", 1, most=4, sizes=(1, 2, 4))
    decisions = run([busy, elastic])
    assert decisions.admit[0].allocation == {"b": 2}

    grown = run([job(2, "A", 1, most=4, allocation={"a": 2}, started=0, sizes=(1, 2, 4))],
                nodes={"a": {SLOT: 4}}, now=700.0)
    assert grown.grow[0].allocation == {"a": 4}
    # Not before its minimum run time, and not while anything waits for the kind.
    assert not run([job(2, "A", 1, most=4, allocation={"a": 2}, started=500)], nodes={"a": {SLOT: 4}}).grow
