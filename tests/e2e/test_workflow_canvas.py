"""The workflow canvas in Chromium, on the real web process and Celery worker: create a workflow, replace its answer
node, drag a template and an answer node from the palette, wire start → template → answer, point the answer at the
template's output with the variable picker, save, run it with an input and watch the nodes light up with their
outputs; then compare two versions and roll back."""

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from accounts.services import Actor, create_workspace
from tests.e2e.conftest import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.worker]


@pytest.fixture
def platform(celery_worker_process, web_server, django_db_blocker):
    with django_db_blocker.unblock():
        user = get_user_model().objects.create_user(username="wen", password="correct-horse-battery")
        create_workspace(actor=Actor(user=user), name="Flows")
    return web_server


def drag_from_palette(page, kind: str, x: int, y: int) -> None:
    page.locator(f".wf-kinds li[data-kind={kind}]").drag_to(page.locator("#wf-drawflow"),
                                                            target_position={"x": x, "y": y})


def wire(page, source: str, target: str) -> None:
    """Press on the source node's output dot, move onto the target node and let go, as a person draws a wire."""
    dot = page.locator(f".drawflow-node[data-node={source}] .output").first.bounding_box()
    node = page.locator(f".drawflow-node[data-node={target}]").bounding_box()
    page.mouse.move(dot["x"] + dot["width"] / 2, dot["y"] + dot["height"] / 2)
    page.mouse.down()
    page.mouse.move(node["x"] + node["width"] / 2, node["y"] + node["height"] / 2, steps=5)
    page.mouse.up()


def workflow_id(page) -> str:
    return page.url.rstrip("/").rsplit("/", 1)[-1]


def test_build_a_flow_on_the_canvas_save_it_run_it_and_roll_it_back(platform, open_page):
    page = open_page(platform)
    page.set_viewport_size({"width": 1600, "height": 900})
    sign_in(page, username="wen")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Workflows").click()
    page.get_by_label("Name", exact=True).fill("greeter")
    page.get_by_role("button", name="Create", exact=True).click()
    expect(page.locator(".msg.success")).to_contain_text("Created greeter")
    expect(page.locator(".drawflow-node[data-node=answer]")).to_be_visible()

    page.locator(".drawflow-node[data-node=answer]").click()
    page.get_by_role("button", name="Delete the node").click()
    expect(page.locator(".drawflow-node")).to_have_count(1)
    drag_from_palette(page, "template", 290, 60)
    page.get_by_label("Jinja template").fill("Hello {{ start.question }}!")
    drag_from_palette(page, "answer", 540, 60)
    wire(page, "start", "template_1")
    wire(page, "template_1", "answer_1")
    expect(page.locator(".drawflow .connection")).to_have_count(2)

    page.locator(".drawflow-node[data-node=answer_1]").click()
    page.get_by_label("Answer", exact=True).fill("")
    page.get_by_label("Insert a variable").select_option("template_1.output")
    expect(page.get_by_label("Answer", exact=True)).to_have_value("{{template_1.output}}")
    page.get_by_role("button", name="Save").click()
    expect(page.locator(".wf-message")).to_have_text("Saved: version 2.")

    # A moved node keeps its place for whoever opens the canvas next, and moving it makes no version.
    template = page.locator(".drawflow-node[data-node=template_1]")
    box = template.bounding_box()
    with page.expect_response(lambda response: response.request.method == "PUT"
                              and response.url.endswith(f"/api/workflows/{workflow_id(page)}/")) as moved:
        page.mouse.move(box["x"] + 20, box["y"] + 10)
        page.mouse.down()
        page.mouse.move(box["x"] + 20, box["y"] + 210, steps=5)
        page.mouse.up()
    assert moved.value.ok
    place = template.evaluate("node => [node.style.left, node.style.top]")
    page.reload()
    expect(page.locator(".drawflow-node[data-node=template_1]")).to_be_visible()
    assert page.locator(".drawflow-node[data-node=template_1]").evaluate(
        "node => [node.style.left, node.style.top]") == place
    expect(page.locator(".wf-version")).to_have_text("v2")

    page.get_by_role("tab", name="Run").click()
    page.get_by_label("question *").fill("Ann")
    page.get_by_role("button", name="Run", exact=True).click()
    answer = page.locator(".drawflow-node[data-node=answer_1]")
    expect(answer).to_have_attribute("data-status", "done", timeout=30_000)
    expect(answer.locator(".wf-result")).to_contain_text("Hello Ann!")
    expect(page.locator(".drawflow-node[data-node=template_1]")).to_have_attribute("data-status", "done")
    expect(page.locator(".wf-run-answer")).to_have_text("Hello Ann!")

    page.get_by_role("tab", name="Versions").click()
    page.locator(".wf-diff-from").select_option("1")
    page.locator(".wf-diff-to").select_option("2")
    page.get_by_role("button", name="Compare").click()
    expect(page.locator(".wf-diff .added")).to_contain_text(["Node template_1 added", "Node answer_1 added"])
    expect(page.locator(".wf-diff .removed").first).to_contain_text("Node answer removed")
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator(".wf-versions tr[data-version='1']").get_by_role("button", name="Roll back to this").click()
    expect(page.locator(".wf-message")).to_have_text("Rolled back: version 3 has version 1's graph.")
    expect(page.locator(".drawflow-node[data-node=answer]")).to_be_visible()
    expect(page.locator(".wf-version")).to_have_text("v3")
