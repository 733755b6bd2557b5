from django.core.management.base import BaseCommand

from serving.services import stop_local_replicas


class Command(BaseCommand):
    help = "Stop every engine process of this node (make stop). `make run` starts them again."

    def handle(self, *args, **options):
        stopped = stop_local_replicas()
        self.stdout.write(f"==> stopped {stopped} engine process(es)")
