"""Parsing and cleaning uploaded files, as a user of RAG Studio sees it: each supported type comes through as text
with its structure, and each file that cannot be ingested is refused with a code and a sentence saying why."""

import random
from pathlib import Path

import docx
import openpyxl
import pytest
from pypdf import PdfWriter

from rag_studio.pipeline.cleaning import clean_pages
from rag_studio.pipeline.parsing import SUPPORTED_EXTENSIONS, ParsedPage, ParseError, file_kind, parse_document

SAMPLES = Path(__file__).resolve().parents[2] / "rag_studio" / "samples"
HANDBOOK = SAMPLES / "northwind-employee-handbook.pdf"
PRODUCT_GUIDE = SAMPLES / "northwind-product-guide.docx"
SUPPORT_FAQ = SAMPLES / "northwind-support-faq.md"

WARRANTY_ZH = "售后服务\n\n保修期为两年，客服电话：400-800-1234。退货需在30天内申请，自收货之日起计算。"


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def parse(path: Path) -> list[ParsedPage]:
    return parse_document(path, path.name)


def text_of(pages: list[ParsedPage]) -> str:
    return "\n\n".join(page.text for page in pages)


def refusal(path: Path) -> ParseError:
    with pytest.raises(ParseError) as caught:
        parse(path)
    return caught.value


# --- The sample documents ---

def test_sample_pdf_has_one_page_per_pdf_page_with_its_facts():
    pages = parse(HANDBOOK)

    assert [page.page for page in pages] == [1, 2, 3, 4]
    text = text_of(pages)
    for fact in ["25 days of annual leave", "March 31", "60 EUR per day", "above 25 EUR", "every 90 days",
                 "security@northwind.example within 24 hours"]:
        assert fact in " ".join(text.split())


def test_cleaning_removes_the_running_footer_of_the_sample_pdf():
    pages = parse(HANDBOOK)
    assert all("Employee Handbook — Page" in page.text for page in pages)

    cleaned = clean_pages(pages)

    assert [page.page for page in cleaned] == [1, 2, 3, 4]
    assert not any("— Page" in page.text for page in cleaned)
    assert cleaned[0].text.startswith("Northwind Robotics Employee Handbook")
    assert "25 days of annual leave" in cleaned[0].text


def test_sample_docx_keeps_headings_and_the_error_code_table():
    [page] = parse(PRODUCT_GUIDE)

    assert page.page is None
    lines = page.text.splitlines()
    assert "# NW-7 Warehouse Robot — Product Guide" in lines
    assert "# Error codes" in lines
    assert "## Monthly" in lines
    assert "E204 | Lidar obstruction | Clean the lidar sensor window with a dry microfibre cloth." in lines
    assert any(line.startswith("E310 | Motor overheating | Stop the robot for 30 minutes") for line in lines)
    for fact in ["Payload: up to 150 kg", "Battery runtime: 8 hours", "Charging time: 90 minutes",
                 "Maximum speed: 2 m/s"]:
        assert fact in page.text


def test_sample_markdown_keeps_english_and_chinese_text():
    [page] = clean_pages(parse(SUPPORT_FAQ))

    assert "## How do I reset the NW-7 robot?" in page.text
    assert "hold the power button on the rear panel for 10 seconds" in page.text.lower()
    assert "保修期为两年。" in page.text
    assert "客服电话：400-800-1234（周一至周五 9:00–18:00）" in page.text
    assert "退货需在30天内申请" in page.text
    assert "maria.keller@keller-logistik.example" in page.text


# --- Each supported type ---

def test_docx_paragraphs_headings_and_tables_come_through_in_order(tmp_path):
    document = docx.Document()
    document.add_heading("Travel policy", level=0)
    document.add_paragraph("Book trains in second class.")
    document.add_heading("Hotels", level=2)
    table = document.add_table(rows=2, cols=2)
    for row, values in zip(table.rows, [("City", "Limit"), ("Paris", "180 EUR")]):
        for cell, value in zip(row.cells, values):
            cell.text = value
    document.add_paragraph("Breakfast is included.")
    document.save(tmp_path / "travel.docx")

    [page] = parse(tmp_path / "travel.docx")

    assert page.text == ("# Travel policy\n\nBook trains in second class.\n\n## Hotels\n\n"
                         "City | Limit\nParis | 180 EUR\n\nBreakfast is included.")


def test_html_drops_boilerplate_and_keeps_structure(tmp_path):
    path = write(tmp_path, "faq.html", """<!doctype html>
        <html><head><title>FAQ</title><style>p { color: red }</style></head>
        <body>
          <header><nav><a href="/">Home</a> | <a href="/about">About</a></nav></header>
          <!-- tracking pixel below -->
          <h1>Robot   FAQ</h1>
          <p>To reset the robot, hold the
             power button for <b>10 seconds</b>.</p>
          <h2>Checklist</h2>
          <ul><li>Dock the robot</li><li>Clean the lidar</li></ul>
          <table><tr><th>Code</th><th>Action</th></tr><tr><td>E101</td><td>Dock</td></tr></table>
          <script>trackVisit()</script>
          <footer>© 2025 Northwind Robotics</footer>
        </body></html>""")

    [page] = parse(path)

    assert page.text == ("# Robot FAQ\n\nTo reset the robot, hold the power button for 10 seconds.\n\n"
                         "## Checklist\n\n- Dock the robot\n- Clean the lidar\n\nCode | Action\nE101 | Dock")


def test_markdown_and_text_are_kept_as_written(tmp_path):
    markdown = "# Title\n\nSome *emphasis* and a [link](https://example.com).\n"

    assert parse(write(tmp_path, "notes.md", markdown)) == [ParsedPage(markdown, None)]
    assert parse(write(tmp_path, "notes.markdown", markdown)) == [ParsedPage(markdown, None)]
    assert parse(write(tmp_path, "notes.txt", "plain text\n")) == [ParsedPage("plain text\n", None)]


def test_csv_rows_become_self_contained_lines(tmp_path):
    path = write(tmp_path, "contacts.csv", "team,email,phone\nSupport,support@northwind.example,400-800-1234\n"
                                           ",,\nSales,sales@northwind.example,\n")

    [page] = parse(path)

    assert page.text == ("team: Support; email: support@northwind.example; phone: 400-800-1234\n"
                         "team: Sales; email: sales@northwind.example")


def test_semicolon_csv_from_a_european_spreadsheet(tmp_path):
    path = write(tmp_path, "prices.csv", "Produkt;Preis\nNW-7;12000\nNW-7C;15500\n")

    assert parse(path)[0].text == "Produkt: NW-7; Preis: 12000\nProdukt: NW-7C; Preis: 15500"


def test_xlsx_gives_one_page_per_sheet_with_rows_as_lines(tmp_path):
    workbook = openpyxl.Workbook()
    robots = workbook.active
    robots.title = "Robots"
    for row in [("Model", "Payload kg", "Speed m/s"), ("NW-7", 150, 2.0), (None, None, None), ("NW-9", 300, 1.5)]:
        robots.append(row)
    workbook.create_sheet("Empty")
    offices = workbook.create_sheet("Offices")
    offices.append(("City", "Phone"))
    offices.append(("Hamburg", "+49 40 5550 1990"))
    workbook.save(tmp_path / "fleet.xlsx")

    pages = parse(tmp_path / "fleet.xlsx")

    assert pages == [
        ParsedPage("## Sheet: Robots\n\nModel: NW-7; Payload kg: 150; Speed m/s: 2\n"
                   "Model: NW-9; Payload kg: 300; Speed m/s: 1.5", None),
        ParsedPage("## Sheet: Offices\n\nCity: Hamburg; Phone: +49 40 5550 1990", None),
    ]


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16"])
def test_unicode_text_decodes_with_or_without_byte_order_mark(tmp_path, encoding):
    path = write(tmp_path, "warranty.txt", WARRANTY_ZH.encode(encoding))

    assert parse(path)[0].text == WARRANTY_ZH


def test_gbk_chinese_text_is_detected_and_decoded(tmp_path):
    path = write(tmp_path, "warranty.txt", WARRANTY_ZH.encode("gbk"))

    assert parse(path)[0].text == WARRANTY_ZH


def test_latin1_text_is_detected_and_decoded(tmp_path):
    text = "Grüße aus München! Die Straße zum Lager ist schön, aber die Brücke über die Elbe ist gesperrt.\n"

    assert parse(write(tmp_path, "notiz.txt", text.encode("latin-1")))[0].text == text


def test_file_kind_by_extension():
    assert file_kind("Report.PDF") == "pdf"
    assert file_kind("page.htm") == "html"
    assert file_kind("notes.markdown") == "markdown"
    assert {file_kind(f"x{extension}") for extension in SUPPORTED_EXTENSIONS} == {
        "pdf", "docx", "html", "markdown", "text", "csv", "xlsx", "image"}


# --- Files that are refused ---

def test_unsupported_extension_says_what_to_upload_instead(tmp_path):
    error = refusal(write(tmp_path, "setup.exe", b"MZ\x90\x00"))

    assert error.code == "unsupported_type"
    assert str(error) == error.reason == (
        ".exe files are not supported; upload PDF, DOCX, HTML, Markdown, TXT, CSV, XLSX or an image (PNG, JPEG, "
        "TIFF, WebP, BMP).")


def test_empty_file(tmp_path):
    error = refusal(write(tmp_path, "notes.txt", b""))

    assert (error.code, error.reason) == ("empty_file", "The file is empty (0 bytes).")


@pytest.mark.parametrize("name", ["blank.txt", "blank.md", "blank.html", "blank.csv"])
def test_whitespace_only_file_has_no_text(tmp_path, name):
    error = refusal(write(tmp_path, name, " \n\t\n   \r\n"))

    assert (error.code, error.reason) == ("no_text", "The file contains no text to ingest.")


def test_password_protected_pdf_is_refused(tmp_path):
    writer = PdfWriter(clone_from=HANDBOOK)
    writer.encrypt(user_password="s3cret", algorithm="AES-256")
    writer.write(tmp_path / "locked.pdf")

    error = refusal(tmp_path / "locked.pdf")

    assert error.code == "encrypted_pdf"
    assert "password" in error.reason


def test_pdf_with_only_an_owner_password_is_read(tmp_path):
    writer = PdfWriter(clone_from=HANDBOOK)
    writer.encrypt(user_password="", owner_password="owner-only", algorithm="AES-256")
    writer.write(tmp_path / "no-printing.pdf")

    assert "25 days of annual leave" in text_of(parse(tmp_path / "no-printing.pdf"))


def test_truncated_pdf_is_corrupt(tmp_path):
    path = write(tmp_path, "handbook.pdf", HANDBOOK.read_bytes()[:3000])

    error = refusal(path)

    assert error.code == "corrupt_file"
    assert "damaged or truncated" in error.reason


def test_file_named_pdf_that_is_not_a_pdf_is_corrupt(tmp_path):
    error = refusal(write(tmp_path, "invoice.pdf", "<html>Not found</html>"))

    assert (error.code, error.reason) == ("corrupt_file", "The file is named .pdf but is not a PDF document.")


def test_pdf_without_a_text_layer_is_left_to_ocr_or_refused_where_ocr_is_off(tmp_path):
    writer = PdfWriter()
    for _ in range(2):
        writer.add_blank_page(width=595, height=842)
    writer.write(tmp_path / "scan.pdf")

    assert parse(tmp_path / "scan.pdf") == [ParsedPage("", 1, needs_ocr=True), ParsedPage("", 2, needs_ocr=True)]
    with pytest.raises(ParseError) as refused:
        parse_document(tmp_path / "scan.pdf", "scan.pdf", ocr_mode="never")
    assert refused.value.code == "no_text"
    assert "OCR is off for this knowledge base; turn OCR on in its settings" in refused.value.reason


def test_a_pdf_with_a_text_layer_is_read_by_ocr_only_when_ocr_is_always_on():
    assert not any(page.needs_ocr for page in parse(HANDBOOK))
    assert all(page.needs_ocr and page.text for page in parse_document(HANDBOOK, "h.pdf", ocr_mode="always"))


@pytest.mark.parametrize("name, content, expected", [
    ("guide.docx", b"This is a plain text file, not a Word document.", "not a valid Word document"),
    ("guide.docx", HANDBOOK.read_bytes(), "not a valid Word document"),
    ("fleet.xlsx", bytes(random.Random(7).randbytes(4096)), "not a valid Excel workbook"),
])
def test_file_whose_bytes_do_not_match_its_type_is_corrupt(tmp_path, name, content, expected):
    error = refusal(write(tmp_path, name, content))

    assert error.code == "corrupt_file"
    assert expected in error.reason


def test_docx_that_is_another_zip_file_is_corrupt(tmp_path):
    openpyxl.Workbook().save(tmp_path / "report.docx")

    assert refusal(tmp_path / "report.docx").code == "corrupt_file"


@pytest.mark.parametrize("content", [
    random.Random(1).randbytes(4096),
    b"\x00" * 512,
    b"PK\x03\x04" + random.Random(2).randbytes(1024),
], ids=["random-bytes", "nul-bytes", "zip-named-txt"])
def test_binary_file_named_txt_is_not_ingested(tmp_path, content):
    error = refusal(write(tmp_path, "notes.txt", content))

    assert error.code == "wrong_encoding"
    assert "save it as UTF-8" in error.reason


def test_short_text_in_an_ambiguous_legacy_encoding_is_refused_rather_than_guessed(tmp_path):
    # Six GBK-encoded characters are equally valid Korean; a wrong guess would index mojibake.
    error = refusal(write(tmp_path, "title.txt", "保修期为两年".encode("gbk")))

    assert error.code == "wrong_encoding"


# --- Cleaning ---

def test_cleaning_normalises_unicode_and_whitespace():
    page = ParsedPage("ＮＷ－７\u00a0robot:  the\t\tpayload is\x07 150\u200b kg.   \r\n\r\n\r\n\r\n"
                      "Its ﬁrm\u00adware updates monthly.\n\n\n保修期为两年，客服电话：４００-８００-１２３４。", None)

    [cleaned] = clean_pages([page])

    assert cleaned == ParsedPage("NW-7 robot: the payload is 150 kg.\n\nIts firmware updates monthly.\n\n"
                                 "保修期为两年，客服电话：400-800-1234。", None)


def test_cleaning_drops_repeated_paragraphs_but_keeps_short_ones():
    disclaimer = "This document is confidential and intended for Northwind Robotics staff only."
    pages = [ParsedPage(f"Intro.\n\n{disclaimer}\n\nSee below.", 1),
             ParsedPage(f"Payload is 150 kg.\n\n{disclaimer}\n\nSee below.", 2)]

    cleaned = clean_pages(pages)

    assert [page.text for page in cleaned] == [f"Intro.\n\n{disclaimer}\n\nSee below.",
                                               "Payload is 150 kg.\n\nSee below."]


def test_cleaning_removes_running_headers_and_page_numbers_but_keeps_body_lines():
    topics = ["Leave", "Remote work", "Expenses", "Security", "Travel"]
    bodies = [f"{topic} policy.\nRule one on {topic}.\nRule two on {topic}.\nThe robot weighs 95 kg.\n"
              f"Rule three on {topic}.\nRule four on {topic}." for topic in topics]
    pages = [ParsedPage(f"ACME Internal\n{body}\nPage {number} of 5", number)
             for number, body in enumerate(bodies, start=1)]

    cleaned = clean_pages(pages)

    assert [page.text for page in cleaned] == bodies


def test_running_lines_are_kept_in_short_pdfs_and_non_pdf_documents():
    two_pages = [ParsedPage("Footer line\nBody one.", 1), ParsedPage("Footer line\nBody two.", 2)]
    sheets = [ParsedPage(f"Footer line\nRow {number}.", None) for number in range(3)]

    assert clean_pages(two_pages) == two_pages
    assert clean_pages(sheets) == sheets


def test_cleaning_drops_pages_left_empty():
    pages = [ParsedPage("Real content.", 1), ParsedPage(" \n\u200b\n\t", 2)]

    assert clean_pages(pages) == [ParsedPage("Real content.", 1)]
