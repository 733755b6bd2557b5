"""A document's ingestion log, in English as stored; accounts/log_messages.py shows it in the reader's language."""

from django.utils.translation import gettext_noop

from accounts.log_messages import LogMessage

UPLOADED = LogMessage(gettext_noop("Uploaded and queued"))
REJECTED = LogMessage(gettext_noop("Rejected: %(reason)s"))
RETRY_REQUESTED = LogMessage(gettext_noop("Retry requested"))
RESUMED = LogMessage(gettext_noop("Resumed at the %(stage)s stage: %(worker)s stopped renewing its lease"))
TIME_LIMIT = LogMessage(gettext_noop("Stopped at the task's time limit (%(seconds)s s); it resumes from the last "
                                     "saved step"))
STARTING_AGAIN = LogMessage(gettext_noop("%(reason)s; starting again from the parse stage"))
FAILED = LogMessage(gettext_noop("Failed: %(reason)s"))
SCREENING = LogMessage(gettext_noop("Screening: %(count)s finding(s)"))
EMBEDDING_RESUMES = LogMessage(gettext_noop("Embedding resumes at batch %(batch)s of %(batches)s; %(saved)s batch(es) "
                                            "were already saved"))
EMBEDDING_AGAIN = LogMessage(gettext_noop("Saved vectors were missing or did not match the chunks; embedding again"))
INDEXED = LogMessage(gettext_noop("Indexed %(count)s chunk(s)"))
