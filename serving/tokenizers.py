"""Counts tokens with an engine's own tokenizer when its stream reports no usage (llama.cpp). Only the GGUF
vocabulary is loaded (vocab_only), never the weights, so the web process holds no model."""

import threading
from functools import lru_cache

from llama_cpp import Llama

# llama.cpp's loader and tokenizer are not safe to enter from two threads at once, and a clash hangs the whole
# process (the GIL is held while it waits); counting is microseconds, so one lock costs nothing.
_llama_lock = threading.Lock()


@lru_cache(maxsize=8)
def _vocabulary(model_path: str) -> Llama:
    return Llama(model_path=model_path, vocab_only=True, verbose=False)


def count_tokens(model_path: str, text: str) -> int:
    if not text:
        return 0
    with _llama_lock:
        return len(_vocabulary(model_path).tokenize(text.encode(), add_bos=False, special=True))
