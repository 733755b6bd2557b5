"""A parallel English / Chinese corpus the tests never see: the Linux man pages that Debian ships in both languages.

Chinese: the zh_CN pages of `manpages-zh`; English: the same pages from `manpages`, `manpages-dev` and `coreutils`.
The packages are fetched with `apt-get download` and unpacked with `dpkg -x` into a cache dir (FACTORY_BENCH_CACHE,
default ~/.cache/factory-bench), so nothing is installed on the system; a fresh container's empty package lists are
refreshed with `apt-get update` first.

Each page becomes a plain-text document (the roff macros and font escapes dropped, section titles on lines of their
own), cut to its first `EN_PAGE_CHARS` / `ZH_PAGE_CHARS` characters: the Chinese translations are of older, shorter
versions, and the start of a page (SYNOPSIS, DESCRIPTION) is what both languages have.

Questions come from each page's NAME line, "ls \\- list directory contents": the description with every name the
page documents removed ("list directory contents", "列出目录内容"), so no question names its page. The NAME section
is held out of the document, so a question is not a sentence of its page: retrieval must match it to what the rest
of the page says ("List information about the FILEs"). Only pages whose description makes a question in both
languages are asked about, the same pages in both.
"""

import gzip
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("FACTORY_BENCH_CACHE", Path.home() / ".cache" / "factory-bench"))
ENGLISH_PACKAGES = ("manpages", "manpages-dev", "coreutils")
CHINESE_PACKAGE = "manpages-zh"
EN_PAGE_CHARS = 4000
ZH_PAGE_CHARS = 1500
MIN_EN_WORDS = 3
MIN_ZH_CHARS = 4
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")


@dataclass(frozen=True)
class Page:
    path: str  # "man1/ls.1": the document's filename in the knowledge base, with ".txt"
    names: tuple[str, ...]  # what the page documents, from its NAME line ("strcpy", "strncpy")
    description: str  # the NAME line's text after the dash
    text: str

    @property
    def filename(self) -> str:
        return f"{self.path}.txt"


# ---- fetching ----


def ensure_packages() -> dict[str, Path]:
    """The unpacked root of each package, downloaded on first use."""
    return {package: debian_package(package) for package in (*ENGLISH_PACKAGES, CHINESE_PACKAGE)}


def debian_package(package: str) -> Path:
    """Where the Debian package's files are unpacked in the cache (its root: usr/share/... under it)."""
    root = CACHE / "debian" / package
    if not (root / "usr").is_dir():
        _download(package, root)
    return root


def _download(package: str, root: Path) -> None:
    print(f"Fetching the Debian package {package} into {root} ...", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        download = ["apt-get", "download", package]
        if subprocess.run(download, cwd=scratch).returncode != 0:
            subprocess.run(["apt-get", "update"], check=True)  # a fresh container has no package lists yet
            subprocess.run(download, cwd=scratch, check=True)
        (deb,) = Path(scratch).glob("*.deb")
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)


# ---- roff to text ----

_ESCAPES = [
    (re.compile(r"\\f(?:\(..|\[[^]]*]|.)"), ""),  # font changes: \fB, \fI, \fR, \fP, \f(CW
    (re.compile(r"\\[,/&:%]"), ""),  # italic corrections, zero-width marks
    (re.compile(r"\\\((?:aq|cq)"), "'"),
    (re.compile(r"\\\((?:lq|rq|dq)|\\\*\((?:lq|rq)"), '"'),
    (re.compile(r"\\\((?:em|en|hy)|\\-"), "-"),
    (re.compile(r"\\\(bu"), "*"),
    (re.compile(r"\\[e\\]"), "\\\\"),
    (re.compile(r"\\\*\[[^]]*]|\\\*\(..|\\\*.|\\\(..|\\\[[^]]*]"), ""),  # other strings and glyphs
    (re.compile(r"\\[ ~0|^]"), " "),
    (re.compile(r"\\(.)"), r"\1"),
]
_TWO_FONT_MACROS = {"BR", "RB", "BI", "IB", "IR", "RI"}  # alternate fonts between their words, no spaces between
_SKIPPED_MACROS = {"TH", "so", "ds", "de", "nr", "ie", "if", "el", "ig", "tr", "hy", "nh", "ad", "na", "ft", "in",
                   "ne", "ta", "ti", "ll", "ps", "vs", "ce", "UE", "ME", "EE", "EX", "RE", "RS", "\\\""}


def roff_text(source: str) -> str:
    """The text of a man page's roff source: macros dropped or replaced by their words, escapes resolved."""
    lines: list[str] = []
    for line in source.splitlines():
        if line.startswith(("'", '.\\"', "'\\\"")) or line.strip() in {".", ""}:
            continue
        if line.startswith("."):
            macro, _, rest = line[1:].strip().partition(" ")
            if macro in {"SH", "SS"}:
                lines.extend(["", _unescape(_unquote(rest)), ""])
            elif macro in _TWO_FONT_MACROS:
                lines.append("".join(_words(rest)))
            elif macro in {"B", "I", "SM", "SB", "UR", "MT", "IP", "TP", "TQ"} and rest:
                lines.append(" ".join(_words(rest)) if macro not in {"IP", "TP", "TQ"} else "")
            elif macro in {"PP", "LP", "P", "sp", "br", "TP", "IP", "TQ", "nf", "fi"}:
                lines.append("")
            continue  # anything in _SKIPPED_MACROS, and macros we do not know
        lines.append(_unescape(line))
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines))
    return re.sub(r"[ \t]+", " ", text).strip()


def _unquote(text: str) -> str:
    return text.strip().strip('"')


def _words(rest: str) -> list[str]:
    return [_unescape(word.strip('"')) for word in re.findall(r'"[^"]*"|\S+', rest)]


def _unescape(text: str) -> str:
    for pattern, replacement in _ESCAPES:
        text = pattern.sub(replacement, text)
    return text


# ---- pages and questions ----

_NAME_SECTION = re.compile(r"^(?:NAME|名称|名字|名稱|名 称|名 字)\s*$", re.MULTILINE)
_NAME_LINE = re.compile(r"^(?P<names>[^\n]+?)\s+[-－—]+\s*(?P<description>[^\n]+)$", re.MULTILINE)


def read_page(path: Path, relative: str, limit: int) -> Page | None:
    """The page at `path` (a .gz roff file), or None where it is an alias (.so) or has no NAME line."""
    if path.is_symlink():
        return None
    source = gzip.decompress(path.read_bytes()).decode("utf-8", errors="replace")
    if re.search(r"^\.so ", source, re.MULTILINE):
        return None
    text = roff_text(source)
    section = _NAME_SECTION.search(text)
    match = _NAME_LINE.search(text, section.end()) if section else None
    if match is None:
        return None
    names = tuple(name.strip() for name in re.split(r"[,，、]", match["names"]) if name.strip())
    # The NAME section is held out: the question is its line, and the page must be found by what the rest says.
    rest = (text[:section.start()] + text[match.end():]).strip()
    return Page(relative, names, match["description"].strip(), rest[:limit])


def parallel_pages(roots: dict[str, Path]) -> tuple[list[Page], list[Page]]:
    """The pages present in both languages, as (English, Chinese), in the same order."""
    chinese_root = roots[CHINESE_PACKAGE] / "usr/share/man/zh_CN"
    english = {}
    for package in ENGLISH_PACKAGES:
        for path in (roots[package] / "usr/share/man").glob("man*/*.gz"):
            english.setdefault(str(path.relative_to(roots[package] / "usr/share/man"))[:-3], path)
    pairs = []
    for path in sorted(chinese_root.glob("man*/*.gz")):
        relative = str(path.relative_to(chinese_root))[:-3]
        if relative not in english:
            continue
        en = read_page(english[relative], relative, EN_PAGE_CHARS)
        zh = read_page(path, relative, ZH_PAGE_CHARS)
        if en and zh:
            pairs.append((en, zh))
    return [en for en, _ in pairs], [zh for _, zh in pairs]


def question(page: Page) -> str:
    """The page's NAME description with every name it documents (and its filename's) taken out; '' where too
    little is left to ask with."""
    names = {*page.names, page.path.split("/")[-1].rsplit(".", 1)[0]}
    text = page.description
    for name in sorted(names, key=len, reverse=True):
        text = re.sub(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", " ", text, flags=re.IGNORECASE)
    text = " ".join(re.sub(r"\(\s*\)|\s+([,.;:，。；])", r"\1", text).split()).strip(" ,;:，；、")
    if names_in(text, names):
        return ""
    if _CJK.search(page.description):
        return text if len(_CJK.findall(text)) >= MIN_ZH_CHARS else ""
    return text if len(re.findall(r"[A-Za-z]+", text)) >= MIN_EN_WORDS else ""


def names_in(text: str, names) -> list[str]:
    """The page names that `text` still holds as whole words."""
    return [name for name in names
            if re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", text, flags=re.IGNORECASE)]


def questions(english: list[Page], chinese: list[Page], count: int) -> list[tuple[Page, str, Page, str]]:
    """(English page, its question, Chinese page, its question) for up to `count` pages spread over the corpus,
    where both languages give a question and neither repeats another page's question. Descriptions that named
    no page (so the question is a whole sentence) come first where there are enough of them."""
    asked_en, asked_zh, usable, whole = set(), set(), [], []
    for en, zh in zip(english, chinese):
        en_question, zh_question = question(en), question(zh)
        if en_question and zh_question and en_question.lower() not in asked_en and zh_question not in asked_zh:
            asked_en.add(en_question.lower())
            asked_zh.add(zh_question)
            usable.append((en, en_question, zh, zh_question))
            if en_question == en.description and zh_question == zh.description:
                whole.append(usable[-1])
    usable = whole if len(whole) >= count else usable
    count = min(count, len(usable))
    return [usable[index * len(usable) // count] for index in range(count)]
