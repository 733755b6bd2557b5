"""The OpenAPI import on real-world documents (bench/spec_corpus.py makes them without network: flasgger, drf-yasg,
drf-spectacular and FastAPI apps, this platform's own API among them, and the Petstore jsonschema ships): at least
95% of their operations become tools, each with arguments that are valid JSON Schema and a request the http binding
can make, and whatever is left out or repaired is listed with its JSON path and reason."""

import pytest
from jsonschema import Draft202012Validator

from bench.spec_corpus import documents, measure
from workbridge import http_tools


@pytest.fixture(scope="module")
def tallies():
    return [measure(document) for document in documents()]


def test_the_corpus_holds_ten_documents_or_more_of_each_format(tallies):
    formats = {tally.document.version.rsplit(".", 1)[0] for tally in tallies if "3." in tally.document.version} | {
        tally.document.version for tally in tallies if "Swagger" in tally.document.version}
    assert len(tallies) >= 10 and formats == {"Swagger 2.0", "OpenAPI 3.0", "OpenAPI 3.1"}


def test_at_least_95_percent_of_the_operations_become_tools(tallies):
    operations = sum(tally.operations for tally in tallies)
    imported = sum(len(tally.imported) for tally in tallies)
    skipped = [f"{tally.document.name}: {item['path']}: {item['reason']}" for tally in tallies
               for item in tally.skipped]
    assert imported / operations >= 0.95, "\n".join(skipped)


def test_every_tool_has_valid_json_schema_arguments_and_a_request_that_can_be_made(tallies):
    for tally in tallies:
        for draft in tally.imported:
            Draft202012Validator.check_schema(draft.parameters)
            http_tools.check_config(draft.config, draft.parameters)


def test_what_is_skipped_or_repaired_says_where_and_why(tallies):
    listed = [item for tally in tallies for item in tally.skipped + tally.repaired]
    assert listed and all(item["path"] and item["reason"] for item in listed)
    repaired = {(tally.document.name, item["path"]): item["reason"] for tally in tallies for item in tally.repaired}
    assert repaired[("httpbin-style API (flasgger)", "paths./delay/{delay}.get.parameters.0.type")] == \
        "'int' read as integer"
    assert repaired[("httpbin-style API (flasgger)", "info.contact.responsibleDeveloper")] == \
        "not a field the format has here; ignored"
