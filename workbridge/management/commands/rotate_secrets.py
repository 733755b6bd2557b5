from django.apps import apps
from django.core.management.base import BaseCommand, CommandError

from workbridge.vault import EncryptedTextField, unreadable


class Command(BaseCommand):
    help = ("Re-encrypt every stored secret with the first key of FACTORY_SECRETS_KEY; run it after putting a new "
            "key first, then drop the old key once it has finished.")

    def handle(self, *args, **options):
        total, unread = 0, []
        for model in apps.get_models():
            for field in model._meta.fields:
                if isinstance(field, EncryptedTextField):
                    # Read decrypts with any configured key; the write encrypts with the first.
                    for pk, plain in model.objects.exclude(**{field.name: ""}).values_list("pk", field.name):
                        if unreadable(plain):
                            unread.append(f"{model._meta.label}.{field.name} of row {pk}")
                            continue
                        model.objects.filter(pk=pk).update(**{field.name: plain})
                        total += 1
        self.stdout.write(f"Re-encrypted {total} secret(s) with the first key of FACTORY_SECRETS_KEY.")
        if unread:
            raise CommandError(f"{len(unread)} secret(s) no configured key decrypts were left as they are (keep the "
                               f"key they were written with in the list, or enter them again): {', '.join(unread)}")
