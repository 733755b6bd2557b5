"""The workflow canvas in a user's first hour, in Chromium at 1440×900 and 1280×720, in English and in Chinese. Each
shipped template, made from the Workflows page as a user makes it, opens with every node inside the canvas, at a size
whose text can be read, and stays so after Fit; while the page's "Created" banner shows, no control (Save, the zoom
buttons, the language chooser) lies beyond the window's edge, and the Inputs table keeps to its panel. On a new
workflow, a template node put between start and the answer leaves the first wire, start straight to the answer:
Save names it, the user clicks it and deletes it with the keyboard (Delete in English, Backspace in Chinese), undo
and redo bring it back and take it away again, and it stays deleted after Save and a reload. A node copied and
pasted comes with a fresh id, and undo takes it away."""

import os

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect, sync_playwright

from accounts.services import SYSTEM, Actor, create_workspace
from agent_studio.workflows import catalog
from cluster import inventory
from cluster.services import register_node
from rag_studio import services as rag_services
from serving import presets
from serving.services import create_deployment
from tests.conftest import WORKER_NODE, stop_engines_and_flush
from tests.e2e.conftest import CHROMIUM, CHROMIUM_ARGS, sign_in
from tests.e2e.test_workflow_canvas import drag_from_palette, wire

pytestmark = [pytest.mark.browser]

CHAT = "canvas-chat"
# Below this, on screen, a node's text is too small to read (the canvas used to open at 60%: about 6 px).
LEAST_TEXT_PX = 8
# Each language and each size once: English, whose labels run longest, on the smaller screen.
CASES = [("zh-hans", 1440, 900), ("en", 1280, 720)]

# Each wire as "from>to", by the node ids shown on the canvas.
WIRES = """() => [...document.querySelectorAll('.drawflow .connection')].map((wire) => {
  const node = (prefix) => {
    const id = [...wire.classList].find((name) => name.startsWith(prefix)).slice(prefix.length);
    return document.getElementById(id).dataset.node;
  };
  return `${node('node_out_')}>${node('node_in_')}`;
}).sort()"""
# The visible controls that lie, even in part, beyond the window's edge.
CONTROLS_OUTSIDE = """() => [...document.querySelectorAll('button, select, input:not([type=hidden]), a[href]')]
  .filter((control) => control.getClientRects().length && getComputedStyle(control).visibility !== 'hidden')
  .filter((control) => {
    const box = control.getBoundingClientRect();
    return box.left < 0 || box.top < 0 || box.right > innerWidth || box.bottom > innerHeight;
  }).map((control) => control.outerHTML.slice(0, 120))"""
# The nodes that lie, even in part, outside the canvas; and the smallest node text as drawn on screen.
NODES_OUTSIDE = """() => {
  const canvas = document.getElementById('wf-drawflow').getBoundingClientRect();
  return [...document.querySelectorAll('.drawflow-node')].filter((node) => {
    const box = node.getBoundingClientRect();
    return box.left < canvas.left - 1 || box.top < canvas.top - 1 || box.right > canvas.right + 1
      || box.bottom > canvas.bottom + 1;
  }).map((node) => node.dataset.node);
}"""
SMALLEST_TEXT_PX = """() => Math.min(...[...document.querySelectorAll('.drawflow-node :is(.wf-kind, .wf-summary)')]
  .map((text) => {
    const scale = text.getBoundingClientRect().height / text.offsetHeight;
    return parseFloat(getComputedStyle(text).fontSize) * scale;
  }))"""
# A point on the middle of the wire from one node to another, in the window.
WIRE_MIDDLE = """([source, target]) => {
  const id = (name) => document.querySelector(`.drawflow-node[data-node=${name}]`).id;
  const path = document.querySelector(`.connection.node_out_${id(source)}.node_in_${id(target)} .main-path`);
  const point = path.getPointAtLength(path.getTotalLength() / 2).matrixTransform(path.getScreenCTM());
  return [point.x, point.y];
}"""


@pytest.fixture(scope="module")
def platform(web_server, django_db_blocker):
    """A workspace with a chat deployment (never started: nothing here runs a flow) and a knowledge base, the
    assets the templates ask for."""
    with django_db_blocker.unblock():
        user = get_user_model().objects.create_user(username="lin", password="correct-horse-battery")
        workspace = create_workspace(actor=Actor(user=user), name="Support")
        node = register_node(name=WORKER_NODE, resources=inventory.probe())
        models = presets.register_presets(lambda line: None)
        create_deployment(actor=SYSTEM, workspace=None, model=models[presets.SMOLLM2], name=CHAT,
                          replicas=[(node, 1.0)])
        kb = rag_services.create_knowledge_base(actor=Actor(user=user), workspace=workspace, name="Handbook")
        yield {"url": web_server, "kb": kb.pk}
        stop_engines_and_flush()


@pytest.fixture(scope="module")
def browser():
    # Playwright's sync API runs an event loop in this thread; the fixtures' ORM calls are still synchronous.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()
    os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


def assert_nothing_hides(page) -> None:
    expect(page.locator(".messages .msg")).to_be_visible()
    assert page.evaluate(CONTROLS_OUTSIDE) == []
    page.locator("[data-tab=inputs]").click()
    table, panel = page.locator(".wf-inputs").bounding_box(), page.locator(".wf-side").bounding_box()
    assert table["x"] + table["width"] <= panel["x"] + panel["width"]
    page.locator("[data-tab=node]").click()


@pytest.mark.parametrize(("language", "width", "height"), CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}" for c in CASES])
def test_templates_fit_the_canvas_and_a_leftover_wire_goes_with_the_keyboard(platform, browser, language, width,
                                                                             height):
    case = f"{language}-{width}"
    context = browser.new_context(base_url=platform["url"], viewport={"width": width, "height": height})
    page = context.new_page()
    page.set_default_timeout(20_000)
    sign_in(page, username="lin")
    if page.locator("#language-select").input_value() != language:
        with page.expect_navigation():
            page.locator("#language-select").select_option(language)

    for key, template in catalog.templates().items():
        page.goto("/workflows/")
        form = page.locator(f"form[data-template={key}]")
        form.locator("input[name=name]").fill(f"{key}-{case}")
        form.locator("select[name=binding-model]").select_option(CHAT)
        if "knowledge_base" in template["bindings"]:
            form.locator("select[name=binding-knowledge_base]").select_option(str(platform["kb"]))
        form.locator("button[type=submit]").click()
        page.wait_for_url("**/workflows/*/")
        expect(page.locator(".drawflow-node")).to_have_count(len(template["graph"]["nodes"]))
        assert page.evaluate(NODES_OUTSIDE) == [], f"{key} opens with nodes outside the canvas"
        assert page.evaluate(SMALLEST_TEXT_PX) >= LEAST_TEXT_PX, f"{key} opens too small to read"
        assert_nothing_hides(page)
        page.locator(".wf-zoom-fit").click()
        assert page.evaluate(NODES_OUTSIDE) == [], f"{key} has nodes outside the canvas after Fit"

    page.goto("/workflows/")
    page.locator("#workflow-name").fill(f"blank-{case}")
    page.locator("#new-workflow button[type=submit]").click()
    page.wait_for_url("**/workflows/*/")
    expect(page.locator(".drawflow-node")).to_have_count(2)
    assert_nothing_hides(page)
    answer = page.locator(".drawflow-node[data-node=answer]").bounding_box()
    canvas = page.locator("#wf-drawflow").bounding_box()
    drag_from_palette(page, "template", int(answer["x"] - canvas["x"]), int(answer["y"] - canvas["y"] + 160))
    wire(page, "start", "template_1")
    wire(page, "template_1", "answer")
    assert page.evaluate(WIRES) == ["start>answer", "start>template_1", "template_1>answer"]
    page.locator(".wf-save").click()
    expect(page.locator(".wf-message.warning")).to_contain_text("answer")

    page.mouse.click(*page.evaluate(WIRE_MIDDLE, ["start", "answer"]))
    page.keyboard.press("Delete" if language == "en" else "Backspace")
    assert page.evaluate(WIRES) == ["start>template_1", "template_1>answer"]
    page.keyboard.press("Control+z")
    assert page.evaluate(WIRES) == ["start>answer", "start>template_1", "template_1>answer"]
    page.keyboard.press("Control+Shift+z")
    assert page.evaluate(WIRES) == ["start>template_1", "template_1>answer"]

    page.locator(".drawflow-node[data-node=template_1]").click()
    page.keyboard.press("Control+c")
    page.keyboard.press("Control+v")
    expect(page.locator(".drawflow-node[data-node=template_2]")).to_be_visible()
    page.keyboard.press("Control+z")
    expect(page.locator(".drawflow-node")).to_have_count(3)

    page.locator(".wf-save").click()
    expect(page.locator(".wf-message.success")).to_be_visible()
    page.reload()
    expect(page.locator(".drawflow-node")).to_have_count(3)
    assert page.evaluate(WIRES) == ["start>template_1", "template_1>answer"]
    context.close()
