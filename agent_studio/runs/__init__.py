"""The plumbing agent runs and workflow runs share, named for what it is: their states and fields (`fields`), claiming
a run and keeping its lease (`leases`), cancelling it whatever it waits on (`cancel`), its events as server-sent
events (`streaming`), and queueing and stopping their evaluations (`evaluations`)."""
