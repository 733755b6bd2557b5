from django.contrib import admin

from cluster.models import Device, Job, JobEvent, Node


class DeviceInline(admin.TabularInline):
    model = Device
    extra = 0


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "status", "cpu_cores", "memory_bytes", "last_heartbeat_at"]
    inlines = [DeviceInline]


class JobEventInline(admin.TabularInline):
    model = JobEvent
    extra = 0


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ["id", "kind", "node", "state", "progress", "created_at"]
    list_filter = ["state", "kind"]
    inlines = [JobEventInline]
