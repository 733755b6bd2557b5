"""Django's makemessages, that also takes each event-log template as a msgid: `LogMessage("...")` in an app's
log_messages.py marks its text for the catalogue as `gettext_noop("...")` would (accounts/log_messages.py)."""

from django.core.management.commands import makemessages


class Command(makemessages.Command):
    xgettext_options = [*makemessages.Command.xgettext_options, "--keyword=LogMessage"]
