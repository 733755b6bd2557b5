"""A deployment's history, in English as stored; accounts/log_messages.py shows it in the reader's language."""

from accounts.log_messages import LogMessage

CREATED = LogMessage("Created with %(count)s replica(s)")
START_REQUESTED = LogMessage("Start requested")
STOP_REQUESTED = LogMessage("Stop requested")
EXTERNAL_ANSWERS = LogMessage("External endpoint answers")
ENGINE_ANSWERS = LogMessage("Engine pid %(pid)s answers at %(address)s; tool calls: %(strategy)s")
ENGINE_STOPPED = LogMessage("Engine stopped")
ENGINE_DIED = LogMessage("Engine pid %(pid)s died; restart in %(delay)ss")
RESTARTING = LogMessage("Restarting after a crash")
STOPPED_WITH_PLATFORM = LogMessage("Stopped with the platform")
