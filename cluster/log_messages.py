"""A job's events, in English as stored; accounts/log_messages.py shows them in the reader's language."""

from accounts.log_messages import LogMessage

QUEUED_ON = LogMessage("Queued on %(queue)s")
CANCELLED_BY_USER = LogMessage("Cancelled by user")
STARTED_ON = LogMessage("Started on %(worker)s")
RESTARTED_ON = LogMessage("Restarted after its worker stopped on %(worker)s")
DONE = LogMessage("Done")
# Beat's sweep of overdue jobs (cluster/deadlines.py): a job sent again counts its dispatches by this prefix.
DISPATCHED_AGAIN = LogMessage("Dispatched again (%(count)s of %(limit)s): %(reason)s")
NODE_UNHEALTHY_WAITED = LogMessage("Node '%(node)s' is unhealthy: its worker has not answered "
                                   "heartbeats, and the job waited %(seconds)s s without starting.")
MESSAGE_LOST = LogMessage("Its message was not taken within %(seconds)s s on a healthy node (lost, e.g. "
                          "with a Redis restart)")
WORKER_SILENT = LogMessage("Its worker (%(worker)s) stopped its heartbeat for %(seconds)s s (killed, or "
                           "its machine lost)")
GAVE_UP = LogMessage("%(reason)s; gave up after %(count)s dispatches.")
# The pool's scheduler (cluster/scheduling/pool.py).
ADMITTED = LogMessage("Admitted by the pool: %(devices)s")
PREEMPTED = LogMessage("Preempted by job %(job)s (%(priority)s): checkpointing at the next step, then waiting "
                       "for devices again")
SHRINKING = LogMessage("Shrinking to %(devices)s devices for job %(job)s (%(priority)s) at the next checkpoint")
GROWING = LogMessage("Growing to %(devices)s devices at the next checkpoint")
RESTARTING = LogMessage("Checkpointed; restarting on %(devices)s devices")
REQUEUED = LogMessage("Checkpointed and requeued; resumes when %(devices)s %(kind)s are free")
WAITING_FOR_DEVICES = LogMessage("Waiting for %(devices)s %(kind)s from the pool (%(priority)s)")
# Why a workload waits (cluster/scheduling/policy.py), from parts that are messages themselves. The variant with a
# node too small comes first: the plain one's pattern would match its text too.
WAITING_NO_NODE_ROOMY = LogMessage("waiting: needs %(devices)s %(kind)s; %(in_use)s; %(borrow)s; no single node has "
                                   "%(needed)s free; %(place)s")
WAITING = LogMessage("waiting: needs %(devices)s %(kind)s; %(in_use)s; %(borrow)s; %(place)s")
QUOTA_IN_USE_BY = LogMessage("%(used)s of %(quota)s %(kind)s in your quota in use by job %(jobs)s")
QUOTA_IN_USE = LogMessage("%(used)s of %(quota)s %(kind)s in your quota in use")
BORROWING_LIMIT_REACHED = LogMessage("your borrowing limit of %(limit)s is reached")
IDLE_TO_BORROW = LogMessage("%(count)s idle to borrow")
PLACE_IN_QUEUE = LogMessage("number %(place)s in your queue")
