"""The web chat's opener and suggested questions, set on the app's page or through the API, and a thumbs down's
comment in the app's logs."""

import pytest
from django.test import Client

from runtime import services
from runtime.models import Channel, Trace, TraceStatus

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner(app) -> Client:
    client = Client()
    client.login(username="ann", password="correct-horse-battery")
    return client


def save(owner, app, **fields):
    form = {"action": "settings", "name": app.name, "rate_limit": "60", "allowed_origins": "", **fields}
    return owner.post(f"/apps/{app.slug}/", form, follow=True).content.decode()


def test_the_web_chat_opens_with_the_greeting_and_questions_set_on_the_app_page(owner, app):
    save(owner, app, opener="Hello! Ask me about the handbook.",
         suggested_questions="How many days of leave?\n\n  Who approves leave?  \n")
    app.refresh_from_db()
    assert (app.opener, app.suggested_questions) == ("Hello! Ask me about the handbook.",
                                                     ["How many days of leave?", "Who approves leave?"])

    widget = Client().get(f"/apps/{app.slug}/widget?token={app.widget_token}").content.decode()

    assert '<div class="turn assistant opener">Hello! Ask me about the handbook.</div>' in widget
    assert widget.count('class="suggestion"') == 2 and ">Who approves leave?</button>" in widget
    # Saving other settings keeps them.
    save(owner, app, name="Handbook helper")
    app.refresh_from_db()
    assert app.suggested_questions == ["How many days of leave?", "Who approves leave?"]


def test_too_many_suggestions_are_refused_with_the_reason(owner, app):
    page = save(owner, app, suggested_questions="\n".join(f"Question {n}?" for n in range(6)))
    assert "6 suggested questions; the web chat shows at most 5." in page
    app.refresh_from_db()
    assert app.suggested_questions == []


def test_the_api_sets_them_too(app, key_client, acme):
    api = key_client("ann", acme)
    reply = api.patch(f"/api/runtime/apps/{app.slug}/", {"opener": "Hi.", "suggested_questions": ["Why?"]},
                      format="json")
    assert (reply.status_code, reply.data["opener"], reply.data["suggested_questions"]) == (200, "Hi.", ["Why?"])
    refused = api.patch(f"/api/runtime/apps/{app.slug}/", {"opener": "x" * 2001}, format="json")
    assert refused.status_code == 400 and "keep it to 2000" in str(refused.data)


def test_a_thumbs_down_comment_shows_in_the_logs(owner, app):
    trace = Trace.objects.create(app=app, release=app.current_release, channel=Channel.WIDGET, query="Leave?",
                                 status=TraceStatus.OK)
    services.record_feedback(app=app, message_id=str(trace.public_id), rating="down", comment="Too vague.")

    logs = owner.get(f"/apps/{app.slug}/logs/?feedback=down").content.decode()

    cell = logs[logs.index('data-field="feedback"'):]
    cell = cell[:cell.index("</td>")]
    # The vote is an inline icon, not an emoji a machine without an emoji font draws as an empty box.
    assert 'data-rating="down"' in cell and "<svg" in cell and "👎" not in cell
    assert '<span class="small feedback-comment">“Too vague.”</span>' in cell
