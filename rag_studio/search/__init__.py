"""Search over a knowledge base: the index store, keyword tokens, score fusion, retrieval and its settings."""
