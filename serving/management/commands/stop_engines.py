from django.core.management.base import BaseCommand

from serving.engines import process
from serving.services import stop_local_replicas


class Command(BaseCommand):
    help = "Stop every engine process of this node (make stop). `make run` starts them again."

    def handle(self, *args, **options):
        try:
            recorded = stop_local_replicas()
        except Exception as exc:  # whatever the database says, the engines are stopped below
            self.stderr.write(f"warning: the replicas' states could not be recorded ({exc.__class__.__name__}: "
                              f"{exc}); their engines are stopped by the PIDs they were launched with")
            recorded = 0
        unrecorded = process.terminate_launched()
        self.stdout.write(f"==> stopped {recorded} engine process(es) of this node's replicas")
        if unrecorded:
            self.stdout.write(f"==> stopped {len(unrecorded)} engine process(es) no replica recorded (pids "
                              f"{', '.join(map(str, unrecorded))})")
