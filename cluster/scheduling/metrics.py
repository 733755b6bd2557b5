"""The pool's figures for Prometheus, read from the database at each scrape (the scheduler runs in workers, the
scrape in web: gauges set in one process would not be seen in the other). Registered with prometheus_client's
registry when the cluster app loads, so `/metrics` (serving/views.py) serves them with the gateway's."""

import logging
from collections import Counter

from django.db import DatabaseError
from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from cluster.models import WorkloadState
from cluster.scheduling import selectors

logger = logging.getLogger(__name__)


class PoolCollector:
    def collect(self):
        try:
            view = selectors.pool_view(workspace=None, everything=True)
        except DatabaseError as exc:  # a scrape must not fail whole: the pool's figures are left out this time
            logger.warning("The pool's metrics could not be read: %s", exc)
            return
        devices = GaugeMetricFamily("factory_pool_devices", "Pool devices by node, kind and state",
                                    labels=["node", "device_kind", "state"])
        for node in view["nodes"]:
            for kind in node["devices"]:
                for state in ("in_use", "stopping", "idle"):
                    devices.add_metric([node["name"], kind["device_kind"], state], kind[state])
        yield devices
        for figure, help_text in (("nominal", "Devices guaranteed to the workspace's queue"),
                                  ("in_use", "Devices the workspace's jobs hold"),
                                  ("borrowed", "Devices held beyond the workspace's quota"),
                                  ("lent", "The workspace's idle quota devices in others' use")):
            family = GaugeMetricFamily(f"factory_pool_{figure}_devices", help_text, labels=["workspace", "device_kind"])
            for queue in view["queues"]:
                family.add_metric([queue["workspace"], queue["device_kind"]], queue[figure])
            yield family
        waiting = GaugeMetricFamily("factory_pool_waiting_jobs", "Jobs waiting for pool devices",
                                    labels=["workspace", "priority"])
        counts = Counter((job["workspace"], job["priority"]) for job in view["jobs"]
                         if job["state"] == WorkloadState.WAITING)
        for (workspace, priority), count in counts.items():
            waiting.add_metric([workspace, priority], count)
        yield waiting
        used = CounterMetricFamily("factory_pool_device_seconds", "Device-seconds used",
                                   labels=["workspace", "device_kind"])
        for row in view["usage"]:
            used.add_metric([row["workspace"], row["device_kind"]], row["device_hours"] * 3600)
        yield used

    def describe(self):
        return []  # collected at scrape time only: nothing to read while the registry is being built


def install() -> None:
    REGISTRY.register(PoolCollector())
