"""Property-based fuzzing of the gateway from its own /openapi.json (schemathesis): requests that
follow the schema and requests that break it, against a real daemon on a tiny model. No request
may produce a 5xx, and every 4xx must carry an error body in the endpoint's API shape.

Bounded for CI: the daemon's context is 256 tokens (so no generation runs long) and each
operation gets at most MAX_EXAMPLES examples."""
from __future__ import annotations

import hypothesis
import pytest
import schemathesis
from schemathesis.checks import not_a_server_error

from tests.http.gateway_harness import serve_gateway
from flashd.clients.spawn import DaemonOptions, LocalDaemon

MAX_EXAMPLES = 40
FUZZ_MAX_CTX = 256


@pytest.fixture(scope="module")
def fuzz_gateway(tiny_model):
    with LocalDaemon.start(DaemonOptions(model=str(tiny_model), device="cpu", max_ctx=FUZZ_MAX_CTX,
                                         ready_timeout_s=60)) as daemon:
        with daemon.connect(timeout_s=30) as client, serve_gateway(client) as server:
            yield server


@pytest.fixture(scope="module")
def api_schema(fuzz_gateway):
    return schemathesis.openapi.from_url(f"{fuzz_gateway.url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


def errors_in_api_shape(ctx, response, case) -> None:
    """A 4xx answers with the error object of the endpoint's API."""
    if not 400 <= response.status_code < 500:
        return
    body = response.json()
    if case.path.startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["message"], body
    else:
        assert body["error"]["message"] and "type" in body["error"], body


@pytest.mark.slow
@schema.parametrize()
@hypothesis.settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
                     suppress_health_check=list(hypothesis.HealthCheck))
def test_no_server_errors(case):
    case.call_and_validate(checks=[not_a_server_error, errors_in_api_shape], timeout=30)
