"""One page read by OCR, from its grey image to its text (`read_page`).

1. Lines are found on a copy whose longest side is DETECT_SIDE pixels: at 300 dpi that still leaves 10-point text
   about 11 pixels high, which the detector finds, in a third of the time the full page takes.
2. The page is turned upright first. Its lines standing on end (most elongated boxes taller than wide) mean a page
   turned by 90°: it is turned a quarter and searched again. Then the direction classifier reads its longest
   lines; most of them upside down means 180° more.
3. Each line is cut from the full-resolution page along its box (so a slightly skewed line is read straight) and
   recognised; a line the recogniser is less than MIN_LINE_SCORE sure of is left out of the text.
4. The skew (the median slope of the lines' top edges) is taken out of the boxes' positions before the layout
   (layout.py) puts them in reading order.

The page's confidence is the recogniser's over all the characters it read, dropped lines included; a page where
no line was found has none (a blank page).
"""

import math
import statistics
import time
from dataclasses import dataclass

import cv2
import numpy as np

from rag_studio.pipeline.ocr import layout
from rag_studio.pipeline.ocr.engine import engine

DETECT_SIDE = 1280
MIN_LINE_SCORE = 0.5
# Boxes at least this many times longer than high tell which way the page's lines run.
ELONGATED = 2.0
DIRECTION_SAMPLE = 12


@dataclass(frozen=True)
class PageReading:
    text: str
    confidence: float | None
    rotation: int  # degrees the page was turned, counter-clockwise, to read it: 0, 90, 180 or 270
    skew: float  # degrees its lines sloped
    lines: int
    seconds: float


class PageTimeout(Exception):
    pass


def read_page(image: np.ndarray, *, latin_only: bool, timeout_s: float) -> PageReading:
    started = time.monotonic()
    ocr = engine()
    scale = min(1.0, DETECT_SIDE / max(image.shape))
    quads, rotation = _detect(ocr, image, scale), 0
    if _standing(quads):
        image, rotation = np.ascontiguousarray(np.rot90(image)), 90
        quads = _detect(ocr, image, scale)
    sample = sorted(quads, key=lambda quad: -_size(quad)[0])[:DIRECTION_SAMPLE]
    if sample and ocr.upside_down([_crop(image, quad) for quad in sample]):
        image, rotation = np.ascontiguousarray(np.rot90(image, 2)), rotation + 180
        quads = _detect(ocr, image, scale)
    skew = _skew(quads)
    turn = cv2.getRotationMatrix2D((image.shape[1] / 2, image.shape[0] / 2), skew, 1.0)
    lines, read = [], []
    for quad in quads:
        if time.monotonic() - started > timeout_s:
            raise PageTimeout()
        text, score = ocr.recognise(_crop(image, quad), latin_only=latin_only)
        text = text.strip()
        if not text:
            continue
        read.append((len(text), score))
        if score >= MIN_LINE_SCORE:
            corners = cv2.transform(quad[np.newaxis], turn)[0]
            lines.append(layout.Line(text, *corners.min(axis=0), *corners.max(axis=0)))
    confidence = sum(count * score for count, score in read) / sum(count for count, _ in read) if read else None
    return PageReading(layout.page_text(lines), confidence, rotation % 360, round(skew, 2), len(lines),
                       time.monotonic() - started)


def _detect(ocr, image: np.ndarray, scale: float) -> np.ndarray:
    """The lines' boxes in full-resolution pixels."""
    small = image if scale == 1.0 else cv2.resize(image, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
    return ocr.detect(small) / scale


def _size(quad: np.ndarray) -> tuple[float, float]:
    """Length of the top edge, and of the left edge."""
    return float(np.linalg.norm(quad[1] - quad[0])), float(np.linalg.norm(quad[3] - quad[0]))


def _standing(quads: np.ndarray) -> bool:
    sizes = [_size(quad) for quad in quads]
    standing = sum(height >= ELONGATED * width for width, height in sizes)
    lying = sum(width >= ELONGATED * height for width, height in sizes)
    return standing > lying


def _skew(quads: np.ndarray) -> float:
    slopes = [math.degrees(math.atan2(quad[1][1] - quad[0][1], quad[1][0] - quad[0][0]))
              for quad in quads if _size(quad)[0] >= ELONGATED * _size(quad)[1]]
    return statistics.median(slopes) if slopes else 0.0


def _crop(image: np.ndarray, quad: np.ndarray) -> np.ndarray:
    width, height = _size(quad)
    width = max(int(round(max(width, np.linalg.norm(quad[2] - quad[3])))), 1)
    height = max(int(round(max(height, np.linalg.norm(quad[2] - quad[1])))), 1)
    target = np.float32([[0, 0], [width, 0], [width, height], [0, height]])
    crop = cv2.warpPerspective(image, cv2.getPerspectiveTransform(quad.astype(np.float32), target), (width, height),
                               flags=cv2.INTER_CUBIC, borderMode=cv2.BORDER_REPLICATE)
    # A single box standing on its own (a vertical label) is read lying down, as the recogniser expects.
    return np.ascontiguousarray(np.rot90(crop)) if height >= 1.5 * width else crop
