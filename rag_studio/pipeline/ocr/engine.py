"""The OCR models, loaded once per process: RapidOCR's PP-OCRv4 text detection, the text-direction classifier and
recognition (one model for Chinese and English), run by onnxruntime on RAG_OCR_THREADS threads. Lines are
recognised one at a time: on one core a batch of six long lines took twice as long as the same lines one by one."""

import math
import threading

import cv2
import numpy as np
from django.conf import settings

_lock = threading.Lock()
_engine: "Engine | None" = None
# What an English-only knowledge base may read: Latin script with its punctuation and symbols. Everything else the
# model knows (Chinese characters, full-width punctuation) is masked out before decoding.
_LATIN_RANGES = ((0x20, 0x24F), (0x2010, 0x205E), (0x20A0, 0x20BF), (0x2100, 0x214F))
# A blank between two characters at least this share of the height of the line's ink (ascender to descender, about
# an em) is a word space: a space is a quarter to a third of an em, with the letters' own margins beside it; the gap
# between two letters of a word, "I" and "l" included, stays under a fifth.
SPACE_GAP = 0.25
# A pixel is ink when it is this share of the way from the paper's grey to the darkest: thin strokes (an "l" at 150
# dpi) are grey, and a missed stroke would read as a gap.
INK_SHARE = 0.3


def engine() -> "Engine":
    global _engine
    with _lock:
        if _engine is None:
            _engine = Engine(threads=settings.RAG_OCR_THREADS)
        return _engine


class Engine:
    def __init__(self, *, threads: int):
        # Imported here: onnxruntime's start-up is only paid by the processes that read scans.
        from rapidocr_onnxruntime import RapidOCR

        self._ocr = RapidOCR(intra_op_num_threads=threads, inter_op_num_threads=1)
        self._alphabet = self._ocr.text_rec.postprocess_op.character  # "blank" (CTC's) first, then characters
        self._latin = np.array([index == 0 or _is_latin(character) for index, character in enumerate(self._alphabet)],
                               dtype=np.float32)

    def detect(self, image: np.ndarray) -> np.ndarray:
        """The text lines on a grey image, as quadrilaterals (n, 4, 2): top-left, top-right, bottom-right,
        bottom-left."""
        quads, _ = self._ocr.text_det(cv2.cvtColor(image, cv2.COLOR_GRAY2BGR))
        return np.zeros((0, 4, 2), np.float32) if quads is None or not len(quads) else quads

    def upside_down(self, crops: list[np.ndarray]) -> bool:
        """Whether most of these line images read upside down."""
        _, directions, _ = self._ocr.text_cls([cv2.cvtColor(crop, cv2.COLOR_GRAY2BGR) for crop in crops])
        return sum(label == "180" for label, _ in directions) > len(directions) / 2

    def recognise(self, crop: np.ndarray, *, latin_only: bool) -> tuple[str, float]:
        """The text of one line image and the recogniser's confidence in it (the mean of its characters')."""
        recogniser = self._ocr.text_rec
        _, height, width = recogniser.rec_image_shape
        ratio = max(crop.shape[1] / crop.shape[0], width / height)
        batch = recogniser.resize_norm_img(cv2.cvtColor(crop, cv2.COLOR_GRAY2BGR), ratio)[np.newaxis]
        scores = recogniser.session(batch.astype(np.float32))[0][0]  # (frames, alphabet): CTC probabilities
        if latin_only:
            scores = scores * self._latin
        best = scores.argmax(axis=1)
        frames = np.flatnonzero((best != 0) & np.r_[True, best[1:] != best[:-1]])
        if not len(frames):
            return "", 0.0
        # Where each character stands in the crop: the crop filled `resized` of the model's `padded` pixels.
        padded = int(height * ratio)
        resized = min(math.ceil(height * crop.shape[1] / crop.shape[0]), padded)
        centres = (frames + 0.5) * (padded / len(best)) * (crop.shape[1] / resized)
        characters = [self._alphabet[index] for index in best[frames]]
        return _spaced(characters, centres, crop), float(scores[frames, best[frames]].mean())


def _spaced(characters: list[str], centres: np.ndarray, crop: np.ndarray) -> str:
    """The characters with the spaces between words put back: the Chinese model often reads "150 kg" as "150kg".
    A blank of at least SPACE_GAP times the ink's height between two characters is a space, except between two
    Chinese characters (Chinese is written without spaces) or beside full-width punctuation."""
    paper, ink = np.percentile(crop, 75), np.percentile(crop, 2)
    dark = crop < paper - INK_SHARE * (paper - ink)
    rows = np.flatnonzero(dark.any(axis=1))
    if not len(rows):
        return "".join(characters)
    inked, needed = dark.any(axis=0), SPACE_GAP * (rows[-1] - rows[0] + 1)
    text = characters[0]
    for previous, character, start, end in zip(characters, characters[1:], centres, centres[1:]):
        if " " not in (previous, character) and not (_is_cjk(previous) and _is_cjk(character)) and not (
                _is_cjk_punctuation(previous) or _is_cjk_punctuation(character)):
            blank = ~inked[int(start):int(end) + 1]
            runs = np.diff(np.flatnonzero(np.r_[True, ~blank, True])) - 1
            if runs.max(initial=0) >= needed:
                text += " "
        text += character
    return text


def _is_cjk(character: str) -> bool:
    return "\u2e80" <= character <= "\u9fff" or "\uf900" <= character <= "\uffef"


def _is_cjk_punctuation(character: str) -> bool:
    """Full-width punctuation: its glyph sits in a corner of its square, so the blank beside it is no space."""
    return "\u3000" <= character <= "\u303f" or "\uff00" <= character <= "\uff65"


def _is_latin(character: str) -> bool:
    return len(character) == 1 and any(low <= ord(character) <= high for low, high in _LATIN_RANGES)
