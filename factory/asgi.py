import os

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "factory.settings")
# Static files (vendored, no CDN) are served by Django's async static handler, in front of the app, so that no
# sync-only middleware forces a thread hop onto every gateway request.
application = ASGIStaticFilesHandler(get_asgi_application())
