"""The pool as people see it (the Pool page, `/api/cluster/pool/`, the metrics): devices by node and state, each
queue's quota against what it uses, borrows and lends, jobs with the reason they wait, device-hours per workspace.
A workspace sees its own queue and jobs; others' work is counted, never named. Platform administrators see all."""

from collections import defaultdict

from django.utils import timezone

from accounts.models import Workspace
from cluster.models import DeviceQuota, Node, Workload, WorkloadState
from cluster.scheduling import pool

HOLDING = (WorkloadState.RUNNING, WorkloadState.STOPPING)


def _live_device_seconds(workload: Workload, now) -> float:
    since = workload.accounted_at or workload.started_at
    if workload.state in HOLDING and since:
        return workload.device_seconds + workload.devices * max(0.0, (now - since).total_seconds())
    return workload.device_seconds


def device_hours() -> dict[tuple, float]:
    """(workspace slug, device kind) -> device-hours used, finished work included."""
    now = timezone.now()
    hours: dict[tuple, float] = defaultdict(float)
    for workload in Workload.objects.select_related("job__workspace"):
        slug = workload.job.workspace.slug if workload.job.workspace else ""
        hours[(slug, workload.device_kind)] += _live_device_seconds(workload, now) / 3600
    return hours


def queues(holding: list[Workload]) -> list[dict]:
    """Every queue with a quota or using devices: quota, limits, in use, borrowed (beyond its quota) and lent (its
    idle quota in others' use, counted once the pool's unassigned devices are used up)."""
    capacity = pool.capacity()
    used: dict[tuple, int] = defaultdict(int)
    for workload in holding:
        used[(workload.job.workspace_id, workload.device_kind)] += workload.devices
    rows = {(quota.workspace_id, quota.device_kind): quota for quota in DeviceQuota.objects.select_related("workspace")}
    slugs = {workload.job.workspace_id: workload.job.workspace.slug if workload.job.workspace else ""
             for workload in holding}
    slugs.update({key[0]: quota.workspace.slug for key, quota in rows.items()})
    table = []
    for key in sorted(set(rows) | set(used), key=lambda k: (k[1], slugs.get(k[0], ""))):
        quota = rows.get(key)
        nominal = quota.nominal if quota else 0
        table.append({"workspace": slugs.get(key[0], ""), "workspace_id": key[0], "device_kind": key[1],
                      "nominal": nominal, "borrowing_limit": quota.borrowing_limit if quota else None,
                      "lending_limit": quota.lending_limit if quota else None, "in_use": used[key],
                      "borrowed": max(0, used[key] - nominal), "lent": 0})
    for kind in {row["device_kind"] for row in table}:
        kind_rows = [row for row in table if row["device_kind"] == kind]
        total = sum(kinds.get(kind, 0) for kinds in capacity.values())
        unassigned = max(0, total - sum(row["nominal"] for row in kind_rows))
        unassigned_used = min(unassigned, sum(max(0, row["in_use"] - row["nominal"]) for row in kind_rows))
        to_place = sum(row["borrowed"] for row in kind_rows) - unassigned_used
        for row in kind_rows:
            idle = max(0, row["nominal"] - row["in_use"])
            lendable = idle if row["lending_limit"] is None else min(idle, row["lending_limit"])
            row["lent"] = min(lendable, max(0, to_place))
            to_place -= row["lent"]
    return table


def pool_view(*, workspace: Workspace | None, everything: bool) -> dict:
    """The Pool page's and API's content. `everything`: a platform administrator's view (every workspace named)."""
    now = timezone.now()
    workspace_id = workspace.pk if workspace else None
    live = list(pool.live_workloads().select_related("job__workspace"))
    holding = [workload for workload in live if workload.state in HOLDING]
    nodes = []
    for node in Node.objects.prefetch_related("devices"):
        kinds = []
        for kind, total in pool.node_kinds(node).items():
            mine = [w for w in holding if w.device_kind == kind and node.name in w.allocation]
            in_use = sum(w.allocation[node.name] for w in mine)
            stopping = sum(w.allocation[node.name] for w in mine if w.state == WorkloadState.STOPPING)
            kinds.append({"device_kind": kind, "total": total, "in_use": in_use, "stopping": stopping,
                          "idle": max(0, total - in_use) if node.status == "healthy" else 0,
                          "jobs": [w.job_id for w in mine if everything or w.job.workspace_id == workspace_id]})
        nodes.append({"name": node.name, "status": node.status, "devices": kinds})
    visible = [row for row in queues(holding) if everything or row["workspace_id"] == workspace_id]
    jobs = []
    for workload in live:
        if not everything and workload.job.workspace_id != workspace_id:
            continue
        waited_until = workload.started_at if workload.state != WorkloadState.WAITING else now
        jobs.append({"job": workload.job_id, "kind": workload.job.kind, "workspace": workload.job.workspace.slug
                     if workload.job.workspace else "", "state": workload.state, "priority": workload.priority,
                     "device_kind": workload.device_kind, "min_devices": workload.min_devices,
                     "max_devices": workload.max_devices, "devices": workload.devices,
                     "allocation": workload.allocation, "reason": workload.reason,
                     "submitted_at": workload.submitted_at, "started_at": workload.started_at,
                     "waited_s": round(max(0.0, ((waited_until or now) - workload.submitted_at).total_seconds()), 1),
                     "last_checkpoint_at": workload.last_checkpoint_at, "preemptions": workload.preemptions})
    waiting_elsewhere = sum(1 for w in live if w.state == WorkloadState.WAITING and w.job.workspace_id != workspace_id)
    usage = [{"workspace": slug, "device_kind": kind, "device_hours": round(hours, 3)}
             for (slug, kind), hours in sorted(device_hours().items())
             if everything or (workspace is not None and slug == workspace.slug)]
    return {"nodes": nodes, "queues": visible, "jobs": jobs, "usage": usage,
            "waiting_in_other_workspaces": 0 if everything else waiting_elsewhere}
