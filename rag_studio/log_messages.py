"""A document's ingestion log, in English as stored; accounts/log_messages.py shows it in the reader's language."""

from accounts.log_messages import LogMessage

UPLOADED = LogMessage("Uploaded and queued")
REJECTED = LogMessage("Rejected: %(reason)s")
RETRY_REQUESTED = LogMessage("Retry requested")
RESUMED = LogMessage("Resumed at the %(stage)s stage: %(worker)s stopped renewing its lease")
TIME_LIMIT = LogMessage("Stopped at the task's time limit (%(seconds)s s); it resumes from the last "
                        "saved step")
STARTING_AGAIN = LogMessage("%(reason)s; starting again from the parse stage")
FAILED = LogMessage("Failed: %(reason)s")
SCREENING = LogMessage("Screening: %(count)s finding(s)")
EMBEDDING_RESUMES = LogMessage("Embedding resumes at batch %(batch)s of %(batches)s; %(saved)s batch(es) "
                               "were already saved")
EMBEDDING_AGAIN = LogMessage("Saved vectors were missing or did not match the chunks; embedding again")
INDEXED = LogMessage("Indexed %(count)s chunk(s)")
OCR_READ = LogMessage("OCR read %(count)s page(s) without a usable text layer")
OCR_LOW_CONFIDENCE = LogMessage("Low-confidence OCR on page(s) %(pages)s")
OCR_TURN = LogMessage("OCR read %(done)s of %(pages)s page(s) in this turn; back in line so that other documents "
                      "get a worker")
GROUP_TURN = LogMessage("Back in line at the %(stage)s stage: this worker's turn ended so that another workspace's "
                        "documents could start")
CANCELLED = LogMessage("Cancelled by %(user)s")
