"""The ingestion pipeline: uploads, then parse, clean, screen, chunk, embed and index each document."""
