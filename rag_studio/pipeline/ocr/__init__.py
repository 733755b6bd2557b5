"""OCR for scanned pages: the pages of a PDF without a usable text layer, and images (PNG, JPEG, TIFF and its pages,
WebP, BMP). RapidOCR runs PP-OCRv4's detection, direction and recognition models (Chinese and English in one model)
in onnxruntime on the CPU; the models ship inside its wheel, so nothing is downloaded, ever.

- `images.py`: a page as a grey image: a PDF page rendered by pdfium at 300 dpi (smaller only where that would pass
  RAG_OCR_MAX_PIXELS), an image's frame decoded by Pillow and turned upright by its EXIF orientation.
- `reading.py`: one page read: lines found on a scaled-down copy; a page turned by 90° (its lines stand upright) or
  180° (the direction classifier reads its longest lines upside down) is turned back and searched again; each line
  is recognised from the full-resolution page; the lines' skew is measured and taken out before layout.
- `layout.py`: lines to text in reading order: columns one after the other, paragraphs, larger lines as Markdown
  headings, rows of cells as " | "-joined table rows.
- `scans.py`: a document's OCR pages, each saved as it is read, so that a document resumes at its next page.

A knowledge base's `ocr` settings (`validate_ocr`): `mode` auto (pages without a usable text layer, and images),
always (every page of PDFs and images, the text layer ignored) or never (a scan fails, saying OCR is off);
`languages` auto (Chinese and English) or en (English only: recognition keeps to Latin script, so that an English
scan never reads a letter as a look-alike Chinese character).
"""

OCR_MODES = ("auto", "always", "never")
OCR_LANGUAGES = ("auto", "en")
DEFAULT_OCR = {"mode": "auto", "languages": "auto"}


def validate_ocr(config: dict) -> dict:
    """The knowledge base's OCR settings with defaults filled in; ValueError names what is wrong."""
    if not isinstance(config, dict):
        raise ValueError('ocr must be an object such as {"mode": "auto", "languages": "auto"}.')
    unknown = sorted(set(config) - set(DEFAULT_OCR))
    if unknown:
        raise ValueError(f"Unknown OCR setting(s): {', '.join(unknown)}; the settings are mode and languages.")
    settled = {**DEFAULT_OCR, **config}
    if settled["mode"] not in OCR_MODES:
        raise ValueError(f"OCR mode must be one of {', '.join(OCR_MODES)}, not {settled['mode']!r}.")
    if settled["languages"] not in OCR_LANGUAGES:
        raise ValueError(f"OCR languages must be auto (Chinese and English) or en (English only), not "
                         f"{settled['languages']!r}.")
    return settled
