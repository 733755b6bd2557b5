"""Which language a person gets: the browser's Accept-Language by default, the choice made in the sidebar once made
(kept on the user's profile, so it follows them into a new session and another browser), and the API's human
messages in the request's language beside codes that stay English."""

import pytest
from django.test import Client

from accounts.models import Profile

pytestmark = pytest.mark.django_db


def sign_in(client: Client, username: str = "ann") -> None:
    answer = client.post("/login/", {"username": username, "password": "correct-horse-battery"})
    assert answer.status_code == 302, answer.content.decode()[:500]


def test_the_sign_in_page_follows_the_browsers_language():
    chinese = Client(HTTP_ACCEPT_LANGUAGE="zh-CN,zh;q=0.9,en;q=0.5").get("/login/").content.decode()
    english = Client(HTTP_ACCEPT_LANGUAGE="en-US,en;q=0.9").get("/login/").content.decode()

    assert '<html lang="zh-hans">' in chinese and "登录到你的工作区。" in chinese and "用户名" in chinese
    assert '<html lang="en">' in english and "Sign in to your workspace." in english


def test_the_choice_is_kept_for_the_user_and_wins_over_the_browser(make_workspace):
    make_workspace("Acme", owner="ann")
    first = Client(HTTP_ACCEPT_LANGUAGE="en")
    sign_in(first)
    assert "Dashboard" in first.get("/dashboard/").content.decode()

    switched = first.post("/language/", {"language": "zh-hans", "next": "/settings/"})

    assert switched.status_code == 302 and switched["Location"] == "/settings/"
    assert Profile.objects.get(user__username="ann").language == "zh-hans"
    page = first.get("/settings/").content.decode()
    assert "成员" in page and "审计日志" in page and "所有者" in page  # the members' roles too
    # Another browser that asks for English, a new session: the user's choice wins once they sign in.
    other = Client(HTTP_ACCEPT_LANGUAGE="en-US")
    assert "Sign in to your workspace." in other.get("/login/").content.decode()
    sign_in(other)
    assert "概览" in other.get("/dashboard/").content.decode()


def test_an_unknown_language_is_refused_and_changes_nothing(make_workspace):
    make_workspace("Acme", owner="ann")
    client = Client(HTTP_ACCEPT_LANGUAGE="en")
    sign_in(client)

    answer = client.post("/language/", {"language": "klingon", "next": "/dashboard/"}, follow=True)

    assert "Unknown language &#x27;klingon&#x27;." in answer.content.decode()
    assert not Profile.objects.filter(user__username="ann").exists()


def test_api_errors_keep_their_code_and_speak_the_requests_language(make_workspace, key_client):
    workspace = make_workspace("Acme", owner="ann")
    owner = key_client("ann", workspace, role="owner")

    chinese = owner.post("/api/members/", {"username": "nobody"}, format="json", HTTP_ACCEPT_LANGUAGE="zh-CN")
    english = owner.post("/api/members/", {"username": "nobody"}, format="json", HTTP_ACCEPT_LANGUAGE="en")
    missing = owner.get("/api/members/999999/", HTTP_ACCEPT_LANGUAGE="zh-CN")

    assert chinese.status_code == english.status_code == 400
    assert chinese.json()["error"]["code"] == english.json()["error"]["code"] == "invalid"
    assert chinese.json()["error"]["message"] == "没有名为“nobody”的用户。"
    assert english.json()["error"]["message"] == "No user is called 'nobody'."
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
