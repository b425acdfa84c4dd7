"""Fuzz the reference center from its own OpenAPI document with schemathesis (bounded).

Every documented operation gets a few generated requests over the real pinned TLS listener
(schemathesis' `requests` transport; verification is off because the center's certificate is
self-signed and the point here is the API, not the pin). The center must never answer 5xx, and
every answer must conform to the document (documented status, content type and body schema).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402

from mcphost.testing import DevCenter  # noqa: E402
from tests.thorough import depth  # noqa: E402

# deep (make test-slow): the center against its OpenAPI document.
pytestmark = [pytest.mark.deep, pytest.mark.timeout(120)]

EXAMPLES_PER_OPERATION = depth(full=12, quick=4)  # make test-slow: 12


@pytest.mark.thorough
def test_center_conforms_to_its_openapi_document(center: DevCenter) -> None:
    schema = schemathesis.openapi.from_dict(center.request("GET", "/openapi.json").json())
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20
    host, port = center.tcp_address or ("", 0)
    base_url = f"https://{host}:{port}"
    headers = {"Authorization": f"Bearer {center.token}"}
    figures: dict[str, int] = {"operations": len(operations), "requests": 0}
    problems: list[str] = []

    for operation in operations:

        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        @given(operation.as_strategy())
        def run(case: Any) -> None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                response = case.call(base_url=base_url, verify=False, headers=headers, timeout=10)
            figures["requests"] += 1
            label = f"{case.method} {case.formatted_path} -> {response.status_code}"
            if response.status_code >= 500:
                problems.append(f"{label}: {response.text[:300]}")
                return
            try:
                # the checks' own requests (e.g. the same call without credentials) go to the
                # same self-signed listener
                case.validate_response(response, transport_kwargs={"verify": False, "timeout": 10})
            except Exception as exc:  # schemathesis raises a grouped failure per response
                problems.append(f"{label}: {str(exc)[:400]}")

        run()
    print(f"\nschemathesis figures: {figures}, problems: {len(problems)}")
    assert not problems, "\n".join(problems[:10])
