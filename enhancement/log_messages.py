"""A job's events written by the enhancement runner, in English as stored; accounts/log_messages.py shows them in
the reader's language."""

from accounts.log_messages import LogMessage

CONTINUING = LogMessage("The job's process had stopped; continuing from its last finished stage")
STOPPED_WITHOUT_FINISHING = LogMessage("The job's process stopped without finishing:\n%(log)s")
