from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("cluster", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="node",
            name="address",
            field=models.CharField(default="127.0.0.1", max_length=255),
        ),
    ]
