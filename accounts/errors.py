"""The application's error hierarchy, mapped to HTTP in one place.

Services raise these with the user's words; `api_exception_handler` turns them (and DRF's own errors) into
`{"error": {"code", "message", "fields"?}}` with the right status, so no view needs its own try/except. The code is a
stable English machine word; the message is in the request's language where it is translated: a message built with
values is translated where it is raised (gettext with %-placeholders), and every message passes through gettext here
once more, so a fixed English sentence a service raises reads in the request's language once the catalogue has it.
"""

import logging

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404
from django.utils.translation import gettext as _
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response

logger = logging.getLogger(__name__)


class ApplicationError(Exception):
    status = 400
    code = "invalid"

    def __init__(self, message: str, *, fields: dict | None = None):
        super().__init__(message)
        self.message = message
        self.fields = fields or {}


class ValidationFailed(ApplicationError):
    status = 400
    code = "invalid"


class Unauthenticated(ApplicationError):
    status = 401
    code = "unauthenticated"


class Forbidden(ApplicationError):
    status = 403
    code = "forbidden"


class NotFound(ApplicationError):
    status = 404
    code = "not_found"


class Conflict(ApplicationError):
    status = 409
    code = "conflict"


class RateLimited(ApplicationError):
    status = 429
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class ServiceUnavailable(ApplicationError):
    """A part of the platform the request needs (Redis, say) is not answering: retry shortly."""

    status = 503
    code = "unavailable"

    def __init__(self, message: str, *, retry_after: int = 5):
        super().__init__(message)
        self.retry_after = retry_after


def error_body(code: str, message: str, fields: dict | None = None) -> dict:
    error = {"code": code, "message": message}
    if fields:
        error["fields"] = fields
    return {"error": error}


def _first_message(detail) -> str:
    if isinstance(detail, dict):
        field, value = next(iter(detail.items()))
        inner = _first_message(value)
        return inner if field in ("non_field_errors", "detail") else f"{field}: {inner}"
    if isinstance(detail, list) and detail:
        return _first_message(detail[0])
    return str(detail)


def in_request_language(message: str) -> str:
    """The message from the catalogue of the active language when it has it (an empty one stays empty: gettext
    would answer the catalogue's header)."""
    return _(message) if isinstance(message, str) and message else message


def _translated_fields(fields: dict) -> dict:
    return {name: [in_request_language(message) for message in messages] if isinstance(messages, list) else messages
            for name, messages in fields.items()}


def api_exception_handler(exc, context):
    if isinstance(exc, ApplicationError):
        headers = {"Retry-After": str(exc.retry_after)} if hasattr(exc, "retry_after") else {}
        return Response(error_body(exc.code, in_request_language(exc.message), _translated_fields(exc.fields)),
                        status=exc.status, headers=headers)
    if isinstance(exc, Http404):
        exc = drf_exceptions.NotFound(str(exc) or _("Not found."))
    elif isinstance(exc, DjangoPermissionDenied):
        exc = drf_exceptions.PermissionDenied(str(exc) or _("You do not have permission to do this."))
    if isinstance(exc, drf_exceptions.APIException):
        fields = (exc.detail if isinstance(exc, drf_exceptions.ValidationError) and isinstance(exc.detail, dict)
                  else None)
        headers = {}
        if getattr(exc, "auth_header", None):
            headers["WWW-Authenticate"] = exc.auth_header
        if getattr(exc, "wait", None):
            headers["Retry-After"] = str(int(exc.wait))
        code = exc.get_codes()
        code = code if isinstance(code, str) else "invalid"
        return Response(error_body(code, _first_message(exc.detail), fields), status=exc.status_code, headers=headers)
    logger.exception("Unhandled error in %s", context.get("view").__class__.__name__)
    return Response(error_body("internal_error", _("Something went wrong on our side; it has been logged.")),
                    status=500)
