"""The question sets the RAG benchmarks ask, with the corpora they are asked of:

- English: 40 hand-written questions on the HTML of Debian's python3.11-doc (the whole tutorial and the library
  pages they ask about), each with its answer, page and an evidence phrase of the answering passage;
- Chinese: the plant handbook in rag_studio/samples/ (three documents) and its 28 questions (huadong-eval.jsonl);
- man pages: the same pages in English and Chinese (bench/helpers/manpages.py), 60 questions each.

Relevance is per chunk: a hit is relevant when it comes from the question's page and contains its evidence phrase.
"""

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from bench.helpers import manpages

PYTHON_DOCS = "python3.11-doc"
LIBRARY_PAGES = ("functions", "stdtypes", "exceptions", "json", "csv", "pathlib", "os.path", "collections",
                 "itertools", "functools", "datetime", "re", "string", "math", "random", "statistics", "heapq",
                 "bisect", "dataclasses", "enum", "argparse", "subprocess", "logging")
SAMPLES = Path(__file__).resolve().parents[2] / "rag_studio" / "samples"
CHINESE_DOCUMENTS = ("huadong-plant-handbook.md", "huadong-maintenance-rules.docx", "huadong-shift-handover.txt")
CHINESE_EVAL_SET = SAMPLES / "huadong-eval.jsonl"
CHUNK_SIZES = {"english": (800, 100), "chinese": (240, 40), "manpages-en": (800, 100), "manpages-zh": (240, 40)}
MANPAGE_QUESTIONS = 60


@dataclass(frozen=True)
class Question:
    text: str
    answer: str
    source: str  # the page (under docs() for the Python docs), also the document's filename in the knowledge base
    evidence: str  # a phrase of the answering passage; a relevant chunk contains it (case-insensitive)


def _tutorial(text: str, answer: str, page: str, evidence: str) -> Question:
    return Question(text, answer, f"tutorial/{page}.html", evidence)


def _library(text: str, answer: str, page: str, evidence: str) -> Question:
    return Question(text, answer, f"library/{page}.html", evidence)


# Answers and phrases checked against the 3.11.2 docs of Debian 12. Questions paraphrase the docs rather than quote
# them, so keyword search cannot win on wording alone.
QUESTIONS = [
    _tutorial("What does the pass statement do?",
              "Nothing; it is used when a statement is required syntactically but no action is needed.",
              "controlflow", "pass statement does nothing"),
    _tutorial("How many times is the default value of a function argument evaluated?",
              "Only once, at the point of function definition.", "controlflow", "evaluated only once"),
    _tutorial("What is the maximum line length recommended by the coding style section?",
              "79 characters.", "controlflow", "exceed 79 characters"),
    _tutorial("How do you write a small anonymous function?",
              "With the lambda keyword; it is restricted to a single expression.", "controlflow",
              "created with the lambda keyword"),
    _tutorial("Which symbol marks the end of the positional-only parameters in a function definition?",
              "A / (forward slash).", "controlflow", "positional-only parameters are placed before a /"),
    _tutorial("In the interactive interpreter, where is the last printed expression stored?",
              "It is assigned to the variable _.", "introduction", "last printed expression is assigned"),
    _tutorial("Can you change a character of a Python string in place?",
              "No, strings are immutable; assigning to an index raises an error.", "introduction",
              "they are immutable"),
    _tutorial("How do you create an empty set?",
              "Use set(), not {}, which creates an empty dictionary.", "datastructures",
              "to create an empty set you have to use set()"),
    _tutorial("Which type should be used for a queue with fast appends and pops at both ends?",
              "collections.deque", "datastructures", "to implement a queue, use collections.deque"),
    _tutorial("When is the finally clause of a try statement executed?",
              "As the last task before the try statement completes, whether or not an exception occurred.",
              "errors", "finally clause runs whether or not"),
    _tutorial("What is the else clause of a try statement for?",
              "Code that must be executed if the try clause does not raise an exception.", "errors",
              "has an optional else clause"),
    _tutorial("How can extra information be added to an exception after it was caught?",
              "Call its add_note() method with a string.", "errors", "method add_note(note)"),
    _tutorial("How can several unrelated exceptions be raised together?",
              "Wrap them in an ExceptionGroup.", "errors", "ExceptionGroup wraps a list of exception instances"),
    _tutorial("What happens to a class attribute named __spam?",
              "Name mangling: it is textually replaced with _classname__spam.", "classes",
              "textually replaced with _classname__spam"),
    _tutorial("Where does Python cache the compiled versions of modules?",
              "In the __pycache__ directory, as module.version.pyc.", "modules",
              "caches the compiled version of each module"),
    _tutorial("What does a package's __all__ list decide?",
              "The module names imported by from package import *.", "modules",
              "taken to be the list of module names"),
    _tutorial("What command creates a virtual environment named tutorial-env?",
              "python3 -m venv tutorial-env", "venv", "python3 -m venv tutorial-env"),
    _tutorial("Where does the name of the language come from?",
              "The BBC show Monty Python's Flying Circus, not reptiles.", "appetite",
              "has nothing to do with reptiles"),
    _tutorial("How do you run your own start-up commands every time the interactive interpreter starts?",
              "Set the PYTHONSTARTUP environment variable to the name of a file with the commands.", "appendix",
              "environment variable named PYTHONSTARTUP"),
    _library("What does json.dumps do with non-ASCII characters by default?",
             "Escapes them, because ensure_ascii is true by default.", "json",
             "If ensure_ascii is true (the default)"),
    _library("What exception does json.loads raise for an invalid JSON document?",
             "JSONDecodeError", "json", "JSONDecodeError will be raised"),
    _library("How does round() break a tie between two equally close multiples?",
             "Toward the even choice: round(0.5) and round(-0.5) are 0, round(1.5) is 2.", "functions",
             "rounding is done toward the even choice"),
    _library("How do you make zip() check that all iterables have the same length?",
             "Pass strict=True.", "functions", "use the strict=True option"),
    _library("What does buffering=1 mean when opening a file?",
             "Line buffering, only usable in text mode.", "functions", "1 to select line buffering"),
    _library("What does str.zfill do?",
             "Returns a copy of the string left filled with ASCII '0' digits to the given width.", "stdtypes",
             "left filled with ASCII '0' digits"),
    _library("Do dictionaries remember the order in which keys were added?",
             "Yes, dictionary order is guaranteed to be insertion order since Python 3.7.", "stdtypes",
             "Dictionary order is guaranteed to be insertion order"),
    _library("Why does a range take little memory however large it is?",
             "It only stores the start, stop and step values.", "stdtypes",
             "only stores the start, stop and step"),
    _library("What happens when items are added to a full deque with a maxlen?",
             "The same number of items are discarded from the opposite end.", "collections",
             "discarded from the opposite end"),
    _library("What does itertools.pairwise('ABCDEFG') produce?",
             "AB BC CD DE EF FG", "itertools", "pairwise('ABCDEFG') --> AB BC CD DE EF FG"),
    _library("Which numbers does date.weekday() return for Monday and Sunday?",
             "Monday is 0 and Sunday is 6.", "datetime", "where Monday is 0 and Sunday is 6"),
    _library("Which units does a timedelta store internally?",
             "Only days, seconds and microseconds.", "datetime",
             "Only days, seconds and microseconds are stored internally"),
    _library("How do you make a regular expression quantifier match as few characters as possible?",
             "Add ? after the quantifier to make it non-greedy, as in <.*?>.", "re",
             "Adding ? after the quantifier"),
    _library("What happens when lru_cache is given maxsize=None?",
             "The LRU feature is disabled and the cache can grow without bound.", "functools",
             "If maxsize is set to None"),
    _library("What is the default relative tolerance of math.isclose?",
             "1e-09", "math", "The default tolerance is 1e-09"),
    _library("Which module should be used instead of random for security or cryptography?",
             "The secrets module.", "random", "For security or cryptographic uses, see the secrets module"),
    _library("How do you make the instances of a dataclass immutable?",
             "Pass frozen=True to the dataclass() decorator.", "dataclasses",
             "passing frozen=True to the dataclass() decorator"),
    _library("What happens with check=True when the process exits with a non-zero code?",
             "A CalledProcessError exception is raised.", "subprocess",
             "If check is true, and the process exits with a non-zero exit code"),
    _library("How should a file be opened before it is given to csv.reader?",
             "With newline=''.", "csv", "it should be opened with newline=''"),
    _library("Where is the smallest element of a heap?",
             "At the root, heap[0].", "heapq", "smallest element is always the root"),
    _library("At which level is the root logger created?",
             "WARNING", "logging", "root logger is created with level WARNING"),
]


def docs() -> Path:
    """The HTML of Debian's python3.11-doc, unpacked into the bench's cache on first use (nothing installed)."""
    return manpages.debian_package(PYTHON_DOCS) / "usr/share/doc/python3.11/html"


@cache
def manpage_corpus(pages: int | None = None) -> tuple[dict[str, list[manpages.Page]], dict[str, list[Question]]]:
    """The man pages present in English and Chinese (at most `pages`: those asked about, then the others in order),
    and the questions asked of the same pages in both."""
    english, chinese = manpages.parallel_pages(manpages.ensure_packages())
    asked = manpages.questions(english, chinese, MANPAGE_QUESTIONS)
    if pages is not None:
        asked_paths = {en.path for en, *_ in asked}
        others = [en.path for en in english if en.path not in asked_paths][:max(0, pages - len(asked_paths))]
        kept = asked_paths | set(others)
        english, chinese = [en for en in english if en.path in kept], [zh for zh in chinese if zh.path in kept]
    return ({"manpages-en": english, "manpages-zh": chinese},
            {"manpages-en": [Question(text, en.description, en.filename, "") for en, text, _zh, _ in asked],
             "manpages-zh": [Question(text, zh.description, zh.filename, "") for _en, _, zh, text in asked]})


def chinese_questions() -> list[Question]:
    return [Question(record["question"], record["expected_answer"], record["expected_sources"][0], record["evidence"])
            for record in map(json.loads, CHINESE_EVAL_SET.read_text(encoding="utf-8").splitlines())]


def corpus_pages() -> list[str]:
    tutorial = sorted(str(path.relative_to(docs())) for path in (docs() / "tutorial").glob("*.html"))
    return tutorial + [f"library/{name}.html" for name in LIBRARY_PAGES]


def relevant_chunks(kb, question: Question) -> set[int]:
    """The knowledge base's chunks that answer `question`: of its page, holding its evidence phrase."""
    return set(kb.chunks.filter(searchable=True, document__filename=question.source,
                                text__icontains=question.evidence).values_list("pk", flat=True))
