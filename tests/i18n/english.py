"""What counts as English a Chinese reader would meet: shared by the template check and the browser walk.

A word is English when it is two or more Latin letters that are not an acronym (TTFT, GPU, API), a unit, a name
of a product or format, or code (an identifier with _, -, ., / or digits, camelCase). What is left is prose that
should have been translated."""

import re

# Names that stay as they are in the Chinese GUI, as they do in MaxKB's and Dify's: products, formats, libraries.
PRODUCT_PHRASES = ("AI Factory", "AI\xa0Factory", "Hugging Face", "sentence-transformers", "llama.cpp")
PRODUCT_NAMES = {
    "OpenAI", "LangChain", "LangGraph", "FAISS", "Prometheus", "Playwright", "Chromium", "Celery",
    "Redis", "Django", "Python", "Markdown", "Hugging", "Face", "llama", "cpp", "vLLM", "Swagger", "OpenAPI",
    "cURL", "curl", "Fernet", "Gemma", "MiniLM", "jieba", "LoRA", "QLoRA",
    "ZeRO", "ShareGPT", "alpaca", "Alpaca", "ChatML", "Jinja", "ReAct", "bubblewrap", "bwrap", "nvidia", "smi",
    "Bearer", "bearer", "https", "http", "localhost", "sha256", "md", "txt", "pdf", "docx", "xlsx", "csv", "html",
    "json", "jsonl", "yaml", "gguf", "npy", "zip", "safetensors", "peft", "transformers", "torchao", "accelerate",
    "stdio", "tok", "iframe", "nDCG", "uvicorn", "pypdf", "docker", "compose", "Debian", "Postgres", "SQLite",
}
UNITS = {"ms", "s", "min", "h", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB", "px", "rpm", "tflops",
         "TFLOPS", "it", "vs"}
LATIN_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_\-./:@'’]*")
# Placeholders the checks leave where a template tag or variable was.
PLACEHOLDER = "§"


def is_code(word: str) -> bool:
    # "Requests/min" is prose with a slash; "/v1", "a/b.txt" and "tokens/s" (a unit) are not.
    slashed_prose = "/" in word and not word.startswith("/") and all(
        len(part) > 1 for part in word.split("/"))
    return bool(re.search(r"[0-9_.:@]", word)) or bool(re.search(r"[a-z][A-Z]", word)) or (
        "-" in word.strip("-")) or ("/" in word and not slashed_prose)


def is_acronym(word: str) -> bool:
    return word.isupper() or (word[:-1].isupper() and word[-1] == "s" and len(word) > 2)


def english_words(text: str) -> list[str]:
    """The words of `text` a translator should have translated."""
    for phrase in PRODUCT_PHRASES:
        text = text.replace(phrase, PLACEHOLDER)
    found = []
    for match in LATIN_WORD.finditer(text):
        word = match[0].rstrip(".:'’-")
        if len(word) < 2 or word in PRODUCT_NAMES or word in UNITS or is_acronym(word) or is_code(word):
            continue
        found.append(word)
    return found


def english_sentences(text: str, *, min_words: int = 2) -> list[str]:
    """Runs of at least `min_words` English words with nothing but spaces and light punctuation between them:
    what reads as an English phrase or sentence on a page (a single stray word, such as a user's name, does not)."""
    for phrase in PRODUCT_PHRASES:
        text = text.replace(phrase, PLACEHOLDER)
    runs, run = [], []
    for token in re.split(r"(\s+|[,;:!?()\"“”]\s*)", text):
        if not token or token.isspace() or token.strip() in {",", ";", ":", "!", "?", "(", ")", '"'}:
            continue
        words = LATIN_WORD.fullmatch(token.rstrip(".:'’-"))
        if words and english_words(token):
            run.append(token)
            continue
        if len(run) >= min_words:
            runs.append(" ".join(run))
        run = []
    if len(run) >= min_words:
        runs.append(" ".join(run))
    return runs
