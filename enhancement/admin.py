from django.contrib import admin

from enhancement.models import Dataset, EnhancementJob, MetricSample


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ["name", "workspace", "source_format", "sample_count", "validation_count", "updated_at"]
    list_filter = ["workspace"]


@admin.register(EnhancementJob)
class EnhancementJobAdmin(admin.ModelAdmin):
    list_display = ["name", "workspace", "kind", "base_model", "stage", "step", "total_steps", "created_at"]
    list_filter = ["kind", "stage"]


@admin.register(MetricSample)
class MetricSampleAdmin(admin.ModelAdmin):
    list_display = ["job", "step", "train_loss", "validation_loss", "tokens_per_s", "at"]
