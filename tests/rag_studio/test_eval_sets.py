"""Deleting an eval set: through the service, by a developer, written to the audit log."""

from accounts.models import AuditEntry
from rag_studio import services
from rag_studio.evals import evaluation
from rag_studio.models import EvalItem, EvalSet

CSV = b"question,expected_answer\nHow many days of leave?,25 days\nWho approves leave?,Your manager\n"


def test_deleting_an_eval_set_is_audited_and_needs_a_developer(acme, ann, key_client):
    kb = services.create_knowledge_base(actor=ann, workspace=acme, name="Handbook")
    eval_set = evaluation.upload_eval_set(actor=ann, kb=kb, name="Leave", filename="leave.csv", content=CSV)

    viewer = key_client("ann", acme, role="viewer")
    assert viewer.delete(f"/api/rag/eval-sets/{eval_set.pk}/").status_code == 403
    assert EvalSet.objects.filter(pk=eval_set.pk).exists()

    response = key_client("dev", acme).delete(f"/api/rag/eval-sets/{eval_set.pk}/")
    assert response.status_code == 204
    assert not EvalSet.objects.filter(pk=eval_set.pk).exists()
    assert not EvalItem.objects.filter(eval_set_id=eval_set.pk).exists()
    entry = AuditEntry.objects.get(workspace=acme, action="rag.evalset.delete")
    assert (entry.actor.username, entry.target_type, entry.target_id) == ("dev", "rag_studio.evalset", str(eval_set.pk))
    assert entry.detail == {"name": "Leave", "items": 2, "runs": 0}
