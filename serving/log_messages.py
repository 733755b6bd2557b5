"""A deployment's history, in English as stored; accounts/log_messages.py shows it in the reader's language."""

from django.utils.translation import gettext_noop

from accounts.log_messages import LogMessage

CREATED = LogMessage(gettext_noop("Created with %(count)s replica(s)"))
START_REQUESTED = LogMessage(gettext_noop("Start requested"))
STOP_REQUESTED = LogMessage(gettext_noop("Stop requested"))
EXTERNAL_ANSWERS = LogMessage(gettext_noop("External endpoint answers"))
ENGINE_ANSWERS = LogMessage(gettext_noop("Engine pid %(pid)s answers at %(address)s; tool calls: %(strategy)s"))
ENGINE_STOPPED = LogMessage(gettext_noop("Engine stopped"))
ENGINE_DIED = LogMessage(gettext_noop("Engine pid %(pid)s died; restart in %(delay)ss"))
RESTARTING = LogMessage(gettext_noop("Restarting after a crash"))
STOPPED_WITH_PLATFORM = LogMessage(gettext_noop("Stopped with the platform"))
