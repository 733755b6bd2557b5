"""The gateway's choice of replica: a cool-down steers requests away from a replica that just failed, to the others;
a deployment whose every replica is cooling down still has its requests tried (the cool-down ending first), never
refused outright while its replicas are ready."""

from serving.router import Route, Router, Target


def _target(*routes: Route) -> Target:
    return Target(deployment_id=1, name="chat", workspace_id=None, engine="llamacpp", state="ready",
                  capabilities={"chat"}, context_length=None, cooldown_s=30, model_path="", api_key="",
                  routes=list(routes))


ONE = Route(replica_id=1, base_url="http://127.0.0.1:9001/v1", weight=1.0, api_key="")
TWO = Route(replica_id=2, base_url="http://127.0.0.1:9002/v1", weight=1.0, api_key="")


def test_a_replica_cooling_down_is_passed_over_for_one_that_is_not():
    router = Router()
    router.cool_down(ONE, 30)
    assert {router.pick(_target(ONE, TWO), exclude=set()).replica_id for _ in range(20)} == {2}


def test_a_lone_replica_cooling_down_is_still_tried_once_per_request():
    router = Router()
    router.cool_down(ONE, 30)
    assert router.pick(_target(ONE), exclude=set()) == ONE
    assert router.pick(_target(ONE), exclude={1}) is None


def test_when_all_are_cooling_down_the_one_that_cools_down_first_is_tried():
    router = Router()
    router.cool_down(TWO, 60)
    router.cool_down(ONE, 5)
    assert router.pick(_target(ONE, TWO), exclude=set()) == ONE


def test_a_replica_restarted_at_another_address_is_not_held_to_the_old_cool_down():
    router = Router()
    router.cool_down(ONE, 30)
    restarted = Route(replica_id=1, base_url="http://127.0.0.1:9101/v1", weight=1.0, api_key="")
    assert {router.pick(_target(restarted, TWO), exclude=set()).replica_id for _ in range(20)} == {1, 2}
