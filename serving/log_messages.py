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
START_FAILED = LogMessage("The start failed on node %(node)s: %(error)s (its worker's log, logs/node.log under "
                          "make run, has the whole trace)")
KEY_UNREADABLE = LogMessage("Its engine key cannot be decrypted with this installation's secrets key "
                            "(FACTORY_SECRETS_KEY or the data dir's secrets.key changed); the engine is restarted "
                            "with a new key")
RESTARTED_BY_RUN = LogMessage("Its start had ended without it (%(reason)s); started again by make run")
