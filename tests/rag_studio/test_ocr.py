"""Scanned documents and images, as a user sends them: made by the test (known text rendered, then scanned or
photographed: noise, skew, blur, uneven light), uploaded to the API (stored under their sha256, without an extension),
ingested as the worker would, and looked at through the API, hit testing and the pages."""

import io
import struct
import zlib

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from pypdf import PdfReader, PdfWriter

from accounts.services import Actor
from cluster import queues
from rag_studio import services
from rag_studio.models import Document, OcrPage
from rag_studio.pipeline import line
from rag_studio.pipeline.ingestion import ingest, ingest_next
from rag_studio.pipeline.ocr import scans as ocr_scans
from rag_studio.pipeline.ocr.layout import Line, page_text
from rag_studio.pipeline.parsing import usable_text_layer
from rag_studio.rag import citation
from rag_studio.search.retrieval import retrieve
from tests.rag_studio.conftest import SAMPLES
from tests.rag_studio.scans import encoded, image_pdf, page, tiff

ENGLISH = ["The NW-7 warehouse robot carries 150 kg.", "Its battery charges fully in 45 minutes.",
           "Service visits are booked through the portal."]
CHINESE = ["北风机器人公司的员工每年享有十五天带薪年假。", "病假需要提供医生证明。", "报销申请在三十天内完成审批。"]
# Pages of a longer scan, each saying something of its own (cleaning drops what every page repeats).
FACTS = [["The depot in Hamburg opens at seven.", "Spare wheels ship within two days."],
         ["Firmware updates arrive every month.", "Each robot logs its route to the cloud."],
         ["Drivers check the brakes before each shift.", "The loading dock holds twelve pallets."],
         ["Returns are accepted for thirty days.", "Night shifts end at six in the morning."]]


def _scan_pages(count: int, **scan) -> list:
    return [page(FACTS[number], seed=number, **scan) for number in range(count)]


@pytest.fixture
def client(acme, key_client, presets):
    return key_client("ann", acme)


@pytest.fixture
def kb_id(client) -> int:
    return client.post("/api/rag/knowledge-bases/", {"name": "Scans"}, format="json").json()["id"]


def _upload(client, kb_id: int, name: str, content: bytes) -> int:
    response = client.post(f"/api/rag/knowledge-bases/{kb_id}/documents/",
                           {"files": [SimpleUploadedFile(name, content)]}, format="multipart")
    assert response.status_code == 201, response.content[:300]
    return response.json()[0]["document"]["id"]


def _upload_and_ingest(client, kb_id: int, name: str, content: bytes) -> dict:
    document_id = _upload(client, kb_id, name, content)
    ingest(document_id, "pytest")  # what the ingest worker does with the queued document
    return client.get(f"/api/rag/documents/{document_id}/").json()


def _hits(client, kb_id: int, query: str) -> list[dict]:
    response = client.post(f"/api/rag/knowledge-bases/{kb_id}/hit-test/", {"query": query}, format="json")
    assert response.status_code == 200, response.content[:300]
    return response.json()["hits"]


# --- Scans and images read, and found by search ---

def test_a_scanned_pdf_is_read_page_by_page_and_its_pages_are_found_and_cited(client, kb_id):
    scan = image_pdf([page(ENGLISH, heading="Fleet guide", skew=0.8, noise=8),
                      page(CHINESE, heading="员工手册", skew=-0.6, noise=8, seed=1)])
    assert not "".join(p.extract_text() for p in PdfReader(io.BytesIO(scan)).pages).strip()

    document = _upload_and_ingest(client, kb_id, "scan.pdf", scan)

    assert (document["status"], document["error"]) == ("indexed", "")
    assert (document["page_count"], document["ocr_page_count"], document["ocr_pages_done"]) == (2, 2, 2)
    assert [p["page"] for p in document["ocr_pages"]] == [1, 2]
    assert all(p["confidence"] > 0.9 and not p["low_confidence"] for p in document["ocr_pages"])
    english = _hits(client, kb_id, "How long does the NW-7 battery take to charge?")[0]
    assert (english["page"], english["low_confidence_ocr"]) == (1, False)
    assert "45 minutes" in english["text"]
    chinese = _hits(client, kb_id, "员工每年有多少天带薪年假？")[0]
    assert chinese["page"] == 2 and "十五天带薪年假" in chinese["text"]
    kb = Document.objects.get(pk=document["id"]).knowledge_base
    assert citation(1, retrieve(kb, "带薪年假").hits[0], cited=True)["page"] == 2


def test_a_photographed_page_with_noise_skew_blur_and_shade_is_read(client, kb_id):
    photo = page(ENGLISH + CHINESE, dpi=200, skew=2.5, noise=14, blur=0.7, shade=0.35, seed=2)

    document = _upload_and_ingest(client, kb_id, "whiteboard.jpg", encoded(photo, "JPEG", quality=70))

    assert (document["status"], document["kind"]) == ("indexed", "image")
    [ocr_page] = document["ocr_pages"]
    assert ocr_page["page"] == 1 and abs(ocr_page["skew"]) > 1.5
    chunks = client.get(f"/api/rag/documents/{document['id']}/chunks/").json()
    text = " ".join(chunk["text"] for chunk in chunks)
    assert "150 kg" in text and "带薪年假" in text and "三十天" in text
    assert "报销申请" in _hits(client, kb_id, "报销申请多久完成审批")[0]["text"]


def test_a_pdf_mixing_text_and_scanned_pages_keeps_the_text_layer_and_reads_the_scans(client, kb_id):
    writer = PdfWriter()
    writer.append(str(SAMPLES / "northwind-employee-handbook.pdf"), pages=[0])
    writer.append(PdfReader(io.BytesIO(image_pdf([page(ENGLISH, noise=6)]))))
    out = io.BytesIO()
    writer.write(out)

    document = _upload_and_ingest(client, kb_id, "mixed.pdf", out.getvalue())

    assert document["status"] == "indexed", document["error"]
    assert [p["page"] for p in document["ocr_pages"]] == [2]
    pages = {chunk["page"] for chunk in client.get(f"/api/rag/documents/{document['id']}/chunks/").json()}
    assert pages == {1, 2}
    assert _hits(client, kb_id, "NW-7 warehouse robot payload")[0]["page"] == 2


def test_the_pages_of_a_tiff_turned_sideways_and_upside_down_are_turned_back_and_read(client, kb_id):
    frames = [page(facts, turn=turn, noise=6, seed=turn) for facts, turn in zip(FACTS, (0, 90, 180, 270))]

    document = _upload_and_ingest(client, kb_id, "faxes.tiff", tiff(frames))

    assert document["status"] == "indexed", document["error"]
    assert [p["rotation"] for p in document["ocr_pages"]] == [0, 270, 180, 90]
    chunks = client.get(f"/api/rag/documents/{document['id']}/chunks/").json()
    assert [chunk["page"] for chunk in chunks] == [1, 2, 3, 4]
    for chunk, facts in zip(chunks, FACTS):
        assert chunk["text"] == " ".join(facts)


def test_an_english_only_knowledge_base_reads_latin_script_only(client):
    kb_id = client.post("/api/rag/knowledge-bases/", {"name": "English scans", "ocr": {"languages": "en"}},
                        format="json").json()["id"]

    document = _upload_and_ingest(client, kb_id, "memo.png", encoded(page(ENGLISH, noise=10), "PNG"))

    assert document["status"] == "indexed", document["error"]
    text = " ".join(chunk["text"] for chunk in client.get(f"/api/rag/documents/{document['id']}/chunks/").json())
    assert "warehouse robot carries 150 kg" in text
    assert all(ord(character) < 0x250 for character in text)


# --- Layout: reading order and structure ---

def _line(text: str, left: float, top: float, width: float, height: float = 20) -> Line:
    return Line(text, left, top, left + width, top + height)


def test_two_columns_are_read_column_by_column_under_a_heading_that_spans_them():
    lines = [_line("Annual report", 100, 40, 300, 40)]
    for row in range(5):
        lines.append(_line(f"left column line {row}", 100, 120 + 30 * row, 400))
        lines.append(_line(f"right column line {row}", 560, 120 + 30 * row, 400))
    lines.append(_line("A footer that runs across both columns of the page", 100, 320, 860))

    text = page_text(lines)

    assert text.split("\n\n") == [
        "# Annual report",
        " ".join(f"left column line {row}" for row in range(5)),
        " ".join(f"right column line {row}" for row in range(5)),
        "A footer that runs across both columns of the page"]


def test_a_table_keeps_its_rows_of_cells_and_chinese_lines_join_without_spaces():
    lines = [_line("北风机器人公司的员工每年", 100, 40, 300), _line("享有十五天带薪年假。", 100, 66, 250)]
    for row, cells in enumerate([("Model", "Payload kg", "Speed"), ("NW-7", "150", "2.0"), ("NW-9", "300", "1.5")]):
        lines += [_line(cell, 100 + 200 * column, 140 + 28 * row, 80) for column, cell in enumerate(cells)]

    assert page_text(lines) == ("北风机器人公司的员工每年享有十五天带薪年假。\n\n"
                                "Model | Payload kg | Speed\nNW-7 | 150 | 2.0\nNW-9 | 300 | 1.5")


def test_a_text_layer_of_garbage_or_a_stamped_page_number_is_read_by_ocr_instead():
    assert usable_text_layer("The handbook grants employees 25 days of annual leave each year.")
    assert not usable_text_layer("  12  ")
    assert not usable_text_layer("\ue001\ue002\ue003 \ue004\ue005\ue006\ue007 " * 6)
    assert not usable_text_layer("%&$#@!*%&$#@!*ab" * 4)


# --- Settings ---

def test_ocr_settings_are_checked_and_never_refuses_scans_saying_so(client):
    refused = client.post("/api/rag/knowledge-bases/", {"name": "Bad", "ocr": {"mode": "sometimes"}}, format="json")
    assert refused.status_code == 400
    assert "OCR mode must be one of auto, always, never" in refused.content.decode()

    created = client.post("/api/rag/knowledge-bases/", {"name": "No OCR", "ocr": {"mode": "never"}}, format="json")
    assert created.json()["ocr"] == {"mode": "never", "languages": "auto"}
    kb_id = created.json()["id"]
    image = _upload_and_ingest(client, kb_id, "photo.png", encoded(page(ENGLISH), "PNG"))
    scan = _upload_and_ingest(client, kb_id, "scan.pdf", image_pdf([page(ENGLISH)]))

    assert (image["status"], image["error_code"]) == ("failed", "ocr_off")
    assert (scan["status"], scan["error_code"]) == ("failed", "no_text")
    assert "OCR is off for this knowledge base" in scan["error"]


def test_the_settings_form_sets_ocr_and_says_so_in_chinese(acme, ann, client, kb_id):
    browser = Client(HTTP_ACCEPT_LANGUAGE="zh-hans")
    browser.login(username="ann", password="correct-horse-battery")

    browser.post(f"/rag/kb/{kb_id}/settings/", {"name": "Scans", "ocr_mode": "always", "ocr_languages": "en"})

    assert client.get(f"/api/rag/knowledge-bases/{kb_id}/").json()["ocr"] == {"mode": "always", "languages": "en"}
    form = browser.get(f"/rag/kb/{kb_id}/").content.decode()
    assert "扫描版 PDF 和图片的 OCR" in form and '<option value="en" selected>' in form


# --- Visible and fair ---

def test_a_long_scan_takes_turns_with_other_workspaces_and_says_which_page_it_is_on(
        client, kb_id, settings, make_workspace):
    settings.RAG_OCR_TURN_S = 0  # a turn is a single page
    queues.broker().delete(line.SERVED)
    scan_id = _upload(client, kb_id, "faxes.tiff", tiff(_scan_pages(3)))
    globex = make_workspace("Globex", "gus")
    gus = Actor(user=globex.memberships.get().user)
    notes = services.upload_documents(actor=gus, kb=services.create_knowledge_base(actor=gus, workspace=globex,
                                                                                   name="Globex docs"),
                                      uploads=[SimpleUploadedFile("notes.txt", b"Globex notes on scans.")])[0]

    assert ingest_next("pytest") == "queued"  # the scan, first in line: one page, then back in line

    scan = Document.objects.get(pk=scan_id)
    assert (scan.status, scan.stage, scan.ocr_pages_done, scan.attempts) == ("queued", "ocr", 1, 0)
    browser = Client()
    browser.login(username="ann", password="correct-horse-battery")
    assert "OCR page 2 of 3" in browser.get(f"/rag/kb/{kb_id}/").content.decode()
    assert line.next_pick().document_id == notes.document.pk  # the other workspace's turn comes first
    assert [ingest_next("pytest") for _ in range(3)] == ["indexed", "queued", "indexed"]
    assert OcrPage.objects.filter(document_id=scan_id).count() == 3


def test_a_cancelled_ocr_stops_at_the_next_page_and_a_retry_goes_on_from_there(client, kb_id, ann, monkeypatch):
    document_id = _upload(client, kb_id, "faxes.tiff", tiff(_scan_pages(3, noise=5)))
    read, pages_read = ocr_scans.ScannedPages.read, []

    def read_then_cancel(scans, number):
        pages_read.append(number)
        reading = read(scans, number)
        if number == 1:  # the user presses Cancel while page 1 is being read
            assert client.post(f"/api/rag/documents/{document_id}/cancel/").status_code == 200
        return reading

    monkeypatch.setattr(ocr_scans.ScannedPages, "read", read_then_cancel)

    assert ingest(document_id, "pytest") == "failed"

    document = client.get(f"/api/rag/documents/{document_id}/").json()
    assert (document["error_code"], document["ocr_pages_done"], pages_read) == ("cancelled", 0, [1])
    assert document["events"][-1]["message"] == "Cancelled by ann"
    assert client.post(f"/api/rag/documents/{document_id}/cancel/").status_code == 409
    assert client.post(f"/api/rag/documents/{document_id}/retry/").status_code == 200
    assert ingest(document_id, "pytest") == "indexed"
    assert pages_read == [1, 2, 3]  # page 1 was kept, not read again


def test_pages_read_with_low_confidence_are_flagged_in_hit_testing_and_on_the_document(client, kb_id, settings):
    settings.RAG_OCR_LOW_CONFIDENCE = 1.01  # every page is below it
    document = _upload_and_ingest(client, kb_id, "scan.pdf", image_pdf([page(ENGLISH, noise=20)]))

    assert document["ocr_pages"][0]["low_confidence"]
    assert _hits(client, kb_id, "NW-7 battery charging")[0]["low_confidence_ocr"]
    assert "Low-confidence OCR on page(s) 1" in [event["message"] for event in document["events"]]
    browser = Client()
    browser.login(username="ann", password="correct-horse-battery")
    assert "low-confidence OCR, page 1" in browser.get(
        f"/rag/kb/{kb_id}/hit-test/?query=NW-7+battery").content.decode()
    assert "Low-confidence OCR, page 1:" in browser.get(f"/rag/documents/{document['id']}/").content.decode()


# --- Bad input: bounded, failed with the reason ---

def _png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares width x height pixels but holds a few bytes of data: a decompression bomb's header."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
            + chunk(b"IEND", b""))


def test_a_20000_by_20000_image_is_refused_before_it_is_decoded(client, kb_id):
    document = _upload_and_ingest(client, kb_id, "bomb.png", _png_header_only(20_000, 20_000))

    assert (document["status"], document["error_code"]) == ("failed", "image_too_large")
    assert "the limit is 100 megapixels (FACTORY_RAG_OCR_MAX_PIXELS)" in document["error"]


def test_an_image_over_the_pixel_limit_is_refused_with_its_size(client, kb_id, settings):
    settings.RAG_OCR_MAX_PIXELS = 100_000

    document = _upload_and_ingest(client, kb_id, "big.png", encoded(page(ENGLISH), "PNG"))

    assert document["error_code"] == "image_too_large"
    assert document["error"] == ("The image is 615 × 870 pixels (0.5 megapixels); the limit is 0.1 megapixels "
                                 "(FACTORY_RAG_OCR_MAX_PIXELS).")


def test_a_scan_of_ten_thousand_pages_is_refused_with_the_page_limit(client, kb_id):
    blank = PdfReader(io.BytesIO(image_pdf([page([])]))).pages[0]
    writer = PdfWriter()
    for _ in range(10_000):
        writer.add_page(blank)
    out = io.BytesIO()
    writer.write(out)

    document = _upload_and_ingest(client, kb_id, "archive.pdf", out.getvalue())

    assert (document["status"], document["error_code"]) == ("failed", "too_many_pages")
    assert document["error"].startswith("10,000 pages of the PDF need OCR; OCR reads at most 1,000 pages")


@pytest.mark.parametrize("name, content, code, reason", [
    ("photo.png", encoded(page(ENGLISH), "PNG")[:2000], "corrupt_file", "damaged or truncated"),
    ("photo.jpg", b"\xff\xd8\xff\xe0 not really a JPEG" * 50, "corrupt_file", "not a PNG, JPEG, TIFF, WebP or BMP"),
    ("photo.png", b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n", "corrupt_file", "not a PNG, JPEG"),
], ids=["truncated", "not-an-image", "eps-named-png"])
def test_a_damaged_image_fails_with_the_reason(client, kb_id, name, content, code, reason):
    document = _upload_and_ingest(client, kb_id, name, content)

    assert (document["status"], document["error_code"]) == ("failed", code)
    assert reason in document["error"]


def test_an_encrypted_scan_is_refused(client, kb_id):
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(image_pdf([page(ENGLISH)]))))
    writer.encrypt(user_password="s3cret", algorithm="AES-256")
    out = io.BytesIO()
    writer.write(out)

    document = _upload_and_ingest(client, kb_id, "locked.pdf", out.getvalue())

    assert (document["status"], document["error_code"]) == ("failed", "encrypted_pdf")


def test_a_page_past_the_time_limit_fails_its_document_and_a_retry_with_more_time_goes_on(client, kb_id, settings):
    settings.RAG_OCR_PAGE_TIMEOUT_S = 0

    document = _upload_and_ingest(client, kb_id, "scan.pdf", image_pdf([page(ENGLISH)]))

    assert (document["status"], document["error_code"]) == ("failed", "ocr_timeout")
    assert document["error"].startswith("OCR gave up on page 1 after 0 s (FACTORY_RAG_OCR_PAGE_TIMEOUT_S)")
    settings.RAG_OCR_PAGE_TIMEOUT_S = 120
    client.post(f"/api/rag/documents/{document['id']}/retry/")
    assert ingest(document["id"], "pytest") == "indexed"
