from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from cluster import selectors


@login_required
def pool(request):
    jobs = selectors.jobs_for(workspace=request.workspace)[:20] if request.workspace else []
    return render(request, "cluster/pool.html", {
        "nodes": selectors.nodes(),
        "summary": selectors.pool_summary(),
        "jobs": jobs,
    })
