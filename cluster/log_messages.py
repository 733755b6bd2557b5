"""A job's events, in English as stored; accounts/log_messages.py shows them in the reader's language."""

from django.utils.translation import gettext_noop

from accounts.log_messages import LogMessage

QUEUED_ON = LogMessage(gettext_noop("Queued on %(queue)s"))
CANCELLED_BY_USER = LogMessage(gettext_noop("Cancelled by user"))
STARTED_ON = LogMessage(gettext_noop("Started on %(worker)s"))
RESTARTED_ON = LogMessage(gettext_noop("Restarted after its worker stopped on %(worker)s"))
DONE = LogMessage(gettext_noop("Done"))
# Beat's sweep of overdue jobs (cluster/deadlines.py): a job sent again counts its dispatches by this prefix.
DISPATCHED_AGAIN = LogMessage(gettext_noop("Dispatched again (%(count)s of %(limit)s): %(reason)s"))
NODE_UNHEALTHY_WAITED = LogMessage(gettext_noop("Node '%(node)s' is unhealthy: its worker has not answered "
                                                "heartbeats, and the job waited %(seconds)s s without starting."))
MESSAGE_LOST = LogMessage(gettext_noop("Its message was not taken within %(seconds)s s on a healthy node (lost, e.g. "
                                       "with a Redis restart)"))
WORKER_SILENT = LogMessage(gettext_noop("Its worker (%(worker)s) stopped its heartbeat for %(seconds)s s (killed, or "
                                        "its machine lost)"))
GAVE_UP = LogMessage(gettext_noop("%(reason)s; gave up after %(count)s dispatches."))
