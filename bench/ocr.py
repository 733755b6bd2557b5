"""OCR of scanned pages (rag_studio/pipeline/ocr/): how well, how fast, and whether search still finds the answers.

    .venv/bin/python -m bench.ocr [--scan-pages 10] [--tesseract] [--keep]

The corpus is known text: English and Chinese pages in one and two columns, a table in both languages, and an
English page turned by 90°, each rendered on A4 at 150 and 300 dpi (DejaVu Serif and WenQuanYi Zen Hei: `scripts/
system-deps.sh cjk-font`) with the skew, blur and noise of a scanner, saved as a PNG and as an image-only PDF. It
prints:
- character accuracy: 1 - edit distance / length of the known text, over each language's pages (reading order
  counts: a two-column page read across the columns scores low; whitespace, Markdown marks and the width of
  punctuation do not). Targets: English >= 98%, Chinese >= 95% at 300 dpi;
- seconds per page at 300 dpi on one core (the process pinned to one, RAG_OCR_THREADS 1, the default). Target <= 2 s;
- pages per minute for a 100-page scan with the default worker settings, estimated from a --scan-pages run through
  the ingestion pipeline (upload, parse, OCR in turns, clean ... index). One document is read by one worker at a
  time, so the worker's other process (FACTORY_WORKER_CONCURRENCY 2) reads another scan meanwhile;
- hit@5 of the same questions on the corpus ingested born-digital (its text as Markdown) and scanned (its 300 dpi
  PDFs). Target: within 0.03;
- with --tesseract, Debian's tesseract (chi_sim+eng, one thread) on the same images, for comparison.

Self-contained: Django runs on a fresh data dir with its own SQLite database and its own redis-server on a free
port, all removed at the end unless --keep.
"""

import argparse
import atexit
import io
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path


def _start_redis(data_dir: Path) -> None:
    """A redis-server of the bench's own (ingestion records durations in Redis and tops up the line's messages),
    so that nothing reaches a running platform's broker; stopped when the process exits."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    subprocess.run(["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
                    "--daemonize", "yes", "--dir", str(data_dir), "--logfile", str(data_dir / "redis.log")],
                   check=True)
    os.environ["REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
    atexit.register(lambda: subprocess.run(["redis-cli", "-p", str(port), "shutdown", "nosave"], capture_output=True))
    for _ in range(50):
        if subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).returncode == 0:
            break
        time.sleep(0.1)


# Before Django reads its settings: a private data dir, SQLite in it, and a Redis of its own.
DATA_DIR = Path(tempfile.mkdtemp(prefix="bench-ocr-"))
os.environ["FACTORY_DATA_DIR"] = str(DATA_DIR)
os.environ.pop("DATABASE_URL", None)
os.environ["FACTORY_RAG_ADAPTIVE_DEFAULTS"] = "off"
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "factory.settings")
_start_redis(DATA_DIR)

import django  # noqa: E402

django.setup()

import numpy as np  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.files.uploadedfile import SimpleUploadedFile  # noqa: E402
from django.core.management import call_command  # noqa: E402
from PIL import Image, ImageDraw, ImageFilter, ImageFont  # noqa: E402
from rapidfuzz.distance import Levenshtein  # noqa: E402

from accounts.services import SYSTEM, Actor, create_workspace  # noqa: E402
from rag_studio import services  # noqa: E402
from rag_studio.models import Document, DocumentStatus  # noqa: E402
from rag_studio.pipeline.ingestion import ingest  # noqa: E402
from rag_studio.pipeline.ocr.images import PageImages  # noqa: E402
from rag_studio.pipeline.ocr.reading import read_page  # noqa: E402
from rag_studio.search.retrieval import retrieve  # noqa: E402
from serving import presets  # noqa: E402
from serving.preset_names import MULTILINGUAL_E5  # noqa: E402
from serving.services import register_model  # noqa: E402

TARGETS = {"en": 0.98, "zh": 0.95}
TARGET_SECONDS = 2.0
TARGET_HIT_GAP = 0.03
A4_INCHES = (8.27, 11.69)
SERIF = "/usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf"
CHINESE_FONT = "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc"

EN_ONE = ("Northwind Robotics Employee Handbook", [
    "Employees receive twenty-five days of paid annual leave each calendar year. Unused days may be carried over "
    "until the end of March of the following year, after which they expire.",
    "Sick leave of up to three days needs no certificate. From the fourth day of illness, employees send a "
    "doctor's note to the people team within two working days.",
    "Travel expenses are reimbursed within thirty days of submission. Receipts must be uploaded to the finance "
    "portal together with the purpose of the trip and the project code.",
    "The Hamburg office opens at seven in the morning and closes at eight in the evening. Visitors register at the "
    "reception desk on the ground floor and wear a badge at all times.",
    "Laptops are replaced every four years. A damaged device is reported to the service desk, which lends a spare "
    "machine on the same day while the repair is arranged.",
])
EN_TWO = ("Field Service Bulletin", [
    "The NW-7 warehouse robot carries loads of up to 150 kilograms and travels at two metres per second on flat "
    "concrete floors.",
    "Its lithium battery charges fully in forty-five minutes at a standard dock. A fast dock halves the charging "
    "time but shortens battery life.",
    "Firmware updates are released on the first Tuesday of every month. Robots install them overnight when they "
    "are parked at a dock.",
    "Error code E204 means that a wheel encoder has lost its signal. Technicians check the cable before they "
    "replace the encoder itself.",
    "The NW-9 Heavy model lifts pallets of 300 kilograms. It needs aisles at least two metres wide and a floor "
    "rated for its weight.",
    "Customers book service visits through the support portal. An engineer confirms the appointment within one "
    "business day by email.",
])
EN_TURNED = ("Safety Notice", [
    "Before each shift, operators inspect the emergency stop buttons on every robot and record the result in the "
    "maintenance log.",
    "Safety vests are yellow with grey reflective stripes and must be worn in every loading area, including by "
    "visitors and contractors.",
    "The loading dock holds twelve pallets. Forklifts give way to pedestrians, and robots stop when a person "
    "steps into their path.",
])
ZH_ONE = ("北风机器人员工手册", [
    "员工每年享有十五天带薪年假，未休完的年假可以顺延到次年三月底，逾期作废。",
    "病假三天以内无需证明，从第四天起需要在两个工作日内向人事部提交医生证明。",
    "差旅费用在提交申请后三十天内报销，发票需要上传到财务系统，并注明出差目的和项目编号。",
    "汉堡办公室早上七点开门，晚上八点关门。访客需要在一楼前台登记，并全程佩戴胸卡。",
    "笔记本电脑每四年更换一次。设备损坏时请联系服务台，服务台当天会借出备用电脑并安排维修。",
])
ZH_TWO = ("设备维护通知", [
    "车间设备每周一上午进行例行点检，点检结果记录在设备台账中，由班组长签字确认。",
    "压力容器的额定压力为一点六兆帕，工作温度不得超过一百八十摄氏度。",
    "进入车间必须佩戴安全帽和防护眼镜，女工须将长发盘起，严禁穿拖鞋进入生产区域。",
    "发现设备异常时，操作人员应立即按下急停按钮，并在十分钟内通知当班维修人员。",
    "备品备件由仓库统一管理，领用时需填写领料单，每月底盘点一次库存。",
    "新员工上岗前须参加为期三天的安全培训，考试合格后方可独立操作设备。",
])
TABLE = ("Robot Models 机器人型号", [
    ["Model 型号", "Payload 载重", "Speed 速度", "Battery 电池"],
    ["NW-5 Compact", "80 kg", "2.5 m/s", "6 hours"],
    ["NW-7 Standard", "150 kg", "2.0 m/s", "8 hours"],
    ["NW-9 Heavy", "300 kg", "1.5 m/s", "10 hours"],
    ["NW-11 Outdoor", "200 kg", "1.8 m/s", "12 hours"],
])
# Questions over the corpus, each with words only the passage that answers it holds.
QUESTIONS = [
    ("How many days of paid annual leave do employees get?", "twenty-five days of paid annual leave"),
    ("When do I need a doctor's note for sick leave?", "From the fourth day of illness"),
    ("How quickly are travel expenses reimbursed?", "reimbursed within thirty days"),
    ("What time does the Hamburg office open?", "opens at seven in the morning"),
    ("How often are laptops replaced?", "replaced every four years"),
    ("How much can the NW-7 robot carry?", "up to 150 kilograms"),
    ("How long does the NW-7 battery take to charge?", "charges fully in forty-five minutes"),
    ("When are firmware updates released?", "first Tuesday of every month"),
    ("What does error code E204 mean?", "wheel encoder has lost its signal"),
    ("How wide must aisles be for the NW-9 Heavy?", "two metres wide"),
    ("How do customers book a service visit?", "through the support portal"),
    ("What must operators inspect before each shift?", "emergency stop buttons"),
    ("What colour are the safety vests?", "yellow with grey reflective stripes"),
    ("How many pallets does the loading dock hold?", "holds twelve pallets"),
    ("员工每年有多少天带薪年假？", "十五天带薪年假"),
    ("病假从第几天起需要医生证明？", "从第四天起"),
    ("差旅费用多久可以报销？", "三十天内报销"),
    ("汉堡办公室几点开门？", "早上七点开门"),
    ("笔记本电脑多久更换一次？", "每四年更换一次"),
    ("设备点检在什么时候进行？", "每周一上午"),
    ("压力容器的额定压力是多少？", "一点六兆帕"),
    ("进入车间需要佩戴什么？", "安全帽和防护眼镜"),
    ("设备异常时操作人员应该怎么做？", "急停按钮"),
    ("备品备件如何领用？", "填写领料单"),
    ("新员工上岗前要参加多久的安全培训？", "三天的安全培训"),
    ("What is the payload of the NW-11 Outdoor?", "NW-11 Outdoor"),
]


@dataclass(frozen=True)
class Sheet:
    """A page of the corpus: its known text and how it is laid out."""

    name: str
    language: str  # "en", "zh", or "mixed" for the table
    heading: str
    paragraphs: list
    columns: int = 1
    table: bool = False
    turn: int = 0

    def known_text(self) -> str:
        if self.table:
            return "\n".join([self.heading, *(" | ".join(row) for row in self.paragraphs)])
        return "\n".join([self.heading, *self.paragraphs])

    def markdown(self) -> str:
        """The page born digital."""
        body = "\n".join(" | ".join(row) for row in self.paragraphs) if self.table else "\n\n".join(self.paragraphs)
        return f"# {self.heading}\n\n{body}\n"


CORPUS = [Sheet("en-one-column", "en", *EN_ONE), Sheet("en-two-columns", "en", *EN_TWO, columns=2),
          Sheet("en-turned-90", "en", *EN_TURNED, turn=90), Sheet("zh-one-column", "zh", *ZH_ONE),
          Sheet("zh-two-columns", "zh", *ZH_TWO, columns=2), Sheet("table", "mixed", *TABLE, table=True)]
# Full pages (about 2,300 English characters, 45 lines; 450 Chinese characters, 25 lines) for the time a page takes;
# their text repeats the corpus's, so retrieval leaves them out.
FULL_PAGES = [Sheet("en-full-page", "en", EN_ONE[0], EN_ONE[1] + EN_TWO[1] + EN_TURNED[1]),
              Sheet("zh-full-page", "zh", ZH_ONE[0], ZH_ONE[1] + ZH_TWO[1])]
SHEETS = CORPUS + FULL_PAGES


# --- Rendering ---

def _font(path: str, points: float, dpi: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(path if Path(path).exists() else CHINESE_FONT, round(points * dpi / 72))


def _wrapped(text: str, font, width: float) -> list[str]:
    """Lines no wider than `width` pixels: by words, or by characters for Chinese."""
    pieces = list(text) if re.search(r"[\u4e00-\u9fff]", text) else text.split(" ")
    joiner = "" if pieces == list(text) else " "
    lines, line = [], ""
    for piece in pieces:
        candidate = f"{line}{joiner}{piece}" if line else piece
        if font.getlength(candidate) <= width:
            line = candidate
        else:
            lines.append(line)
            line = piece
    return lines + [line]


def render(sheet: Sheet, dpi: int, *, seed: int) -> Image.Image:
    """The sheet on white A4, then as a scanner leaves it: turned, skewed by up to 1.2°, blurred, noisy."""
    width, height = (round(inches * dpi) for inches in A4_INCHES)
    image = Image.new("L", (width, height), 255)
    draw = ImageDraw.Draw(image)
    body_font = _font(CHINESE_FONT if sheet.language == "zh" else SERIF, 10.5, dpi)
    cell_font = _font(CHINESE_FONT, 10.5, dpi)
    heading_font = _font(CHINESE_FONT if sheet.language != "en" else SERIF, 18, dpi)
    margin, pitch, gutter = dpi, 10.5 * dpi / 72 * 1.45, 0.35 * dpi
    draw.text((margin, margin), sheet.heading, font=heading_font, fill=0)
    top = margin + 3 * pitch
    if sheet.table:
        column_width = (width - 2 * margin) / len(sheet.paragraphs[0])
        for number, row in enumerate(sheet.paragraphs):
            for column, cell in enumerate(row):
                draw.text((margin + column * column_width, top + number * 1.8 * pitch), cell, font=cell_font, fill=0)
    else:
        column_width = (width - 2 * margin - (sheet.columns - 1) * gutter) / sheet.columns
        per_column = -(-len(sheet.paragraphs) // sheet.columns)
        for column in range(sheet.columns):
            x, y = margin + column * (column_width + gutter), top
            for paragraph in sheet.paragraphs[column * per_column:(column + 1) * per_column]:
                for line in _wrapped(paragraph, body_font, column_width):
                    draw.text((x, y), line, font=body_font, fill=0)
                    y += pitch
                y += 0.8 * pitch
    rng = np.random.default_rng(seed)
    image = image.rotate(sheet.turn + rng.uniform(-1.2, 1.2), expand=True, fillcolor=255, resample=Image.BICUBIC)
    image = image.filter(ImageFilter.GaussianBlur(0.35 * dpi / 150))
    levels = np.asarray(image, dtype=np.float64) + rng.normal(0, 12, (image.height, image.width))
    return Image.fromarray(np.clip(levels, 0, 255).astype(np.uint8))


def image_pdf(pages: list[Image.Image], dpi: int) -> bytes:
    out = io.BytesIO()
    first, *rest = [page.convert("RGB") for page in pages]
    first.save(out, format="PDF", save_all=True, append_images=rest, resolution=dpi)
    return out.getvalue()


def png(page: Image.Image) -> bytes:
    out = io.BytesIO()
    page.save(out, format="PNG")
    return out.getvalue()


# --- Measures ---

def normalised(text: str) -> str:
    """What accuracy compares: NFKC (full- and half-width punctuation alike), no Markdown marks or cell bars,
    single spaces, none beside a Chinese character."""
    text = unicodedata.normalize("NFKC", text)
    text = " ".join(re.sub(r"(^|\n)#+ |\|", " ", text).split())
    return re.sub(r" (?=[\u3000-\u303f\u4e00-\u9fff])|(?<=[\u3000-\u303f\u4e00-\u9fff]) ", "", text)


@dataclass
class Score:
    errors: int = 0
    length: int = 0

    def add(self, read: str, known: str) -> None:
        read, known = normalised(read), normalised(known)
        self.errors += Levenshtein.distance(read, known)
        self.length += len(known)

    @property
    def accuracy(self) -> float:
        return 1 - self.errors / max(self.length, 1)


def read_file(path: Path, kind: str) -> tuple[str, float, float]:
    """The page's text by the product's path (its image, then read_page), and the wall and CPU seconds both took:
    the process is pinned to one core, so CPU seconds are what the page costs a core, wall seconds what it took on
    a box shared with others."""
    started, cpu = time.perf_counter(), time.process_time()
    with PageImages(path, kind) as pages:
        reading = read_page(pages.page(1), latin_only=False, timeout_s=600)
    return reading.text, time.perf_counter() - started, time.process_time() - cpu


def tesseract(path: Path) -> tuple[str, float, float]:
    started, cpu = time.perf_counter(), _children_cpu()
    result = subprocess.run(["tesseract", str(path), "stdout", "-l", "chi_sim+eng", "--psm", "1"],
                            capture_output=True, text=True, env={**os.environ, "OMP_THREAD_LIMIT": "1"})
    return result.stdout, time.perf_counter() - started, _children_cpu() - cpu


def _children_cpu() -> float:
    times = os.times()
    return times.children_user + times.children_system


def accuracy_and_speed(files: dict, compare_tesseract: bool) -> None:
    print("\n-- Character accuracy against the known text (1 - edit distance / length), and seconds per page")
    engines = {"RapidOCR png": lambda path: read_file(path, "image"),
               "RapidOCR pdf": lambda path: read_file(path.with_suffix(".pdf"), "pdf")}
    if compare_tesseract:
        engines["tesseract png"] = tesseract
    print(f"{'engine':<15}{'dpi':>5}{'English':>10}{'Chinese':>10}{'table':>8}{'s/page':>8}{'max':>6}{'cpu':>6}"
          f"{'max':>6}   by sheet: accuracy, wall s")
    for engine, read in engines.items():
        for dpi in (150, 300):
            scores, seconds, cpu, by_sheet = {"en": Score(), "zh": Score(), "mixed": Score()}, [], [], []
            for sheet in SHEETS:
                text, elapsed, cpu_seconds = read(files[sheet.name, dpi])
                scores[sheet.language].add(text, sheet.known_text())
                single = Score()
                single.add(text, sheet.known_text())
                seconds.append(elapsed)
                cpu.append(cpu_seconds)
                by_sheet.append(f"{sheet.name} {single.accuracy:.3f} {elapsed:.1f}")
            print(f"{engine:<15}{dpi:>5}{scores['en'].accuracy:>10.2%}{scores['zh'].accuracy:>10.2%}"
                  f"{scores['mixed'].accuracy:>8.2%}{np.mean(seconds):>8.2f}{max(seconds):>6.2f}{np.mean(cpu):>6.2f}"
                  f"{max(cpu):>6.2f}   {'; '.join(by_sheet)}")
    print(f"Targets at 300 dpi: English >= {TARGETS['en']:.0%}, Chinese >= {TARGETS['zh']:.0%}; <= "
          f"{TARGET_SECONDS:.0f} s per page on one core (s/page: wall, cpu: CPU seconds of the pinned core; pdf rows "
          f"include rendering the page at 300 dpi).")


def bench_workspace():
    call_command("migrate", verbosity=0)
    for name in (presets.MINILM, MULTILINGUAL_E5):
        locate, role, _template = presets.PRESETS[name]
        register_model(actor=SYSTEM, workspace=None, name=name, path=str(locate()), role_hint=role)
    actor = Actor(user=get_user_model().objects.create_user(username="bench", is_staff=True))
    return actor, create_workspace(actor=actor, name="Bench")


def ingest_upload(actor, kb, name: str, content: bytes) -> tuple[Document, int]:
    """Upload through the product's path, then ingest as the worker does, turn after turn; the document and the
    number of turns it took."""
    [outcome] = services.upload_documents(actor=actor, kb=kb, uploads=[SimpleUploadedFile(name, content)])
    turns = 0
    while True:
        turns += 1
        status = ingest(outcome.document.pk, "bench")
        if status in (DocumentStatus.INDEXED, DocumentStatus.FAILED):
            break
    document = Document.objects.get(pk=outcome.document.pk)
    if document.status != DocumentStatus.INDEXED:
        raise RuntimeError(f"{name} failed: {document.error}")
    return document, turns


def throughput(actor, workspace, pages: int) -> None:
    print(f"\n-- A {pages}-page scan (300 dpi, image-only PDF) through the ingestion pipeline")
    sheets = [[*FULL_PAGES, *CORPUS][number % len(SHEETS)] for number in range(pages)]
    scan = image_pdf([render(sheet, 300, seed=100 + number) for number, sheet in enumerate(sheets)], 300)
    kb = services.create_knowledge_base(actor=actor, workspace=workspace, name="throughput",
                                        embedding_model=MULTILINGUAL_E5)
    started = time.perf_counter()
    document, turns = ingest_upload(actor, kb, "scan.pdf", scan)
    elapsed = time.perf_counter() - started
    ocr_seconds = sum(page.seconds for page in document.ocr_pages.all())
    rate = pages / elapsed * 60
    print(f"{pages} pages in {elapsed:.1f} s ({turns} turns of FACTORY_RAG_OCR_TURN_S {settings.RAG_OCR_TURN_S:.0f} s;"
          f" reading pages {ocr_seconds:.1f} s, the rest rendering, chunking, embedding and indexing): "
          f"{rate:.1f} pages/min.")
    print(f"A 100-page scan, estimated from this {pages}-page run: {rate:.1f} pages/min, about "
          f"{100 / rate:.1f} min. Each scan is read by one worker process at a time; with the default "
          f"FACTORY_WORKER_CONCURRENCY 2 a second scan is read meanwhile ({2 * rate:.1f} pages/min for two).")


def retrieval(actor, workspace, files: dict) -> None:
    print("\n-- hit@5 of the same questions on the corpus born digital (Markdown) and scanned (300 dpi PDFs)")
    hits = {}
    for variant in ("born digital", "scanned"):
        kb = services.create_knowledge_base(
            actor=actor, workspace=workspace, name=variant, embedding_model=MULTILINGUAL_E5,
            chunking={"mode": "recursive", "chunk_size": 300, "chunk_overlap": 0})
        for sheet in CORPUS:
            if variant == "born digital":
                ingest_upload(actor, kb, f"{sheet.name}.md", sheet.markdown().encode())
            else:
                ingest_upload(actor, kb, f"{sheet.name}.pdf", files[sheet.name, 300].with_suffix(".pdf").read_bytes())
        found = 0
        for question, evidence in QUESTIONS:
            texts = [normalised(hit.text).lower() for hit in retrieve(kb, question).hits[:5]]
            found += any(normalised(evidence).lower() in text for text in texts)
        hits[variant] = found / len(QUESTIONS)
        print(f"{variant:<13} hit@5 {hits[variant]:.3f} ({found} of {len(QUESTIONS)} questions)")
    gap = hits["born digital"] - hits["scanned"]
    print(f"Gap {gap:+.3f} (target: within {TARGET_HIT_GAP}).")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scan-pages", type=int, default=10, help="pages of the throughput run")
    parser.add_argument("--tesseract", action="store_true", help="also read the images with Debian's tesseract")
    parser.add_argument("--keep", action="store_true", help="keep the data dir")
    args = parser.parse_args()
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})  # one core: the figures are per core
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    print(f"== bench.ocr: pinned to CPU {core} of {os.cpu_count()}, load average {load}; RAG_OCR_THREADS "
          f"{settings.RAG_OCR_THREADS}; data dir {DATA_DIR}")
    try:
        files = {}
        for sheet in SHEETS:
            for dpi in (150, 300):
                page = render(sheet, dpi, seed=dpi)
                path = DATA_DIR / f"{sheet.name}-{dpi}.png"
                path.write_bytes(png(page))
                path.with_suffix(".pdf").write_bytes(image_pdf([page], dpi))
                files[sheet.name, dpi] = path
        read_file(files[SHEETS[0].name, 150], "image")  # loads the models: once per worker process, not per page
        accuracy_and_speed(files, args.tesseract)
        actor, workspace = bench_workspace()
        throughput(actor, workspace, args.scan_pages)
        retrieval(actor, workspace, files)
    finally:
        if args.keep:
            print(f"Kept the data dir {DATA_DIR}")
        else:
            shutil.rmtree(DATA_DIR, ignore_errors=True)


if __name__ == "__main__":
    main()
