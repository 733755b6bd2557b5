from django.contrib import admin

from runtime.models import App, AppKey, Feedback, Release, Trace


@admin.register(App)
class AppAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "workspace", "enabled", "current_release"]
    readonly_fields = ["widget_token"]


@admin.register(AppKey)
class AppKeyAdmin(admin.ModelAdmin):
    list_display = ["name", "app", "prefix", "rate_limit", "revoked_at", "last_used_at"]
    readonly_fields = ["prefix", "key_hash"]


@admin.register(Release)
class ReleaseAdmin(admin.ModelAdmin):
    list_display = ["app", "number", "config_version", "published_at"]


@admin.register(Trace)
class TraceAdmin(admin.ModelAdmin):
    list_display = ["app", "created_at", "channel", "status", "latency_ms"]
    list_filter = ["status", "channel"]


admin.site.register(Feedback)
