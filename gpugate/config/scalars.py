"""How each kind of scalar in consumers.yaml is read, and how a YAML node is described in errors.

A `Scalar` names what the file should hold ("a size like '7.5GiB'"), which YAML types may
hold it (a quoted "3" is not a whole number, `yes` is not one either) and the conversion.
"""

from __future__ import annotations

import ipaddress
import re
import typing
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from gpugate.config.addresses import Address, Upstream
from gpugate.config.filesizes import FilePattern
from gpugate.config.runtime_table import RuntimeTable
from gpugate.core.classes import PriorityClass, ResidencyPolicy
from gpugate.core.units import parse_duration, parse_size

NULL_TAG = "tag:yaml.org,2002:null"
NETWORK = ipaddress.IPv4Network | ipaddress.IPv6Network


@attrs.frozen
class Scalar:
    """How one kind of scalar is read: the YAML types it accepts and how it is converted."""

    expected: str
    accepts: tuple[type, ...]
    convert: Callable[[typing.Any], object]


def _whole(value: int) -> int:
    if value < 0:
        raise ValueError(f"expected a whole number (0 or more), got {value}")
    return value


def nonblank(value: str) -> str:
    """`value` unless it is blank; ValueError then."""
    if not value.strip():
        raise ValueError("expected a non-empty string")
    return value


def _network(value: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    return ipaddress.ip_network(value.strip(), strict=False)


def _one_of(noun: str, labels: Sequence[str]) -> str:
    return f"{noun} ({', '.join(labels)})"


SCALARS: dict[object, Scalar] = {
    "size": Scalar("a size like '7.5GiB'", (int, float, str), parse_size),
    "duration": Scalar("a duration like '15m'", (int, float, str), parse_duration),
    int: Scalar("a whole number", (int,), _whole),
    float: Scalar("a number", (int, float), float),
    bool: Scalar("true or false", (bool,), bool),
    str: Scalar("a string", (str,), nonblank),
    Path: Scalar("a file path", (str,), lambda value: Path(nonblank(value))),
    PriorityClass: Scalar(
        _one_of("a priority class", [c.label for c in PriorityClass.ordered()]),
        (str,),
        PriorityClass.parse,
    ),
    ResidencyPolicy: Scalar(
        _one_of("a residency policy", [p.value for p in ResidencyPolicy]),
        (str,),
        ResidencyPolicy.parse,
    ),
    Address: Scalar("an address like '0.0.0.0:11434'", (str, int), Address.parse),
    Upstream: Scalar("a URL like 'http://127.0.0.1:11435'", (str,), Upstream.parse),
    NETWORK: Scalar("a network like '192.168.1.0/24'", (str,), _network),
    FilePattern: Scalar(
        "a file name or glob like 'flux1-dev*.safetensors'", (str,), FilePattern.parse
    ),
}


_ORIGIN = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://(?:(?![/?#@])[!-~])+")


def _cors_origin(text: str) -> str:
    """`*` or one origin (`scheme://host[:port]`): the only values of
    Access-Control-Allow-Origin a browser accepts, sent as written."""
    nonblank(text)
    if text == "*" or _ORIGIN.fullmatch(text):
        return text
    raise ValueError(
        f"expected '*' or an origin like 'https://app.example:8443' (no path), got {text!r}"
    )


CORS_ORIGIN_SCALAR = Scalar("'*' or an origin like 'https://app.example'", (str,), _cors_origin)


def runtime_scalar(runtimes: RuntimeTable) -> Scalar:
    """How `runtime:` is read: the name of a runtime in the table the file is loaded with."""
    return Scalar(_one_of("a runtime", runtimes.names), (str,), runtimes.parse)


_TAG_KINDS = {"bool": "a boolean", "int": "a number", "float": "a number", "timestamp": "a date"}


def describe(node: Node) -> str:
    """What the file has at `node`, for "expected X, got Y" messages."""
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    kind = node.tag.rpartition(":")[2]
    if kind == "null":
        return "nothing"
    if kind == "str":
        return repr(node.value)
    return f"{node.value} ({_TAG_KINDS.get(kind, kind)})"


def is_null(node: Node) -> bool:
    """Whether `node` is YAML null (`~`, `null` or nothing after the colon)."""
    return isinstance(node, ScalarNode) and node.tag == NULL_TAG
