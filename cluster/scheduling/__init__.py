"""The shared device pool's scheduler: quotas per workspace, priority classes, admission with a reason,
preemption that keeps the work, elastic jobs (docs/DESIGN.md, "The pool's scheduler")."""
