from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("accounts", "0003_user_language"),
    ]

    operations = [
        migrations.AddField(
            model_name="apikey",
            name="scope",
            field=models.CharField(choices=[("workspace", "Workspace"), ("platform", "Platform")],
                                   default="workspace", max_length=16),
        ),
    ]
