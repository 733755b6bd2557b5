import workbridge.vault
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("serving", "0004_encrypt_external_api_keys")]

    operations = [
        migrations.AddField(
            model_name="replica",
            name="api_key",
            field=workbridge.vault.EncryptedTextField(blank=True),
        ),
    ]
