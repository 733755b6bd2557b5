"""First-run setup, assembled from every app: each registers a step here (a registry on the lowest floor, so no
floor imports one above it), and `manage.py bootstrap` runs them in floor order. Every step is idempotent."""

import os
from collections.abc import Callable

Step = Callable[[Callable[[str], None]], None]
_steps: list[tuple[int, str, Step]] = []


def bootstrap_step(order: int):
    def register(step: Step) -> Step:
        if all(registered is not step for _, _, registered in _steps):
            _steps.append((order, f"{step.__module__}.{step.__name__}", step))
        return step

    return register


def run_bootstrap(say: Callable[[str], None]) -> None:
    for _, _, step in sorted(_steps, key=lambda item: (item[0], item[1])):
        step(say)


@bootstrap_step(order=10)
def default_workspace_and_admin(say: Callable[[str], None]) -> None:
    from accounts.services import ensure_admin

    username = os.environ.get("FACTORY_ADMIN_USER", "admin")
    user, generated = ensure_admin(username=username, password=os.environ.get("FACTORY_ADMIN_PASSWORD"),
                                   workspace_name=os.environ.get("FACTORY_WORKSPACE_NAME", "Default"))
    if generated:
        say(f"Created admin user '{username}' with password: {generated}")
        say("This password is shown once. Set FACTORY_ADMIN_PASSWORD before `make run` to choose your own.")
