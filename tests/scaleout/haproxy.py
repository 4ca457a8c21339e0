"""HAProxy in front of several gates: the configuration docs/scale-out.md shows, and the
two-host test runs.

Routing, with HAProxy 2.6's own directives only (no Lua):

* the frontend buffers the request body (`option http-buffer-request`) and reads the
  model from it with the `json_query` converter; a map names the model's backend;
* a backend per model has one server per host, each with an agent check that sends the
  model's name (`agent-send`): the gate answers `up ready 100%` where it is resident,
  `up ready N%` (N < 100) where it fits, `drain 0%` where it would need an eviction or
  there is no room, `maint 0%` where the gate is unhealthy;
* `use-server` picks a host whose weight is 100 (the model is resident there) and that is
  up; otherwise the weights share the loads among the hosts it fits on;
* a backend whose every server is drained has no usable server (`nbsrv`): the request
  goes to the `hosts` backend, whose agents answer for each host as a whole (its
  schedulable share), where the gate evicts or queues as it would for any request;
* when every host is drained as a whole too (full, or paused), the request goes to the
  `any` backend, every host whose gate is up with no agent: HAProxy would otherwise answer
  503 itself, with no class and no Retry-After, where a gate queues or refuses with both;
* a regular HTTP health check (`GET /api/version`, answered by the runtime through the
  gate) takes a host whose gate is gone out at once; `retry-on` with `option redispatch`
  sends a request that found a closed port or a closed connection to another host.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

HAPROXY_LIBS = "usr/lib/x86_64-linux-gnu"
ROOM = "_room"
"""The suffix of a host's backup server in a model's backend."""


@attrs.frozen
class Host:
    """A GPU host as HAProxy sees it: its gate's runtime port and agent-check port."""

    name: str
    address: str
    port: int = 11434
    agent_port: int = 9412


def backend(model: str) -> str:
    """The backend of a model: `m_` and its name with what HAProxy names cannot hold
    replaced."""
    return "m_" + re.sub(r"[^A-Za-z0-9_.-]", "_", model)


def model_map(models: Mapping[str, Sequence[str]]) -> str:
    """The map file: each way a client names a model (`bge-m3`, `bge-m3:latest`) → its
    backend. `models`: the gate's name of each model → the names clients use."""
    lines = []
    for model, spellings in models.items():
        for spelling in dict.fromkeys([model, *spellings]):
            lines.append(f"{spelling} {backend(model)}")
    return "\n".join(lines) + "\n"


def haproxy_config(
    hosts: Sequence[Host],
    models: Sequence[str],
    *,
    bind: str,
    map_file: Path | str,
    stats_socket: Path | str | None = None,
    check: str = "300ms",
    agent: str = "200ms",
) -> str:
    """haproxy.cfg for `hosts` and a backend per model in `models` (the gate's names)."""

    def servers(agent_send: str | None, suffix: str = "", backup: bool = False) -> str:
        lines = []
        for host in hosts:
            if agent_send is None:
                agent = " no-agent-check"
            else:
                agent = f' agent-port {host.agent_port} agent-send "{agent_send}\\n"'
            role = " backup" if backup else ""
            lines.append(f"    server {host.name}{suffix} {host.address}:{host.port}{role}{agent}")
        return "\n".join(lines)

    stats = ""
    if stats_socket is not None:
        stats = f"    stats socket {stats_socket} mode 600 level admin\n"
    text = (
        "global\n"
        + stats
        + textwrap.dedent(
            f"""\
            defaults
                mode http
                timeout connect 1s
                timeout client 60s
                timeout server 60s
                timeout check 1s
                # A request that found a closed port or connection goes to another host.
                retries 3
                option redispatch 1
                retry-on conn-failure empty-response junk-response
                option http-buffer-request
                default-server check inter {check} fall 1 rise 1 agent-check agent-inter {agent} weight 100

            frontend ollama
                bind {bind}
                http-request set-var(txn.model) req.body,json_query('$.model') if {{ method POST }}
                http-request set-var(txn.pool) var(txn.model),map_str({map_file}) if {{ var(txn.model) -m found }}
                # A model's own backend while some host is resident, has room for it, or
                # has room as a whole; a request naming no model, the host with most room.
                use_backend %[var(txn.pool)] if {{ var(txn.pool) -m found }} {{ var(txn.pool),nbsrv gt 0 }}
                use_backend hosts if !{{ var(txn.pool) -m found }} {{ nbsrv(hosts) gt 0 }}
                # Every host full or paused: any host whose gate is up, which queues the
                # request or refuses it with its class.
                default_backend any

            backend any
                # Every host whose gate is up, whatever its room: no agent.
                balance roundrobin
                option httpchk GET /api/version
                http-response set-header X-Served-By %[srv_name]
            """  # noqa: E501
        )
        + servers(None)
        + "\n"
        + textwrap.dedent(
            """
            backend hosts
                # Each host as a whole: its schedulable share, drained when full or paused.
                balance roundrobin
                option httpchk GET /api/version
                http-response set-header X-Served-By %[srv_name]
            """
        )
        + servers("")
        + "\n"
    )
    for model in models:
        name = backend(model)
        rules = "".join(
            f"    use-server {host.name} if {{ srv_weight({name}/{host.name}) ge 100 }} "
            f"{{ srv_is_up({name}/{host.name}) }}\n"
            for host in hosts
        )
        head = (
            f"\nbackend {name}\n"
            "    # Where it is resident (100%), else where it fits, by the room left; else,\n"
            "    # as backups, the hosts by their room as a whole (an eviction), so that a\n"
            "    # request sent again after a host went away finds another.\n"
            "    balance roundrobin\n"
            "    option allbackups\n"
            "    option httpchk GET /api/version\n"
            f"    http-response set-header X-Served-By %[srv_name,regsub({ROOM}$,)]\n"
        )
        text += head + rules + servers(model) + "\n" + servers("", ROOM, backup=True) + "\n"
    return text
