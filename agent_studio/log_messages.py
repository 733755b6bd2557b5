"""What a workflow run records of its failures (a node's error, the run's), in English as the worker stores them;
accounts/log_messages.py shows them in the reader's language. A node's error is usually part of its run's
("Node 'x' failed: <the node's error>"), so both read translated. Values (node names, exception text) stay as
written."""

from django.utils.translation import gettext_noop

from accounts.log_messages import LogMessage

# The run's (agent_studio/workflows/runner.py, and an agent run cancelled before it started). `verbatim`: the
# values that are names, ids or data (a node's id, a JSON key such as "total"), never translated.
NODE_FAILED = LogMessage(gettext_noop("Node '%(node)s' failed: %(reason)s"), verbatim=("node",))
RUN_INTERRUPTED = LogMessage(gettext_noop("The run was interrupted %(attempts)s times (its worker stopped); "
                                          "giving up."), verbatim=("attempts",))
NO_ANSWER_NODE = LogMessage(gettext_noop("The run reached no answer node."))
RUN_CANCELLED = LogMessage(gettext_noop("The run was cancelled."))

# A node's (agent_studio/workflows/nodes.py)
NOT_RUN = LogMessage(gettext_noop("'%(where)s' has no value: node '%(node)s' did not run (it is on a branch not "
                                  "taken)."), verbatim=("where", "node"))
NO_OUTPUT = LogMessage(gettext_noop("'%(where)s' has no value: node '%(node)s' has no output '%(name)s'."),
                       verbatim=("where", "node", "name"))
NO_PART = LogMessage(gettext_noop("'%(where)s' has no value: there is no '%(part)s' in %(value)s."),
                     verbatim=("where", "part", "value"))
MODEL_CALL_FAILED = LogMessage(gettext_noop("The model call failed: %(error)s"))
REPLY_NOT_JSON = LogMessage(gettext_noop("The model's reply is not JSON (%(error)s): %(reply)s"),
                            verbatim=("error", "reply"))
JSON_OFF_SCHEMA = LogMessage(gettext_noop("The model's JSON does not fit the schema: %(problem)s"),
                             verbatim=("problem",))
KNOWLEDGE_BASE_GONE = LogMessage(gettext_noop("Knowledge base %(id)s no longer exists."), verbatim=("id",))
TOOL_GONE = LogMessage(gettext_noop("Tool %(id)s no longer exists."), verbatim=("id",))
TOOL_FAILED = LogMessage(gettext_noop("Tool %(tool)s failed: %(error)s"), verbatim=("tool",))
NOT_A_NUMBER = LogMessage(gettext_noop("'%(where)s' is %(value)s, not a number."), verbatim=("where", "value"))
TEMPLATE_FAILED = LogMessage(gettext_noop("The template could not be rendered: %(error)s"), verbatim=("error",))
HTTP_REFUSED = LogMessage(gettext_noop("%(method)s %(url)s answered %(status)s."),
                          verbatim=("method", "url", "status"))
NOT_A_LIST = LogMessage(gettext_noop("'%(items)s' is %(type)s, not a list."), verbatim=("items", "type"))
TOO_MANY_ITEMS = LogMessage(gettext_noop("'%(items)s' has %(count)s items; an iteration goes through at most "
                                         "%(limit)s (WORKFLOW_MAX_ITERATIONS)."), verbatim=("items", "count", "limit"))
NO_VARIABLE_VALUE = LogMessage(gettext_noop("None of %(variables)s has a value."), verbatim=("variables",))
AGENT_GONE = LogMessage(gettext_noop("Agent %(id)s no longer exists."), verbatim=("id",))
AGENT_INPUT_EMPTY = LogMessage(gettext_noop("The agent's input is empty."))
AGENT_RUN_ENDED = LogMessage(gettext_noop("The agent's run %(run)s ended %(status)s: %(error)s"), verbatim=("run",))
