"""A model group's page in Chromium: the calibration curve drawn from a finished run, a point clicked on it, and the
group taking that point's policy and threshold."""

import pytest
from playwright.sync_api import expect

from accounts.services import SYSTEM
from cluster import inventory
from cluster.services import register_node
from serving import services
from serving.groups import calibration, services as group_services
from serving.models import CalibrationRun, CalibrationState, ModelGroup
from serving.presets import GEMMA3, SMOLLM2, register_presets
from tests.e2e.conftest import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _outcome(score, confidence, small_quality):
    return {"prompt": "p", "reference": "r", "route_score": score,
            "small": {"answer": "a", "quality": small_quality, "tokens": 10, "confidence": confidence},
            "big": {"answer": "b", "quality": 1.0, "tokens": 20, "confidence": None}}


def test_the_curve_is_drawn_and_a_clicked_point_sets_the_threshold(browser_page, make_workspace, settings):
    workspace = make_workspace("Acme", "ann")
    node = register_node(name=settings.NODE_NAME, resources=inventory.probe())
    models = register_presets(lambda line: None)
    big, small = (services.create_deployment(actor=SYSTEM, workspace=None, model=models[name], name=name,
                                             replicas=[(node, 1.0)]) for name in (GEMMA3, SMOLLM2))
    group = group_services.create_group(actor=SYSTEM, workspace=workspace, name="assistant", policy="route",
                                        big=big, small=small, threshold=0.5)
    outcomes = [_outcome(0.1, 0.9, 1.0), _outcome(0.6, 0.3, 0.0), _outcome(0.9, 0.8, 0.5)]
    drawn = calibration.curves(outcomes)
    CalibrationRun.objects.create(group=group, workspace=workspace, source="uploaded faq.jsonl", metric="token_f1",
                                  items=[{"prompt": "p", "reference": "r"}] * 3, outcomes=outcomes, curves=drawn,
                                  summary=calibration.summary(outcomes, drawn), state=CalibrationState.DONE)
    page = browser_page
    sign_in(page)

    page.goto("/serving/groups/assistant/")
    dots = page.locator("#chart-curve circle.curve-point")
    expect(dots).to_have_count(len(drawn["route"]) + len(drawn["cascade"]))
    page.locator("#chart-curve circle[data-policy='cascade'][data-threshold='0.8']").click()

    expect(page.locator("table.curve-points[data-policy='cascade'] tr.chosen")).to_contain_text("0.8")
    group.refresh_from_db()
    assert (group.policy, group.threshold) == ("cascade", 0.8)
    assert ModelGroup.objects.count() == 1
