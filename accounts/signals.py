from django.contrib.auth.signals import user_logged_in
from django.dispatch import receiver

from accounts.middleware import LANGUAGE_SESSION_KEY
from accounts.services import chosen_language


@receiver(user_logged_in)
def remember_language_in_session(sender, request, user, **kwargs):
    """At sign-in, the language the user chose on any earlier visit (UserLanguageMiddleware reads it from here)."""
    if request is None or not hasattr(request, "session"):
        return
    language = chosen_language(user=user)
    if language:
        request.session[LANGUAGE_SESSION_KEY] = language
