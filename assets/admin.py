from django.contrib import admin

from assets.models import Asset, AssetVersion


class AssetVersionInline(admin.TabularInline):
    model = AssetVersion
    extra = 0
    readonly_fields = ["number", "checksum", "summary", "created_at", "created_by"]


@admin.register(Asset)
class AssetAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "workspace", "latest_version", "updated_at"]
    list_filter = ["kind"]
    inlines = [AssetVersionInline]
