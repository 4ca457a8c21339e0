"""The OpenAPI 3.1 document of `/gate/v1/` (served at `/gate/v1/openapi.json`).

Kept by hand beside the routes; `tests/control/test_openapi.py` checks it against the
app's router, so a route added without a description fails the suite.
"""

from __future__ import annotations

from typing import Any

from gpugate.control.auth import ASK_LEASE, required_scopes
from gpugate.control.openapi_paths import lease_paths, operator_paths, read_paths
from gpugate.control.openapi_schemas import FORBIDDEN

SCOPES = "x-gpugate-scopes"
"""Per operation: the control token scopes of which one is needed (`read` only when reads
are not public)."""


def _scoped(paths: dict[str, Any]) -> None:
    """Each operation's scopes from gpugate.control.auth's table, and the 403 of a token
    without them on every operation that needs a token."""
    for path, item in paths.items():
        for method, operation in item.items():
            scopes = [scope.value for scope in required_scopes(method.upper(), path)]
            operation[SCOPES] = scopes
            if "security" not in operation:
                continue
            operation["security"] = [{"bearer": [scope]} for scope in scopes]
            operation["responses"]["403"] = FORBIDDEN
            if (method.upper(), path) == ASK_LEASE:
                operation["description"] = (
                    "`lease` for an explicit lease; `admit` for a start lease "
                    '(`"purpose": "start"`)'
                )


def openapi_document() -> dict[str, Any]:
    """The document, built fresh (callers may change it)."""
    secured = [{"bearer": []}]
    paths: dict[str, Any] = {
        **read_paths(),
        **lease_paths(secured),
        **operator_paths(secured),
    }
    _scoped(paths)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "gpugate control API",
            "version": "1",
            "description": "Read-only routes answer without a token on loopback "
            "(`gate.control_public`); every other method needs a bearer token. A control "
            "token may carry scopes (`gate.control_tokens`): each operation names the one it "
            f"needs in `{SCOPES}` and in its security requirement (`read` for every GET when "
            "reads are not public, `lease`, `admit` for a start lease, `operate`); a token "
            "without it is answered 403 FORBIDDEN, an unknown token 401. Every refusal is "
            '`{"error": {"class", "message"}}`, on every route: 404 NOT_FOUND for a path no '
            "route serves, 405 METHOD_NOT_ALLOWED (with `Allow`) for a method it does not take, "
            "413 PAYLOAD_TOO_LARGE for a body past 64 KiB.",
        },
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": paths,
    }
