"""Spreadsheets and hostile Office files through the upload path, as a user sends them: uploaded to the API (stored
under their sha256, without an extension), ingested as the worker would, and looked at through the API."""

import io
import re
import zipfile

import openpyxl
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from rag_studio.pipeline.ingestion import ingest
from tests.rag_studio.conftest import SAMPLES


@pytest.fixture
def client(acme, key_client, presets):
    return key_client("ann", acme)


@pytest.fixture
def kb_id(client) -> int:
    return client.post("/api/rag/knowledge-bases/", {"name": "Sheets"}, format="json").json()["id"]


def _upload_and_ingest(client, kb_id: int, name: str, content: bytes) -> dict:
    response = client.post(f"/api/rag/knowledge-bases/{kb_id}/documents/",
                           {"files": [SimpleUploadedFile(name, content)]}, format="multipart")
    assert response.status_code == 201, response.content[:300]
    document_id = response.json()[0]["document"]["id"]
    ingest(document_id, "pytest")  # what the ingest worker does with the queued document
    return client.get(f"/api/rag/documents/{document_id}/").json()


def _fleet_workbook() -> bytes:
    workbook = openpyxl.Workbook()
    sheet = workbook.active
    sheet.title = "Fleet"
    for row in [("Model", "Payload kg", "Top speed m/s"), ("NW-7", 150, 2.0), ("NW-9 Heavy", 300, 1.5)]:
        sheet.append(row)
    out = io.BytesIO()
    workbook.save(out)
    return out.getvalue()


def _rezip(content: bytes, edit) -> bytes:
    """The same archive with each member's bytes passed through `edit(name, data)`."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(content)) as source, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as target:
        for member in source.infolist():
            target.writestr(member.filename, edit(member.filename, source.read(member)))
    return out.getvalue()


def test_an_uploaded_spreadsheet_is_indexed_and_its_rows_are_found(client, kb_id):
    document = _upload_and_ingest(client, kb_id, "fleet.xlsx", _fleet_workbook())

    assert (document["status"], document["error"]) == ("indexed", "")
    hits = client.post(f"/api/rag/knowledge-bases/{kb_id}/hit-test/", {"query": "NW-9 Heavy payload"},
                       format="json").json()["hits"]
    assert "Model: NW-9 Heavy; Payload kg: 300; Top speed m/s: 1.5" in hits[0]["text"]


@pytest.mark.timeout(120)
def test_a_sheet_declaring_the_largest_possible_range_is_read_by_its_real_cells(client, kb_id):
    """A few KB declaring A1:XFD1048576: a reader that pads to the declared range builds ~1.7e10 cells."""
    huge = _rezip(_fleet_workbook(), lambda name, data: re.sub(
        rb'<dimension ref="[^"]+"\s*/>', b'<dimension ref="A1:XFD1048576"/>', data)
        if name.startswith("xl/worksheets/") else data)
    assert len(huge) < 10_000

    document = _upload_and_ingest(client, kb_id, "declared-huge.xlsx", huge)

    assert document["status"] == "indexed", document["error"]
    assert document["chunk_count"] == 1


def test_a_sheet_with_cells_far_apart_is_not_padded_between_them(client, kb_id):
    far_apart = _rezip(_fleet_workbook(), lambda name, data: data.replace(
        b"</sheetData>", b'<row r="1048576"><c r="XFD1048576" t="inlineStr"><is><t>last cell</t></is></c></row>'
                         b"</sheetData>") if name.startswith("xl/worksheets/") else data)

    document = _upload_and_ingest(client, kb_id, "far-apart.xlsx", far_apart)

    assert document["status"] == "indexed", document["error"]
    hits = client.post(f"/api/rag/knowledge-bases/{kb_id}/hit-test/", {"query": "last cell", "mode": "keyword"},
                       format="json").json()["hits"]
    assert "column 16384: last cell" in hits[0]["text"]


def _docx_inflating_to(size: int) -> bytes:
    """The sample DOCX with its document.xml padded by `size` bytes of spaces (deflate shrinks them ~1000x)."""
    original = (SAMPLES / "northwind-product-guide.docx").read_bytes()
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(original)) as source, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as target:
        for member in source.infolist():
            data = source.read(member)
            if member.filename != "word/document.xml":
                target.writestr(member.filename, data)
                continue
            head, tail = data.split(b"</w:body>")
            with target.open(member.filename, "w", force_zip64=True) as stream:
                stream.write(head)
                block = b" " * (1 << 20)
                for _ in range(size // len(block)):
                    stream.write(block)
                stream.write(b"</w:body>" + tail)
    return out.getvalue()


def test_a_docx_whose_xml_inflates_a_thousandfold_is_refused_before_it_is_read(client, kb_id):
    bomb = _docx_inflating_to(64 << 20)
    assert len(bomb) < 200_000

    document = _upload_and_ingest(client, kb_id, "guide.docx", bomb)

    assert (document["status"], document["error_code"]) == ("failed", "archive_bomb")
    assert "word/document.xml inside the DOCX inflates" in document["error"]


def test_a_workbook_larger_than_the_unpacked_limit_is_refused_with_the_limit(client, kb_id, settings):
    settings.RAG_MAX_UNPACKED_BYTES = 4096

    document = _upload_and_ingest(client, kb_id, "fleet.xlsx", _fleet_workbook())

    assert (document["status"], document["error_code"]) == ("failed", "archive_bomb")
    assert "would unpack to" in document["error"] and "the limit is 4 KiB" in document["error"]
