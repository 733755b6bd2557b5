from django.core.management.base import BaseCommand, CommandError

from rag_studio.models import IndexBackend, KnowledgeBase
from rag_studio.search.index_store import StoreUnavailable
from rag_studio.search.move import MoveRefused, move_index


class Command(BaseCommand):
    help = ("Move a knowledge base's index to another store while it keeps serving: build it there from the stored "
            "vectors, switch, then drop the old copy (see rag_studio/search/move.py).")

    def add_arguments(self, parser):
        parser.add_argument("knowledge_base", type=int, help="the knowledge base's id")
        parser.add_argument("--to", required=True, choices=IndexBackend.values, help="the store to move it to")
        parser.add_argument("--settle-s", type=float, default=5.0,
                            help="how long index writes already under way are given to land after the switch")

    def handle(self, *args, knowledge_base: int, to: str, settle_s: float, **options):
        kb = KnowledgeBase.objects.filter(pk=knowledge_base).first()
        if kb is None:
            raise CommandError(f"There is no knowledge base {knowledge_base}.")
        try:
            count = move_index(kb, to, settle_s=settle_s, log=lambda line: self.stdout.write(f"==> {line}"))
        except (MoveRefused, StoreUnavailable) as exc:
            raise CommandError(str(exc))
        self.stdout.write(f"==> knowledge base {kb.pk} ({kb.name}) is on {to}: {count} chunks")
