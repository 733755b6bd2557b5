"""Every app's event-log templates reach the catalogue: makemessages takes the text of each `LogMessage("...")` as
a msgid, so a new template is there to translate and none already translated is dropped as obsolete."""

import ast
import importlib
import shutil
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

from accounts.log_messages import LogMessage

APPS_WITH_EVENT_LOGS = ["agent_studio", "cluster", "enhancement", "rag_studio", "serving"]


def _templates(app: str) -> set[str]:
    module = importlib.import_module(f"{app}.log_messages")
    return {value.template for value in vars(module).values() if isinstance(value, LogMessage)}


def _msgids(po: Path) -> set[str]:
    """The msgids of a .po file, each one's quoted lines joined."""
    msgids, parts = set(), None
    for line in po.read_text(encoding="utf-8").splitlines():
        if line.startswith("msgid "):
            parts = [ast.literal_eval(line.removeprefix("msgid "))]
        elif line.startswith('"') and parts is not None:
            parts.append(ast.literal_eval(line))
        elif parts is not None:
            msgids.add("".join(parts))
            parts = None
    return msgids - {""}


def test_makemessages_takes_every_event_log_template_as_a_msgid(tmp_path, monkeypatch):
    # A copy of the apps' log_messages.py and a catalogue of its own: the project's catalogue is left alone.
    for app in APPS_WITH_EVENT_LOGS:
        (tmp_path / app).mkdir()
        shutil.copy(settings.BASE_DIR / app / "log_messages.py", tmp_path / app)
    monkeypatch.chdir(tmp_path)

    with override_settings(LOCALE_PATHS=[tmp_path / "locale"]):
        call_command("makemessages", locale=["zh_Hans"], verbosity=0)

    templates = set().union(*(_templates(app) for app in APPS_WITH_EVENT_LOGS))
    assert "Node '%(node)s' failed: %(reason)s" in templates and "Queued on %(queue)s" in templates
    assert _msgids(tmp_path / "locale" / "zh_Hans" / "LC_MESSAGES" / "django.po") == templates
