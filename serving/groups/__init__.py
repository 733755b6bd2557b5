"""Model groups: one name in /v1 with a big and a small model behind it (DESIGN.md §4, Model groups). `policies`
decides per request, `gateway` serves a request through a group, `calibration` draws the cost-quality curve,
`scoring` scores answers against references and `vocabulary` tells whether a draft model can speculate for a big
one."""
