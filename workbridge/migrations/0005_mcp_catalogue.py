from django.db import migrations, models

REASON = ("Registered as a free-form local command before local commands came from the operator's catalogue: a "
          "workspace admin now picks a catalogue entry (FACTORY_MCP_COMMANDS), and only a platform administrator, "
          "signed in, registers any other command. Save it again as one of those to use it.")


def disable_free_form_commands(apps, schema_editor):
    """A local command any workspace admin typed would run on the platform's machine: off until re-saved by
    someone who may register it."""
    apps.get_model("workbridge", "McpServer").objects.filter(transport="stdio").update(disabled_reason=REASON)


class Migration(migrations.Migration):

    dependencies = [
        ("workbridge", "0004_tool_output_schema"),
    ]

    operations = [
        migrations.AddField(
            model_name="mcpserver",
            name="catalog_entry",
            field=models.CharField(blank=True, max_length=64),
        ),
        migrations.AddField(
            model_name="mcpserver",
            name="arguments",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name="mcpserver",
            name="disabled_reason",
            field=models.TextField(blank=True),
        ),
        migrations.RunPython(disable_free_form_commands, migrations.RunPython.noop),
    ]
