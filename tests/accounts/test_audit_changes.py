"""Issue 48: every change the audit log records has words a person reads (accounts/audit_changes.py), and the list
names no change the code never records."""

import re
from pathlib import Path

from django.utils import translation

from accounts.audit_changes import AUDIT_CHANGES, audit_change_label
from enhancement.models import JobKind

ROOT = Path(__file__).resolve().parents[2]
APPS = ("accounts", "cluster", "assets", "serving", "workbridge", "rag_studio", "enhancement", "agent_studio",
        "runtime", "factory")
# `record_audit(..., action="rag.document.upload")`, and the cancel helper shared by agent and workflow
# evaluations, which is given its action as `audit_action=`.
ACTION = re.compile(r"""\b(?:action|audit_action)=["']([a-z_]+(?:\.[a-z_]+)+)["']""")


def recorded_actions() -> set[str]:
    found = set()
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            source = path.read_text()
            if "record_audit" in source or "audit_action" in source:
                found |= set(ACTION.findall(source))
    # enhancement/services.py records its jobs as f"enhancement.{kind}".
    return found | {f"enhancement.{kind}" for kind in JobKind.values}


def test_every_recorded_change_has_a_label_and_every_label_a_change():
    recorded = recorded_actions()

    assert len(recorded) > 70
    assert sorted(recorded - set(AUDIT_CHANGES)) == []
    assert sorted(set(AUDIT_CHANGES) - recorded) == []


def test_an_unknown_change_reads_as_its_code():
    with translation.override("en"):  # whatever language an earlier test's request left active in this thread
        assert audit_change_label("rag.document.upload") == "Uploaded documents"
    assert audit_change_label("future.thing") == "future.thing"
