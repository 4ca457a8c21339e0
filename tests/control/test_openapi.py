"""The OpenAPI document describes exactly the routes of /gate/v1/."""

from __future__ import annotations

import re

import aiohttp

from gpugate.control.app import control_app
from gpugate.control.metrics import GateMetrics
from tests.control.conftest import CONTROL_TOKEN


def routed(app) -> dict[str, set[str]]:
    paths: dict[str, set[str]] = {}
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        if path and path.startswith("/gate/v1/") and route.method != "HEAD":
            paths.setdefault(path, set()).add(route.method.lower())
    return paths


async def test_every_route_is_documented_and_every_documented_path_is_routed(
    tmp_path, sim_host, fakenvml_path
):
    from tests.gate.harness import running_stack

    async with running_stack(tmp_path, sim_host, fakenvml_path) as stack:
        app = control_app(stack.gate, GateMetrics(stack.gate))
        async with (
            aiohttp.ClientSession() as session,
            session.get(stack.control_url + "/gate/v1/openapi.json") as resp,
        ):
            assert resp.status == 200
            document = await resp.json()
    assert document["openapi"] == "3.1.0"
    documented = {
        path: {m for m in item if m in ("get", "post", "put", "delete", "patch")}
        for path, item in document["paths"].items()
    }
    assert documented == routed(app)
    assert {"/gate/v1/leases", "/gate/v1/leases/{id}", "/gate/v1/stream"} <= set(documented)
    for path, item in document["paths"].items():
        for name in re.findall(r"{(\w+)}", path):
            for method, operation in item.items():
                names = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
                assert name in names, (path, method)
        for method, operation in item.items():
            assert operation["responses"], (path, method)
            # Whatever changes state needs a token, and says so.
            assert (method != "get") == ("security" in operation), (path, method)


async def test_the_errors_routes_answer_for_bad_input_are_documented(stack):
    headers = {"Authorization": f"Bearer {CONTROL_TOKEN}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.get(stack.control_url + "/gate/v1/openapi.json") as resp:
            paths = (await resp.json())["paths"]
        asked = [
            ("get", "/gate/v1/consumers/nosuch", "/gate/v1/consumers/{name}"),
            ("post", "/gate/v1/gpus/x/pause", "/gate/v1/gpus/{index}/pause"),
            ("post", "/gate/v1/gpus/x/resume", "/gate/v1/gpus/{index}/resume"),
            ("get", "/gate/v1/events?class=vip", "/gate/v1/events"),
            ("get", "/gate/v1/events?failure=NOPE", "/gate/v1/events"),
            ("get", "/gate/v1/events?recent=x", "/gate/v1/events"),
            ("get", "/gate/v1/stream?class=vip", "/gate/v1/stream"),
            ("get", "/gate/v1/history?gpu=x", "/gate/v1/history"),
            ("get", "/gate/v1/leases?scope=x", "/gate/v1/leases"),
            ("get", "/gate/v1/queue?gpu=x", "/gate/v1/queue"),
            ("get", "/gate/v1/queue?consumer=nosuch", "/gate/v1/queue"),
            ("post", "/gate/v1/leases", "/gate/v1/leases"),
            ("post", "/gate/v1/leases?big", "/gate/v1/leases"),
        ]
        bodies = {"/gate/v1/leases": b"[" * 100, "/gate/v1/leases?big": b" " * (1 << 17)}
        for method, url, path in asked:
            body = bodies.get(url)
            async with session.request(method, stack.control_url + url, data=body) as resp:
                status = resp.status
                error = (await resp.json())["error"]
            assert status in (400, 404, 413), (url, status)
            assert error["class"] and error["message"], url
            assert str(status) in paths[path][method]["responses"], (url, status)
