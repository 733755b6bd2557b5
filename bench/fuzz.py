"""API fuzzing with schemathesis: every operation of the REST schema (/api/schema/) with a workspace API key, and
the gateway's and the apps' public API from its OpenAPI description (bench/helpers/gateway_api.py), each case sent
in process. Prints operations x cases x failures, where a failure is an answer of 500 or more (target: 0).

    .venv/bin/python -m bench.fuzz [--examples 50]

Self-contained: a fresh data dir and SQLite database are made for the run; Redis comes from REDIS_URL (the one
`make run` starts), as the gateway's rate limits need it. tests/security/test_fuzz.py runs the same with a few
cases per operation in `make test`.
"""

import argparse
import os
import tempfile
from dataclasses import dataclass, field

from bench.helpers.gateway_api import GATEWAY_AND_APPS


@dataclass
class Tally:
    operations: int = 0
    cases: int = 0
    failures: list[str] = field(default_factory=list)


def fuzz(schema, *, headers: dict, examples: int, tally: Tally) -> Tally:
    """Send `examples` generated cases to every operation of `schema`; count the answers of 500 or more."""
    from hypothesis import HealthCheck, Phase, given, settings

    for result in schema.get_all_operations():
        operation = result.ok()
        tally.operations += 1

        @given(case=operation.as_strategy())
        @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                  phases=[Phase.explicit, Phase.generate],
                  suppress_health_check=list(HealthCheck))
        def send(case) -> None:
            tally.cases += 1
            response = case.call(headers=headers)
            if response.status_code >= 500:
                tally.failures.append(f"{case.method} {case.formatted_path}: {response.status_code} "
                                      f"{response.text[:160]}")

        send()
    return tally


def run(*, api_key: str, examples: int) -> tuple[Tally, Tally]:
    """Fuzz the REST API through Django's WSGI app and the lean paths through the ASGI edge."""
    import schemathesis
    from django.core.wsgi import get_wsgi_application

    from factory.asgi import application

    headers = {"Authorization": f"Bearer {api_key}", "Host": "127.0.0.1"}
    rest = schemathesis.openapi.from_wsgi("/api/schema/", get_wsgi_application())
    lean = schemathesis.openapi.from_dict(GATEWAY_AND_APPS)
    lean.app = application
    lean.config.base_url = "http://127.0.0.1"
    return (fuzz(rest, headers=headers, examples=examples, tally=Tally()),
            fuzz(lean, headers=headers, examples=examples, tally=Tally()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=50, help="cases per operation")
    args = parser.parse_args()
    os.environ.setdefault("FACTORY_DATA_DIR", tempfile.mkdtemp(prefix="fuzz-"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "factory.settings")
    import logging

    import django

    django.setup()
    logging.getLogger("django.request").setLevel(logging.ERROR)  # every 4xx would be a line
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from accounts.services import Actor, create_api_key, create_workspace

    call_command("migrate", verbosity=0)
    # A platform administrator makes the workspace (FACTORY_WORKSPACE_CREATION=staff); its key is a workspace key.
    user = get_user_model().objects.create_user("fuzzer", password="fuzz-fuzz-fuzz", is_staff=True)
    workspace = create_workspace(actor=Actor(user=user), name="Fuzz")
    key = create_api_key(actor=Actor(user=user), workspace=workspace, name="fuzz", role="owner").secret
    rest, lean = run(api_key=key, examples=args.examples)
    print(f"{'surface':<28}{'operations':>11}{'cases':>8}{'failures':>10}")
    for label, tally in (("REST (/api/schema/)", rest), ("gateway and app API", lean)):
        print(f"{label:<28}{tally.operations:>11}{tally.cases:>8}{len(tally.failures):>10}")
    for failure in rest.failures + lean.failures:
        print("  " + failure)


if __name__ == "__main__":
    main()
