"""A document's pages that OCR reads, each saved in the document's work dir as soon as it is read: a worker that takes
the document over, the document's next turn in the line, or a retry after a cancel, reads only what is left."""

from dataclasses import asdict
from pathlib import Path

from django.conf import settings

from accounts.atomic_files import write_json_atomic
from rag_studio import files
from rag_studio.pipeline.ocr.images import PageImages
from rag_studio.pipeline.ocr.reading import PageReading, PageTimeout, read_page
from rag_studio.pipeline.parsing import ParseError


class ScannedPages:
    def __init__(self, upload: Path, kind: str, ocr: dict, work_dir: Path):
        """`upload`: the stored file (named by its sha256); `ocr`: the knowledge base's settled OCR settings
        (`validate_ocr`)."""
        self._upload, self._kind = upload, kind
        self._latin_only = ocr["languages"] == "en"
        # Readings belong to this content read with these languages: a work dir left by a deleted document whose id
        # is used again, or a change of settings, never hands over its pages.
        self._folder = work_dir / f"ocr-{upload.name[:16]}-{ocr['languages']}"
        self._images: PageImages | None = None

    def __enter__(self) -> "ScannedPages":
        return self

    def __exit__(self, *exc_info) -> None:
        if self._images is not None:
            self._images.__exit__(*exc_info)

    def saved(self, number: int) -> PageReading | None:
        path = self._path(number)
        return PageReading(**files.read_json(path)) if path.exists() else None

    def read(self, number: int) -> PageReading:
        if self._images is None:  # opened only when a page is left to read
            self._images = PageImages(self._upload, self._kind)
        limit = settings.RAG_OCR_PAGE_TIMEOUT_S
        try:
            reading = read_page(self._images.page(number), latin_only=self._latin_only, timeout_s=limit)
        except PageTimeout:
            raise ParseError("ocr_timeout", f"OCR gave up on page {number} after {limit:.0f} s "
                                            f"(FACTORY_RAG_OCR_PAGE_TIMEOUT_S); a page of text takes seconds, so "
                                            f"this one may hold something else. The pages before it are kept: "
                                            f"raise the limit and retry, or remove the page.")
        write_json_atomic(self._path(number), asdict(reading))
        return reading

    def _path(self, number: int) -> Path:
        return self._folder / f"page-{number:05d}.json"
