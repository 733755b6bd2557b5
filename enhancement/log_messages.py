"""A job's events written by the enhancement runner, in English as stored; accounts/log_messages.py shows them in
the reader's language."""

from django.utils.translation import gettext_noop

from accounts.log_messages import LogMessage

CONTINUING = LogMessage(gettext_noop("The job's process had stopped; continuing from its last finished stage"))
STOPPED_WITHOUT_FINISHING = LogMessage(gettext_noop("The job's process stopped without finishing:\n%(log)s"))
