"""The simulated Ollama's copy of text/template's parser against Go's own, on templates
built at random from the pieces its grammar is made of: the same error, word for word, or
none for both (the oracle's -check-templates runs Ollama's template.Parse)."""

from __future__ import annotations

import json
import random
import subprocess

import pytest

from gpugate.sim.ollama.gotemplate import TemplateError, parse
from tests.oracle.oracle import ORACLE_BINARY

pytestmark = pytest.mark.skipif(
    not ORACLE_BINARY.exists(),
    reason=f"{ORACLE_BINARY} is not built (tests/oracle/build.sh GO)",
)

PIECES = [
    "{{", "}}", "{{-", "-}}", " ", "\n", "\t", "\r", ".Prompt", ".System", ".", "$", "$x", ":=",
    "=", ",", "if", "else", "end", "range", "with", "template", "define", "block", "break",
    "continue", '"x"', '"', "`r`", "`", "'a'", "'", "(", ")", "|", "json", "printf", "foo", "1",
    "1.5", "0x1F", "08", "1e400", "99999999999999999999", "1_000", "1+2i", "0x1+2i", "1-2i",
    "0b1+1i", "2.5i", "0x1p2+1i", "/*", "*/", "{{/* c */}}", "{{- /* x */ -}}", "nil", "true",
    "text", "-", "+", "'\\n'", '"\\q"', '"\\x41"', "\u00e9", "\x01", "\u00a0", "\u0085", "#",
    "{{end}}", "{{else}}", "{{ .Prompt }}", "{{ if .System }}", "{{ range .Messages }}", "$m",
    ".Content", '{{ template "x" }}', '{{ template "b" . }}', '{{ define "x" }}',
    '{{ define "" }}', '{{ block "b" . }}', "{{ else if . }}", "{{ else with . }}", "len",
    "index", "not", "and", ".A.B", "$.Prompt", ".5", "0b101", "0o17", "-1", "0x", "1__0",
    "'ab'", "'\\''", "\"\\'\"", "}", "{", ":", "$a, $b :=", "range $a, $b, $c :=",
    "{{ range $i, $m := . }}", "{{ with $x := . }}", "{{break}}", "{{continue}}",
]  # fmt: skip
FIXED = [
    "{{", "{{ .Prompt", "{{ end }}", "{{ if .System }}", "{{ foo }}", "{{ $x }}",
    '{{ template "x" }}', '{{ "open }}', "{{ .Prompt | }}", "{{ (.Prompt }}", "{{ ) }}",
    "{{/* open", "{{ 1a }}", "{{ break }}", "{{ else }}", "{{ .Prompt . }}", "{{ .Prompt }}",
    "{{- .Prompt -}}", '{{ printf "%s" .Prompt }}',
    "{{ range $i, $m := .Messages }}{{ $m.Content }}{{ end }}",
    '{{define "x"}}a{{end}}{{define "x"}}b{{end}}', "{{ 1 | 2 }}", "{{ .A | .B }}",
    "{{ $x := 1 }}{{ $x }}", "{{ range $a, $b, $c := . }}{{end}}",
    "{{ with $x := . }}{{ $x }}{{ else with .B }}{{ end }}", '{{ "x".y }}', "{{ 1.y }}",
    "{{ ' }}", "{{ '' }}", "{{ $ }}", "a\n{{\nfoo\n}}", "a\n{{ .X \n",
    '{{ block "b" . }}x{{ end }}',
]  # fmt: skip


def go_errors(templates: list[str]) -> list[str]:
    """The error Ollama's template.Parse gives each template, from the oracle binary."""
    lines = "".join(json.dumps(t) + "\n" for t in templates)
    done = subprocess.run(
        [str(ORACLE_BINARY), "-check-templates"],
        input=lines,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return [json.loads(line) for line in done.stdout.splitlines()]


def python_error(template: str) -> str:
    try:
        parse(template)
    except TemplateError as exc:
        return str(exc)
    return ""


def test_every_template_fails_as_in_go() -> None:
    rng = random.Random(20261206)
    templates = FIXED + [
        "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 14))) for _ in range(20_000)
    ]
    wanted = go_errors(templates)
    assert len(wanted) == len(templates)
    differing = [
        (t, w, python_error(t))
        for t, w in zip(templates, wanted, strict=True)
        if python_error(t) != w
    ]
    assert differing == []
    # The corpus reaches both sides of the parser.
    refused = sum(1 for w in wanted if w)
    assert 1000 < refused < len(templates) - 1000
