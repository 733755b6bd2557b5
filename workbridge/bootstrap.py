import os

from accounts.bootstrap import bootstrap_step
from workbridge.vault import generated_key


@bootstrap_step(order=5)
def secrets_key(say) -> None:
    """Made by `make run`'s setup, before any worker starts, rather than by whichever process first needs it."""
    if not os.environ.get("FACTORY_SECRETS_KEY", "").strip():
        generated_key()
