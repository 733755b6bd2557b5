import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from serving.models import Deployment, ServingState


class Command(BaseCommand):
    help = "Wait until every deployment that should run is ready, printing their states and why any is not."

    def add_arguments(self, parser):
        parser.add_argument("--timeout", type=float, default=180)

    def handle(self, *args, timeout, **options):
        deadline = time.monotonic() + timeout
        while True:
            wanted = list(Deployment.objects.filter(desired_running=True).order_by("name"))
            waiting = [d for d in wanted if d.state != ServingState.READY]
            failed = [d for d in waiting if d.state == ServingState.FAILED]
            if not waiting or failed or time.monotonic() > deadline:
                break
            time.sleep(1)
        for deployment in wanted:
            self.stdout.write(f"    {deployment.name:28} {deployment.state}")
            if deployment.state == ServingState.READY:
                continue
            for replica in deployment.replicas.exclude(state=ServingState.READY):
                problem = replica.last_error or "no error recorded yet"
                self.stdout.write(f"      replica {replica.pk} on {replica.node.name}: {replica.state}: {problem}")
        if failed or waiting:
            engines = settings.DATA_DIR / "engines"
            raise CommandError(f"Some deployments are not ready: see the Models & Serving page, logs/node.log (the "
                               f"node worker starts engines) and each engine's own log in {engines}/.")
