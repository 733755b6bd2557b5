"""What the benchmarks share; nothing here is a benchmark of its own (those are bench/<name>.py, `python -m
bench.<name>`, listed in bench/README.md).

- private_instance: Django on a fresh temporary data dir and SQLite database, for benches that need no running
  platform; importing it sets Django up, so it comes before the project's models.
- running_instance: Django on the settings `make run` recorded (.run/env), a throwaway API key and a bench deployment
  of the SmolLM2 preset, and streamed chats timed with serving/metrics.py's definitions.
- synthetic: seeded prose, documents and clustered 384-d chunks.
- index_scale: the index store grown to each size and its write rate there (ingest --scale, retrieve).
- rag_corpora: the RAG question sets (Python docs, Chinese plant handbook, man pages) and relevance per chunk;
  manpages: the bilingual man-page corpus they draw on.
- training, step_timing: the fine-tuning job's own process on a spec written here, and that process with every step
  timed (run as a script).
- gateway_api: the gateway's and apps' public API as OpenAPI (fuzz, spec_corpus).
- mcp_time_server: a stdio MCP server for tool_overhead (run as a script).
- pool_trace: a seeded synthetic trace of training jobs for the pool's scheduler (pool_sim).
- fake_engine: an OpenAI-compatible engine streaming llama-server's chunks at a set pace, in a process of its own
  (relay, and the gateway's tests).
"""
