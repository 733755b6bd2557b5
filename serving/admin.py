from django.contrib import admin

from serving.models import Deployment, Model, Replica, RequestRecord, ServingEvent


@admin.register(Model)
class ModelAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "family", "quantization", "role_hint", "workspace"]


class ReplicaInline(admin.TabularInline):
    model = Replica
    extra = 0


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    list_display = ["name", "model", "engine", "state", "desired_running"]
    inlines = [ReplicaInline]


@admin.register(ServingEvent)
class ServingEventAdmin(admin.ModelAdmin):
    list_display = ["at", "deployment", "replica", "from_state", "to_state", "message"]


@admin.register(RequestRecord)
class RequestRecordAdmin(admin.ModelAdmin):
    list_display = ["created_at", "deployment", "replica", "status", "ttft_ms", "tpot_ms", "output_tokens"]
