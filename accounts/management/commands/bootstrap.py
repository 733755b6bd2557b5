from django.core.management.base import BaseCommand

from accounts.bootstrap import run_bootstrap


class Command(BaseCommand):
    help = "Create the default workspace and admin, register this node, and load the preset models. Safe to re-run."

    def handle(self, *args, **options):
        run_bootstrap(lambda line: self.stdout.write(line))
