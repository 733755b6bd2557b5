"""Issue 13, "Prove it": schemathesis sends generated requests to every operation of the REST schema with a
workspace key, and to the gateway and the apps' public API from their OpenAPI description
(bench/helpers/gateway_api.py); no answer may be a 500 or more. A few cases per operation here; `python -m bench.fuzz`
runs many more."""

import pytest

from accounts.services import Actor, create_api_key
from bench.fuzz import run

pytestmark = pytest.mark.django_db(transaction=True)


def test_no_generated_request_gets_a_server_error(make_workspace):
    workspace = make_workspace("Fuzz", owner="fuzzer")
    key = create_api_key(actor=Actor(user=workspace.memberships.get().user), workspace=workspace, name="fuzz",
                         role="owner").secret

    rest, lean = run(api_key=key, examples=3)

    assert rest.operations > 100 and lean.operations == 8
    assert rest.cases >= rest.operations and lean.cases >= lean.operations
    assert rest.failures + lean.failures == []
