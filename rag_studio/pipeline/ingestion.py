"""The ingestion pipeline: parse → OCR → clean → screen → chunk → embed → index.

A worker takes documents in the fair order of the ingestion line (rag_studio/pipeline/line.py), and with each
the knowledge base's other queued documents, up to a group's size: they go through the first five stages one by
one (OCR only reads the pages parse marked: scans and images), then are embedded together, in model calls that
mix their chunks (sorted by length, so batches are full and hold little padding; per-document batches of a few
chunks ran at about half the model's rate), and indexed in one write (each write copies the whole index).

Each stage writes its output (a file of its own in the document's work dir, or rows) before the document's `stage`
moves on, and the embed stage saves each batch of vectors as it goes. A worker holds a document through a lease
(`leases`): its owner name is unique to the process and the task, and a thread renews it while the worker runs, so
a long call never outlasts it. When a worker dies the lease runs out and another continues from the recorded stage
and batch (and OCR page); after RAG_INGEST_MAX_ATTEMPTS such takeovers the document fails with the reason. OCR, the
one stage that can run for minutes, takes turns: after RAG_OCR_TURN_S a document goes back in line.

A worker that lost its lease (it froze past it, or its task was redelivered) must not harm the one that holds the
document now: rows are replaced only in a transaction that first checks the lease, and saved vectors are named
after the chunk rows they belong to (`chunk_set`), so vectors of replaced chunks are never read. A document whose
saved vectors are missing is embedded again rather than failed. The index write replaces the document's whole
entry, so however often the last stage runs, each chunk is in the index exactly once.
"""

import logging
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, replace

import numpy as np
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

from accounts.atomic_files import write_json_atomic
from cluster import leases, queues
from rag_studio import files, log_messages as log, selectors
from rag_studio.embedding import Embedder, EmbeddingFailed
from rag_studio.embedding_choice import choose_before_embedding
from rag_studio.evals import jobs
from rag_studio.models import (
    Chunk,
    Document,
    DocumentEvent,
    DocumentStatus,
    Finding,
    KnowledgeBase,
    OcrPage,
    Stage,
)
from rag_studio.pipeline import line
from rag_studio.pipeline.chunking import chunk_pages
from rag_studio.pipeline.cleaning import clean_pages
from rag_studio.pipeline.ocr import validate_ocr
from rag_studio.pipeline.ocr.scans import ScannedPages
from rag_studio.pipeline.parsing import ParsedPage, ParseError, parse_document
from rag_studio.pipeline.screening import screen_text
from rag_studio.pipeline.storage import DISK_FULL
from rag_studio.search.index_store import IndexElsewhere, IndexStore
from rag_studio.search.stores import store_for

logger = logging.getLogger(__name__)
ORDER = [Stage.PARSE, Stage.OCR, Stage.CLEAN, Stage.SCREEN, Stage.CHUNK, Stage.EMBED, Stage.INDEX, Stage.DONE]
# Progress shown when each stage starts; embedding takes most of the time, so it spans most of the bar. OCR moves
# it page by page (the document also says which page: "OCR page 14 of 60").
PROGRESS_AT = {Stage.PARSE: 0, Stage.OCR: 2, Stage.CLEAN: 10, Stage.SCREEN: 15, Stage.CHUNK: 20, Stage.EMBED: 25,
               Stage.INDEX: 92, Stage.DONE: 100}
# Batches' worth of chunks per embedding call: enough for the model to fill its batches with chunks of
# similar length, few enough that progress moves every few seconds.
EMBED_CALL_BATCHES = 16


class LeaseLost(Exception):
    """Another worker owns the document now (or it was deleted or re-queued): stop without touching it."""


class TurnEnded(Exception):
    """The document used up its turn (RAG_OCR_TURN_S of OCR) and waits in line again, keeping what it read."""


class DocumentFailed(Exception):
    def __init__(self, code: str, reason: str):
        super().__init__(reason)
        self.code, self.reason = code, reason


def _lease_until():
    return leases.lease_until(settings.RAG_INGEST_LEASE_S)


def claim(document_id: int, worker: str) -> tuple[Document | None, str]:
    """Take the document if it is waiting, or if the worker that had it stopped renewing its lease. Returns it
    and that previous worker, if any. A document already taken over RAG_INGEST_MAX_ATTEMPTS times fails instead,
    with the stage it kept stopping in."""
    now = timezone.now()
    previous_owner = Document.objects.filter(pk=document_id).values_list("lease_owner", flat=True).first() or ""
    claimed = Document.objects.filter(
        Q(lease_until__isnull=True) | Q(lease_until__lt=now) | Q(lease_owner=worker),
        pk=document_id, status__in=[DocumentStatus.QUEUED, DocumentStatus.PROCESSING],
    ).update(status=DocumentStatus.PROCESSING, lease_owner=worker, lease_until=_lease_until(), updated_at=now,
             attempts=F("attempts") + 1)
    if not claimed:
        return None, ""
    document = Document.objects.select_related("knowledge_base__embedding_model",
                                               "knowledge_base__embedding_deployment").get(pk=document_id)
    if document.attempts > settings.RAG_INGEST_MAX_ATTEMPTS:
        _fail(document, worker, "too_many_attempts",
              f"Ingestion stopped {document.attempts - 1} times in the {document.stage} stage without finishing "
              f"(its worker died or ran out of time each time); the file may be too large or malformed.")
        return None, ""
    return document, previous_owner if previous_owner != worker else ""


def _advance(document: Document, worker: str, **fields) -> None:
    """Record progress and renew the lease, but only while this worker still holds it."""
    fields.setdefault("progress", document.progress)
    fields.setdefault("lease_until", _lease_until())
    updated = Document.objects.filter(pk=document.pk, lease_owner=worker,
                                      status=DocumentStatus.PROCESSING).update(updated_at=timezone.now(), **fields)
    if not updated:
        raise LeaseLost()
    for name, value in fields.items():
        setattr(document, name, value)


def _event(document: Document, worker: str, message: str) -> None:
    DocumentEvent.objects.create(document=document, stage=document.stage, message=message[:500], worker=worker)


def ingest_next(worker: str) -> str:
    """What an `ingest_next` message does: ingest the next group in fair order (rag_studio/pipeline/line.py), then
    top the line's messages up. Returns the status of the group's first document, or 'idle'."""
    status = "idle"
    for _ in range(5):  # another worker may claim the pick first: pick again
        pick = line.next_pick()
        if pick is None:
            break
        line.mark_served(pick)
        status = ingest(pick.document_id, worker, group=pick.group)
        if status != "skipped":
            break
    line.pump()
    return status


def ingest(document_id: int, worker: str, *, group: int | None = None) -> str:
    """Run the remaining stages of the document and of up to `group` - 1 queued documents of its knowledge base
    it takes along (RAG_INGEST_GROUP_DOCS in all by default). Returns the document's final status (also when an
    earlier task's group already took it), or 'skipped' when another worker has it now. `worker` must be unique to
    this process and task (`leases.owner_name`)."""
    document, previous_owner = claim(document_id, worker)
    if document is None:
        status = Document.objects.filter(pk=document_id).values_list("status", flat=True).first()
        return status if status in (DocumentStatus.INDEXED, DocumentStatus.FAILED) else "skipped"
    if previous_owner:
        _event(document, worker, log.RESUMED(stage=document.stage, worker=previous_owner))
    held = Document.objects.filter(status=DocumentStatus.PROCESSING)
    with leases.kept(held.filter(lease_owner=worker), lease_s=settings.RAG_INGEST_LEASE_S):
        group = [document, *_claim_companions(document, worker, (group or settings.RAG_INGEST_GROUP_DOCS) - 1)]
        started = time.monotonic()
        try:
            _run_group(group, worker, line.Turn(document.knowledge_base.workspace_id))
            line.record_document_seconds((time.monotonic() - started) / len(group))
        except SoftTimeLimitExceeded:
            _release(group, worker, log.TIME_LIMIT(seconds=f"{settings.RAG_INGEST_TIME_LIMIT_S:.0f}"))
            return "timed out"
    return Document.objects.filter(pk=document_id).values_list("status", flat=True).first() or "deleted"


def _run_group(group: list[Document], worker: str, turn: line.Turn) -> None:
    pending = []
    for position, member in enumerate(group):
        if pending and turn.over():
            _hand_back(group[position:], worker)
            break
        if _guarded([member], worker, _prepare):
            pending.append(member)
    # A document whose saved vectors turn out to be missing at the index stage goes back to embed, once.
    for _ in range(2):
        _guarded([d for d in pending if d.stage == Stage.EMBED], worker,
                 lambda documents, owner: GROUP_STAGES[Stage.EMBED](documents, owner, turn=turn))
        _guarded([d for d in pending if d.stage == Stage.INDEX], worker, GROUP_STAGES[Stage.INDEX])
        pending = [d for d in _held(pending, worker) if d.stage == Stage.EMBED]
        if not pending:
            break


def _release(documents: list[Document], worker: str, message: str) -> None:
    """Let the documents' leases run out now, so that beat resumes them (counting an attempt)."""
    released = Document.objects.filter(pk__in=[d.pk for d in documents], lease_owner=worker,
                                       status=DocumentStatus.PROCESSING)
    for document in documents:
        if released.filter(pk=document.pk).exists():
            _event(document, worker, message)
    released.update(lease_until=timezone.now())


def _hand_back(documents: list[Document], worker: str) -> None:
    """The worker's turn ended (line.Turn): the documents wait in line again from the stage they reached, keeping
    what they saved, and this turn's claim does not count as an attempt."""
    now = timezone.now()
    handed = Document.objects.filter(pk__in=[d.pk for d in documents], lease_owner=worker,
                                     status=DocumentStatus.PROCESSING)
    started = list(handed.exclude(stage=Stage.PARSE).values_list("pk", "stage"))
    handed.update(status=DocumentStatus.QUEUED, lease_owner="", lease_until=None, attempts=F("attempts") - 1,
                  dispatched_at=now, updated_at=now)
    DocumentEvent.objects.bulk_create([DocumentEvent(document_id=pk, stage=stage, worker=worker,
                                                     message=log.GROUP_TURN(stage=stage)) for pk, stage in started])


def _claim_companions(document: Document, worker: str, count: int) -> list[Document]:
    waiting = Document.objects.filter(knowledge_base_id=document.knowledge_base_id, status=DocumentStatus.QUEUED,
                                      lease_until__isnull=True).exclude(pk=document.pk).order_by("pk")
    companions = []
    for document_id in waiting.values_list("pk", flat=True)[:max(count, 0)]:
        companion, _ = claim(document_id, worker)
        if companion is not None:
            companions.append(companion)
    return companions


def _guarded(documents: list[Document], worker: str, step) -> bool:
    """Run `step(documents, worker)`; its failure fails those documents with a readable reason (never leaves them
    "processing"), and a lost lease leaves them to whoever has them now. True when it went through."""
    if not documents:
        return True
    try:
        step(documents, worker)
        return True
    except (LeaseLost, TurnEnded):
        return False
    except SoftTimeLimitExceeded:
        raise
    except (DocumentFailed, ParseError) as exc:
        reason, code = exc.reason, exc.code
    except EmbeddingFailed as exc:
        reason, code = str(exc), "embedding_failed"
    except OSError as exc:
        if exc.errno in DISK_FULL:
            reason = (f"The data directory is full ({exc.strerror} in the {documents[0].stage} stage); free space "
                      f"on the server, then retry the document.")
            code = "storage_full"
        else:
            logger.exception("Ingestion of documents %s failed", [d.pk for d in documents])
            reason, code = f"Unexpected error in the {documents[0].stage} stage: {exc}", "internal_error"
    except Exception as exc:  # any other bug must still end in a readable failure, not "processing" forever
        logger.exception("Ingestion of documents %s failed", [d.pk for d in documents])
        reason, code = f"Unexpected error in the {documents[0].stage} stage: {exc}", "internal_error"
    for document in documents:
        _fail(document, worker, code, reason)
    return False


def _prepare(documents: list[Document], worker: str) -> None:
    """The per-document stages, up to embedding."""
    for document in documents:
        while document.stage in STAGES:
            stage = document.stage
            try:
                STAGES[stage](document, worker)
            except _InputMissing as exc:
                # The work dir was emptied (an older layout, a disk clean-up): the upload is all that is needed.
                _advance(document, worker, stage=Stage.PARSE, progress=PROGRESS_AT[Stage.PARSE])
                _event(document, worker, log.STARTING_AGAIN(reason=exc))
                continue
            next_stage = ORDER[ORDER.index(stage) + 1]
            _advance(document, worker, stage=next_stage, progress=PROGRESS_AT[next_stage])


class _InputMissing(Exception):
    pass


def _advanced(document: Document, worker: str, **fields) -> bool:
    """`_advance`, False instead of LeaseLost: in a group, a document another worker took (or that was deleted)
    just drops out."""
    try:
        _advance(document, worker, **fields)
        return True
    except LeaseLost:
        return False


def _owned(document: Document, worker: str) -> None:
    """Inside a transaction, before replacing a document's rows: raise LeaseLost unless this worker still holds
    it. The transaction takes the database's write lock first (IMMEDIATE on SQLite, the row lock on Postgres), so
    no other worker can claim it between this check and the commit."""
    held = Document.objects.select_for_update().filter(pk=document.pk, lease_owner=worker,
                                                       status=DocumentStatus.PROCESSING)
    if not held.exists():
        raise LeaseLost()


def _fail(document: Document, worker: str, code: str, reason: str) -> None:
    updated = Document.objects.filter(pk=document.pk, lease_owner=worker).update(
        status=DocumentStatus.FAILED, error_code=code, error=reason, lease_owner="", lease_until=None,
        updated_at=timezone.now())
    if updated:
        _event(document, worker, log.FAILED(reason=reason))


def _pages_path(document: Document, stage: str):
    """The pages a stage wrote. Each stage has its own file, written from the previous one's, so that a late
    write by a worker that lost its lease (the same content: the stages are deterministic) cannot hand a later
    stage the wrong input."""
    return files.work_dir(document.pk) / f"pages-{stage}.json"


def _load_pages(document: Document, stage: str) -> list[ParsedPage]:
    try:
        return [ParsedPage(**page) for page in files.read_json(_pages_path(document, stage))]
    except FileNotFoundError:
        raise _InputMissing(f"The {stage} stage's output is missing")


def _save_pages(document: Document, stage: str, pages: list[ParsedPage]) -> None:
    write_json_atomic(_pages_path(document, stage), [asdict(page) for page in pages])


def run_parse(document: Document, worker: str) -> None:
    kb = document.knowledge_base
    _store_to_write(kb)  # refused before any work when this worker could never index the document
    pages = parse_document(files.upload_path(kb.pk, document.sha256), document.filename,
                           ocr_mode=validate_ocr(kb.ocr)["mode"])
    _save_pages(document, Stage.PARSE, pages)
    _advance(document, worker, page_count=len(pages), ocr_page_count=sum(page.needs_ocr for page in pages),
             ocr_pages_done=0)


def run_ocr(document: Document, worker: str) -> None:
    """Read the pages parse marked for OCR, one at a time, each saved as it is read (ocr/scans.py), so that a
    document taken over, retried after a cancel, or back from the line goes on from its next page. Each page
    renews the lease first, so a cancelled or deleted document stops there. After RAG_OCR_TURN_S the document
    goes back in line, so that a long scan never holds a worker while other documents wait."""
    pages = _load_pages(document, Stage.PARSE)
    scanned = [page.page for page in pages if page.needs_ocr]
    kb = document.knowledge_base
    turn_ends = time.monotonic() + settings.RAG_OCR_TURN_S
    span = PROGRESS_AT[Stage.CLEAN] - PROGRESS_AT[Stage.OCR]
    readings, read_in_turn = {}, 0
    with ScannedPages(files.upload_path(kb.pk, document.sha256), document.kind, validate_ocr(kb.ocr),
                      files.work_dir(document.pk)) as scans:
        for done, number in enumerate(scanned):
            readings[number] = scans.saved(number)
            if readings[number] is None:
                if read_in_turn and time.monotonic() > turn_ends:  # every turn reads at least a page
                    _back_in_line(document, worker, done=done, pages=len(scanned))
                _advance(document, worker, ocr_pages_done=done,
                         progress=PROGRESS_AT[Stage.OCR] + span * done // len(scanned))
                readings[number] = scans.read(number)
                read_in_turn += 1
    with transaction.atomic():
        _owned(document, worker)
        document.ocr_pages.all().delete()
        OcrPage.objects.bulk_create([
            OcrPage(document=document, page=number, confidence=reading.confidence, rotation=reading.rotation,
                    skew=reading.skew, lines=reading.lines, seconds=reading.seconds)
            for number, reading in readings.items()])
    read = [replace(page, text=readings[page.page].text, needs_ocr=False) if page.needs_ocr else page
            for page in pages]
    if scanned and not any(page.text.strip() for page in read):
        raise DocumentFailed("no_text", f"OCR found no text on the {len(scanned)} scanned page(s).")
    if scanned:
        unsure = [number for number, reading in readings.items()
                  if reading.confidence is not None and reading.confidence < settings.RAG_OCR_LOW_CONFIDENCE]
        _event(document, worker, log.OCR_READ(count=len(scanned)))
        if unsure:
            _event(document, worker, log.OCR_LOW_CONFIDENCE(pages=", ".join(map(str, unsure))))
    _save_pages(document, Stage.OCR, read)
    _advance(document, worker, ocr_pages_done=len(scanned))


def _back_in_line(document: Document, worker: str, *, done: int, pages: int) -> None:
    """End the document's turn: it waits in line as a queued document again (its attempts start over: it is
    making progress) and continues at the OCR stage when its turn comes."""
    _advance(document, worker, status=DocumentStatus.QUEUED, lease_owner="", lease_until=None, attempts=0,
             dispatched_at=timezone.now(), ocr_pages_done=done,
             progress=PROGRESS_AT[Stage.OCR] + (PROGRESS_AT[Stage.CLEAN] - PROGRESS_AT[Stage.OCR]) * done // pages)
    _event(document, worker, log.OCR_TURN(done=done, pages=pages))
    raise TurnEnded()


def run_clean(document: Document, worker: str) -> None:
    pages = clean_pages(_load_pages(document, Stage.OCR))
    if not pages:
        raise DocumentFailed("no_text", "Nothing was left after cleaning: the document has no readable text.")
    _save_pages(document, Stage.CLEAN, pages)
    _advance(document, worker, char_count=sum(len(p.text) for p in pages))


def run_screen(document: Document, worker: str) -> None:
    policy = document.knowledge_base.screening
    screened, findings, reasons = [], [], []
    for page in _load_pages(document, Stage.CLEAN):
        result = screen_text(page.text, policy)
        screened.append(ParsedPage(text=result.text, page=page.page))
        findings += [Finding(document=document, category=f.category, kind=f.kind, action=f.action, page=page.page,
                             start=f.start, end=f.end, preview=f.preview[:200]) for f in result.findings]
        if result.rejected:
            reasons.append(result.reject_reason())
    with transaction.atomic():
        _owned(document, worker)
        document.findings.all().delete()
        Finding.objects.bulk_create(findings)
    if reasons:
        raise DocumentFailed("rejected_by_screening", reasons[0])
    _save_pages(document, Stage.SCREEN, screened)
    if findings:
        _event(document, worker, log.SCREENING(count=len(findings)))
    _advance(document, worker)


def run_chunk(document: Document, worker: str) -> None:
    drafts = chunk_pages(_load_pages(document, Stage.SCREEN), document.knowledge_base.chunking)
    if not any(d.searchable for d in drafts):
        raise DocumentFailed("no_text", "The document produced no chunks to index.")
    chunk_set = uuid.uuid4().hex
    with transaction.atomic():
        _owned(document, worker)
        Document.objects.filter(pk=document.pk).update(chunk_set=chunk_set)
        document.chunk_set = chunk_set
        document.chunks.all().delete()
        rows = Chunk.objects.bulk_create([
            Chunk(knowledge_base_id=document.knowledge_base_id, document=document, ordinal=ordinal, text=d.text,
                  page=d.page, start=d.start, end=d.end, heading=d.heading[:500], searchable=d.searchable)
            for ordinal, d in enumerate(drafts)])
        children = []
        for row, draft in zip(rows, drafts):
            if draft.parent is not None:
                row.parent = rows[draft.parent]
                children.append(row)
        Chunk.objects.bulk_update(children, ["parent"])
    _clear_vectors(document)
    _advance(document, worker, chunk_count=sum(d.searchable for d in drafts))


def _clear_vectors(document: Document) -> None:
    """Remove every saved vector batch and embedding plan, of this chunk set and of replaced ones."""
    work = files.work_dir(document.pk)
    for stale in [*work.glob("vectors-*.npy"), *work.glob("embed-*.json")]:
        stale.unlink(missing_ok=True)


def _embed_plan_path(document: Document):
    return files.work_dir(document.pk) / f"embed-{document.chunk_set}.json"


def _batch_size(document: Document) -> int:
    """The batch size the document's embedding started with: saved batches are only valid for it, even if a
    worker with another configuration resumes the work."""
    plan = _embed_plan_path(document)
    if plan.exists():
        return files.read_json(plan)["batch_size"]
    write_json_atomic(plan, {"batch_size": settings.RAG_EMBED_BATCH_SIZE})
    return settings.RAG_EMBED_BATCH_SIZE


def _searchable(document: Document) -> list[tuple[int, str]]:
    return list(document.chunks.filter(searchable=True).order_by("ordinal").values_list("id", "text"))


def _batch_path(document: Document, index: int):
    return files.work_dir(document.pk) / f"vectors-{document.chunk_set}-{index:05d}.npy"


@dataclass(frozen=True)
class _Piece:
    """One saved batch of one document: the unit of resumption."""

    document: Document
    index: int
    texts: list[str]


def embed_documents(documents: list[Document], worker: str, *, turn: line.Turn | None = None) -> None:
    """Embed the documents' unsaved batches, several documents' batches per model call. The knowledge base's
    first embedding settles its model first (embedding_choice): every worker embeds with the model decided then.
    Once the worker's `turn` is over, the documents it has not started embedding go back in line (at least one
    document is finished in every turn)."""
    kb = choose_before_embedding(documents[0].knowledge_base_id)
    for document in documents:
        document.knowledge_base = kb
    pieces, batch_counts, done = [], {}, {}
    for document in documents:
        chunks = _searchable(document)
        size = _batch_size(document)
        batches = [[text for _, text in chunks[i:i + size]] for i in range(0, len(chunks), size)]
        todo = [i for i in range(len(batches)) if not _batch_path(document, i).exists()]
        if len(todo) < len(batches):
            _event(document, worker, log.EMBEDDING_RESUMES(batch=todo[0] + 1 if todo else len(batches),
                                                           batches=len(batches), saved=len(batches) - len(todo)))
        pieces += [_Piece(document, i, batches[i]) for i in todo]
        batch_counts[document.pk], done[document.pk] = len(batches), len(batches) - len(todo)
    embedder = Embedder.for_knowledge_base(kb)
    span = PROGRESS_AT[Stage.INDEX] - PROGRESS_AT[Stage.EMBED]
    held, started, left = list(documents), set(), Counter(piece.document.pk for piece in pieces)
    for call in _calls(pieces, settings.RAG_EMBED_BATCH_SIZE * EMBED_CALL_BATCHES):
        if turn is not None and held and turn.over():
            in_hand = started or {held[0].pk}
            leaving = [d for d in held if left[d.pk] and d.pk not in in_hand]
            _hand_back(leaving, worker)
            held = [d for d in held if d not in leaving]
        call = [piece for piece in call if piece.document in held]
        if not call:
            continue
        vectors = embedder.embed_many([text for piece in call for text in piece.texts])
        offset = 0
        for piece in call:
            _save_vectors(_batch_path(piece.document, piece.index), vectors[offset:offset + len(piece.texts)])
            offset += len(piece.texts)
            done[piece.document.pk] += 1
            left[piece.document.pk] -= 1
        embedded = {piece.document.pk for piece in call}
        started |= embedded
        held = [document for document in held if document.pk not in embedded or _advanced(
            document, worker,
            progress=PROGRESS_AT[Stage.EMBED] + span * done[document.pk] // max(1, batch_counts[document.pk]))]
    for document in held:
        _advanced(document, worker, stage=Stage.INDEX, progress=PROGRESS_AT[Stage.INDEX])


def _calls(pieces: list[_Piece], texts_per_call: int):
    """Consecutive runs of pieces holding about `texts_per_call` texts."""
    call, size = [], 0
    for piece in pieces:
        call.append(piece)
        size += len(piece.texts)
        if size >= texts_per_call:
            yield call
            call, size = [], 0
    if call:
        yield call


def _save_vectors(path, vectors: np.ndarray) -> None:
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.partial")
    with partial.open("wb") as out:
        np.save(out, vectors)
    partial.replace(path)


def index_documents(documents: list[Document], worker: str) -> None:
    """One index write for all the documents, then each is done."""
    upserts, ready = {}, []
    for document in documents:
        chunks = _searchable(document)
        vectors = _saved_vectors(document, len(chunks))
        if vectors is None:
            if _advanced(document, worker, stage=Stage.EMBED, progress=PROGRESS_AT[Stage.EMBED]):
                _event(document, worker, log.EMBEDDING_AGAIN())
            continue
        upserts[str(document.pk)] = ([pk for pk, _ in chunks], vectors, [text for _, text in chunks])
        ready.append(document)
    # Checked just before the write, so that a document deleted meanwhile is not put back in the index.
    ready = _held(ready, worker)
    if not ready:
        return
    kb = KnowledgeBase.objects.select_related("embedding_model").get(pk=documents[0].knowledge_base_id)
    _store_to_write(kb).apply(upserts={str(document.pk): upserts[str(document.pk)] for document in ready})
    finish_documents(ready, worker)


def _store_to_write(kb: KnowledgeBase) -> IndexStore:
    """The store of the index the documents go into (the one being built, else the live one); the document fails
    with where to ingest instead when this worker may not write it (the store says why)."""
    store = store_for(kb, kb.building_key or kb.index_key)
    try:
        store.check_writable_here()
    except IndexElsewhere as exc:
        raise DocumentFailed("index_elsewhere", str(exc))
    return store


def _saved_vectors(document: Document, chunk_count: int) -> np.ndarray | None:
    """The document's saved vectors, one per searchable chunk, or None when a batch is missing or they do not
    match its chunks."""
    plan = _embed_plan_path(document)
    if not plan.exists():
        return None
    size = files.read_json(plan)["batch_size"]
    try:
        vectors = np.concatenate([np.load(_batch_path(document, i)) for i in range((chunk_count + size - 1) // size)])
    except FileNotFoundError:
        return None
    return vectors if len(vectors) == chunk_count else None


def index_with_vectors(documents: list[tuple[Document, np.ndarray]], worker: str) -> None:
    """Index documents whose chunk rows already exist, with their vectors (a bundle's, one per searchable chunk in
    ordinal order), which `worker` holds at the embed stage. The vectors are saved as the embed stage saves them,
    so a worker that takes over after this process died finds them, and the pipeline's index stage does the rest;
    a failure fails the documents with the reason, as in ingestion."""
    held = []
    for document, vectors in documents:
        size = _batch_size(document)
        for start in range(0, len(vectors), size):
            _save_vectors(_batch_path(document, start // size), vectors[start:start + size])
        if _advanced(document, worker, stage=Stage.INDEX, progress=PROGRESS_AT[Stage.INDEX]):
            held.append(document)
    with leases.kept(Document.objects.filter(status=DocumentStatus.PROCESSING, lease_owner=worker),
                     lease_s=settings.RAG_INGEST_LEASE_S):
        _guarded(held, worker, index_documents)


def _held(documents: list[Document], worker: str) -> list[Document]:
    held = set(Document.objects.filter(pk__in=[d.pk for d in documents], lease_owner=worker,
                                       status=DocumentStatus.PROCESSING).values_list("pk", flat=True))
    return [document for document in documents if document.pk in held]


def finish_documents(documents: list[Document], worker: str) -> None:
    """Mark the documents indexed (those this worker still holds), then switch a re-indexing knowledge base
    to its new index if nothing else is pending."""
    now = timezone.now()
    with transaction.atomic():
        finished = _held(documents, worker)
        Document.objects.filter(pk__in=[d.pk for d in finished]).update(
            stage=Stage.DONE, progress=100, status=DocumentStatus.INDEXED, lease_owner="", lease_until=None,
            indexed_at=now, error="", error_code="", updated_at=now)
        DocumentEvent.objects.bulk_create([
            DocumentEvent(document=document, stage=Stage.DONE, worker=worker,
                          message=log.INDEXED(count=document.chunk_count)) for document in finished])
    for document in finished:
        _clear_vectors(document)
    if finished:
        switch_to_built_index(finished[0].knowledge_base_id)
        record_language(finished[0].knowledge_base_id)
        offer_adaptation(finished[0].knowledge_base_id)


def offer_adaptation(kb_id: int) -> None:
    """Once nothing of the knowledge base is left to ingest, ask a background worker to consider fitting its
    default retrieval settings to it (rag_studio/evals/adaptive.py decides whether to; nobody waits for it, so it
    stays off the interactive queue). A broker that is down only loses the offer: the next document to finish makes
    it again."""
    if not settings.RAG_ADAPTIVE_DEFAULTS:
        return
    kb = KnowledgeBase.objects.filter(pk=kb_id).values("workspace_id").first()
    pending = Document.objects.filter(knowledge_base_id=kb_id,
                                      status__in=[DocumentStatus.QUEUED, DocumentStatus.PROCESSING])
    if kb is None or pending.exists():
        return
    try:
        queues.send(jobs.ADAPT_TASK, [kb_id], queue=queues.DEFAULT, workspace_id=kb["workspace_id"])
    except (OperationalError, RedisError):
        logger.warning("Could not offer knowledge base %s an automatic tuning: the broker is unreachable", kb_id)


def record_language(kb_id: int) -> None:
    """Store what the knowledge base's text is mostly written in: its answers' instructions follow it, and its
    page suggests an embedding model that reads it."""
    language = selectors.knowledge_base_language(kb=KnowledgeBase.objects.get(pk=kb_id))
    KnowledgeBase.objects.filter(pk=kb_id).exclude(language=language).update(language=language)


def switch_to_built_index(kb_id: int) -> bool:
    """Once no document of a re-indexing knowledge base is still waiting, retrieval moves to the new index."""
    with transaction.atomic():
        kb = KnowledgeBase.objects.select_for_update().get(pk=kb_id)
        pending = kb.documents.filter(status__in=[DocumentStatus.QUEUED, DocumentStatus.PROCESSING]).exists()
        if not kb.building_key or pending:
            return False
        old_key = kb.index_key
        kb.index_key, kb.indexed_with = kb.building_key, kb.building_with
        kb.building_key, kb.building_with = "", {}
        kb.save(update_fields=["index_key", "indexed_with", "building_key", "building_with", "updated_at"])
    store_for(kb, old_key).drop()
    return True


def dispatch_ingest(document_ids: list[int]) -> None:
    """Put the documents in the ingestion line (rag_studio/pipeline/line.py): when they joined is recorded, and the
    line's broker messages are topped up, once for the lot. No message per document is sent."""
    Document.objects.filter(pk__in=document_ids).update(dispatched_at=timezone.now())
    line.pump()


def resume_stalled() -> list[int]:
    """Beat: the documents whose worker stopped renewing its lease (killed, or its machine lost) are ready again,
    first in line; and while any document is ready, the line's messages are topped up (a message lost with a Redis
    restart, or never sent because a process died before its transaction's on_commit ran, is replaced here). Only
    missing messages are sent: one per free slot, never one per document. Returns the stalled documents."""
    stalled = list(Document.objects.filter(status=DocumentStatus.PROCESSING, lease_until__lt=timezone.now())
                   .order_by("pk").values_list("pk", flat=True))
    line.pump()
    return stalled


# Run per document, then per group of documents.
STAGES = {Stage.PARSE: run_parse, Stage.OCR: run_ocr, Stage.CLEAN: run_clean, Stage.SCREEN: run_screen,
          Stage.CHUNK: run_chunk}
GROUP_STAGES = {Stage.EMBED: embed_documents, Stage.INDEX: index_documents}
