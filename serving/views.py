from django.http import HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest


def prometheus_metrics(request):
    """Prometheus scrape endpoint: the gateway's latency histograms, labelled by deployment and replica."""
    return HttpResponse(generate_latest(), content_type=CONTENT_TYPE_LATEST)
