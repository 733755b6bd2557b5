"""What a workflow run records of its failures (a node's error, the run's), in English as the worker stores them;
accounts/log_messages.py shows them in the reader's language. A node's error is usually part of its run's
("Node 'x' failed: <the node's error>"), so both read translated. Values (node names, exception text) stay as
written."""

from accounts.log_messages import LogMessage

# The run's (agent_studio/workflows/runner.py, and an agent run cancelled before it started). `verbatim`: the
# values that are names, ids or data (a node's id, a JSON key such as "total"), never translated.
NODE_FAILED = LogMessage("Node '%(node)s' failed: %(reason)s", verbatim=("node",))
RUN_INTERRUPTED = LogMessage("The run was interrupted %(attempts)s times (its worker stopped); "
                             "giving up.", verbatim=("attempts",))
NO_ANSWER_NODE = LogMessage("The run reached no answer node.")
RUN_CANCELLED = LogMessage("The run was cancelled.")

# A node's (agent_studio/workflows/nodes.py)
NOT_RUN = LogMessage("'%(where)s' has no value: node '%(node)s' did not run (it is on a branch not "
                     "taken).", verbatim=("where", "node"))
NO_OUTPUT = LogMessage("'%(where)s' has no value: node '%(node)s' has no output '%(name)s'.",
                       verbatim=("where", "node", "name"))
NO_PART = LogMessage("'%(where)s' has no value: there is no '%(part)s' in %(value)s.",
                     verbatim=("where", "part", "value"))
MODEL_CALL_FAILED = LogMessage("The model call failed: %(error)s")
REPLY_NOT_JSON = LogMessage("The model's reply is not JSON (%(error)s): %(reply)s",
                            verbatim=("error", "reply"))
JSON_OFF_SCHEMA = LogMessage("The model's JSON does not fit the schema: %(problem)s",
                             verbatim=("problem",))
KNOWLEDGE_BASE_GONE = LogMessage("Knowledge base %(id)s no longer exists.", verbatim=("id",))
TOOL_GONE = LogMessage("Tool %(id)s no longer exists.", verbatim=("id",))
TOOL_FAILED = LogMessage("Tool %(tool)s failed: %(error)s", verbatim=("tool",))
NOT_A_NUMBER = LogMessage("'%(where)s' is %(value)s, not a number.", verbatim=("where", "value"))
TEMPLATE_FAILED = LogMessage("The template could not be rendered: %(error)s", verbatim=("error",))
HTTP_REFUSED = LogMessage("%(method)s %(url)s answered %(status)s.",
                          verbatim=("method", "url", "status"))
NOT_A_LIST = LogMessage("'%(items)s' is %(type)s, not a list.", verbatim=("items", "type"))
TOO_MANY_ITEMS = LogMessage("'%(items)s' has %(count)s items; an iteration goes through at most "
                            "%(limit)s (WORKFLOW_MAX_ITERATIONS).", verbatim=("items", "count", "limit"))
NO_VARIABLE_VALUE = LogMessage("None of %(variables)s has a value.", verbatim=("variables",))
AGENT_GONE = LogMessage("Agent %(id)s no longer exists.", verbatim=("id",))
AGENT_INPUT_EMPTY = LogMessage("The agent's input is empty.")
AGENT_RUN_ENDED = LogMessage("The agent's run %(run)s ended %(status)s: %(error)s", verbatim=("run",))
