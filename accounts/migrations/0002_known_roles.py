from django.db import migrations, models


def demote_unknown_roles(apps, schema_editor):
    """A role that is not one of ours (a row edited by hand) becomes viewer before the constraint holds roles to
    the four."""
    known = ["viewer", "developer", "admin", "owner"]
    for name in ("Membership", "ApiKey"):
        apps.get_model("accounts", name).objects.exclude(role__in=known).update(role="viewer")


class Migration(migrations.Migration):
    dependencies = [("accounts", "0001_initial")]

    operations = [
        migrations.RunPython(demote_unknown_roles, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="apikey",
            constraint=models.CheckConstraint(condition=models.Q(("role__in", ["viewer", "developer", "admin", "owner"])),
                                              name="apikey_known_role"),
        ),
        migrations.AddConstraint(
            model_name="membership",
            constraint=models.CheckConstraint(condition=models.Q(("role__in", ["viewer", "developer", "admin", "owner"])),
                                              name="membership_known_role"),
        ),
    ]
