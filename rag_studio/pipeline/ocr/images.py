"""A document's pages as grey images for OCR: PDF pages rendered by pdfium, image frames decoded by Pillow. The
parse stage has already checked an image's frames against RAG_OCR_MAX_PAGES and RAG_OCR_MAX_PIXELS; a PDF page is
rendered smaller rather than past RAG_OCR_MAX_PIXELS (a poster-sized page, say)."""

import math
from pathlib import Path

import numpy as np
import pypdfium2
from django.conf import settings
from PIL import Image, ImageOps

from rag_studio.pipeline.parsing import ParseError, open_image

# The recogniser reads lines scaled to 48 pixels high: at 300 dpi 10-point text is about 42 pixels high, so it loses
# no detail, and nothing is gained from more.
RENDER_DPI = 300
_WIDE_MODES = ("I", "I;16", "I;16B", "I;16L", "F")


class PageImages:
    """The pages of one PDF or image file, opened once for all the pages read in a turn."""

    def __init__(self, path: Path, kind: str):
        self._kind = kind
        try:
            self._source = pypdfium2.PdfDocument(path) if kind == "pdf" else open_image(path)
        except pypdfium2.PdfiumError as exc:
            raise ParseError("corrupt_file", f"pdfium cannot open the PDF to read its scanned pages ({exc}).")
        except OSError:
            raise ParseError("corrupt_file", "The image can no longer be opened: it is damaged or not an image.")

    def __enter__(self) -> "PageImages":
        return self

    def __exit__(self, *exc_info) -> None:
        self._source.close()

    def page(self, number: int) -> np.ndarray:
        """Page `number` (1-based) as an array of grey levels, white paper at 255."""
        return self._pdf_page(number) if self._kind == "pdf" else self._image_page(number)

    def _pdf_page(self, number: int) -> np.ndarray:
        page = self._source[number - 1]
        try:
            width, height = page.get_size()
            scale = RENDER_DPI / 72
            pixels = width * height * scale * scale
            if pixels > settings.RAG_OCR_MAX_PIXELS:
                scale *= math.sqrt(settings.RAG_OCR_MAX_PIXELS / pixels)
            bitmap = page.render(scale=scale, grayscale=True, fill_color=(255, 255, 255, 255))
            return np.array(bitmap.to_numpy()).reshape(bitmap.height, bitmap.width)
        finally:
            page.close()

    def _image_page(self, number: int) -> np.ndarray:
        image = self._source
        pages = getattr(image, "n_frames", 1)
        try:
            image.seek(number - 1)
            return _grey(ImageOps.exif_transpose(image))
        except (OSError, SyntaxError, ValueError, EOFError) as exc:  # Pillow's ways of saying the data is damaged
            where = f"Page {number} of the image" if pages > 1 else "The image"
            raise ParseError("corrupt_file", f"{where} cannot be decoded: it is damaged or truncated ({exc}).")


def _grey(image: Image.Image) -> np.ndarray:
    """Grey levels, with transparent parts as white paper (dark text on a transparent background stays dark) and
    16-bit and float scans stretched to 8 bits."""
    if image.mode in _WIDE_MODES:
        levels = np.asarray(image, dtype=np.float64)
        low, high = float(levels.min()), float(levels.max())
        return ((levels - low) * (255 / max(high - low, 1e-9))).astype(np.uint8)
    if "A" in image.getbands() or "transparency" in image.info:
        paper = Image.new("RGBA", image.size, "white")
        paper.alpha_composite(image.convert("RGBA"))
        image = paper
    return np.asarray(image.convert("L"))
