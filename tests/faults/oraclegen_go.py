"""Ollama bodies that test a reader's copy of Go's encoding/json, for the oracle fuzzer.

Each is a request of an installed model that would load, bent in the ways a Python reader
gets wrong: a member set to `null` after (or before) its value (Go leaves a string or an int
as it was, and sets a pointer, slice, map or interface to nil), keys that fold to a field in
Go (case, U+212A KELVIN SIGN, U+017F LONG S) and keys that fold only in Python (`ß`, `ı`,
`ﬆ`, `ﬅ`, fullwidth letters), duplicates and case-variant duplicates (the last wins),
nested `options` (exact keys, a second object merged into the first, null values, runner
options of every JSON type), keep_alive forms, and the `format` and `template` Ollama
refuses only once the model is loaded.
"""

from __future__ import annotations

import json
import random

INSTALLED = ("gemma3:12b", "llama3.2:3b", "bge-m3", "GEMMA3:12B", "llama3.2:3b ", "bge-m3:latest")
"""The simulated Ollama's models (tests.faults.stack), in spellings Ollama resolves."""
COMPLETION_MODELS = ("gemma3:12b", "llama3.2:3b", "Llama3.2:3B", "gemma3:12b")
GO_FOLDS = {"k": "\u212a", "s": "\u017f"}
"""Runes Go's foldName maps onto an ASCII letter."""
PYTHON_FOLDS = {"ss": "\u00df", "i": "\u0131", "st": "\ufb06", "ft": "\ufb05", "o": "\uff4f"}
"""What str.upper() maps onto ASCII letters and Go does not: ß, dotless ı, the ﬆ and ﬅ
ligatures (ﬅ is ſt), a fullwidth o."""
RUNNER_VALUES = {
    "num_ctx": ["2048", "8192", "2048.7", "-1", "0", "1e300", "9223372036854775808", '"4096"',
                "null", "true"],
    "num_gpu": ["0", "1", "-1", "99", "0.5", "null", '"x"'],
    "num_batch": ["256", "512", "1e3"],
    "main_gpu": ["0", "1", "null"],
    "num_thread": ["4", "0"],
    "use_mmap": ["true", "false", "null", '"yes"', "1"],
}  # fmt: skip
OTHER_OPTIONS = {
    "num_predict": ["2", "1.5", "null", '"2"'],
    "temperature": ["0.5", '"hot"', "null", "1e39"],
    "stop": ['["x"]', '"x"', '["x", 1]', "null", "[]"],
    "seed": ["1", "true"],
}  # fmt: skip
KEEP_ALIVES = ['"5m"', "0", "-1", "300", '"0s"', "1.5", '"1h"', '"-1m"', "null", '"x"', "[]",
               '"1e3"', "1e400", '"+5m"']  # fmt: skip
FORMATS = ['"json"', '"yaml"', '""', "null", "{}", '{"type": "object"}', '"\\u006Ason"', "[]",
           "1", "true", '"JSON"', '"json "', '{"type":"string"}', '"<json>"']  # fmt: skip
TEMPLATES = [
    "{{ .Prompt }}", "{{ .System }}{{ .Prompt }}", "plain", "{{- .Prompt -}}",
    "{{ if .System }}{{ .System }}{{ end }}{{ .Prompt }}", '{{ printf "%s" .Prompt }}',
    "{{ json .Prompt }}", "{{/* note */}}{{ .Prompt }}", "{{", "{{ .Prompt", "{{ end }}",
    "{{ if .System }}", "{{ foo .Prompt }}", "{{ $x }}", '{{ template "x" }}',
    '{{ "open }}', "{{ .Prompt | }}", "{{ (.Prompt }}", "{{ ) }}", "{{/* open", "{{ 1a }}",
    "{{ break }}", "{{ else }}", "line one\n{{ .Prompt\n", "{{ range .Messages }}x",
    '{{ define "a" }}x{{ end }}{{ define "a" }}y{{ end }}', "{{ .Prompt }}{{ 08 }}",
    "{{ 'ab' }}", "{{ .Prompt.x.y }}", "{{ 1.x }}", "{{ .Prompt 1+2i }}",
]  # fmt: skip
MESSAGES = [
    '[{"role": "user", "content": "hi"}]', '[{"ROLE": "user", "Content": "hi"}]',
    '[{"role": "user", "contenT": 5}]', '[{"role": "user", "\\u0063ontent": 5}]',
    '[{"role": "user", "content": "hi", "\u0131mages": [1]}]',
    '[{"role": "user", "content": "hi", "images": [1]}]',
    '[{"role": "user", "content": "hi", "thin\u212aing": 1}]', "null", "[]", "[null]",
    '[{"role": "user", "content": "hi"}, {"role": "user", "content": null}]',
]  # fmt: skip


def _fold(rng: random.Random, name: str) -> str:
    """A spelling of a key: Go's folds, Python's only, or a case mix."""
    roll = rng.random()
    if roll < 0.3:
        for plain, folded in GO_FOLDS.items():
            name = name.replace(plain, folded) if rng.random() < 0.7 else name
        return name
    if roll < 0.6:
        options = [(p, f) for p, f in PYTHON_FOLDS.items() if p in name]
        if options:
            plain, folded = rng.choice(options)
            return name.replace(plain, folded, 1)
    return "".join(c.upper() if rng.random() < 0.5 else c for c in name)


def _options(rng: random.Random) -> list[str]:
    """One or two `options` members."""
    objects = []
    for _ in range(1 if rng.random() < 0.7 else 2):
        members = []
        for key in rng.sample(sorted(RUNNER_VALUES), rng.randint(0, 3)):
            spelled = key.upper() if rng.random() < 0.1 else key  # map keys are exact
            members.append((spelled, rng.choice(RUNNER_VALUES[key])))
        for key in rng.sample(sorted(OTHER_OPTIONS), rng.randint(0, 1)):
            members.append((key, rng.choice(OTHER_OPTIONS[key])))
        if members and rng.random() < 0.15:
            key, _ = rng.choice(members)
            members.append((key, rng.choice(RUNNER_VALUES.get(key, ["null"]))))
        objects.append("{" + ", ".join(f'"{k}": {v}' for k, v in members) + "}")
    if len(objects) == 2 and rng.random() < 0.3:
        objects.insert(1, "null")
    return objects


def _fields(rng: random.Random, route: str) -> list[tuple[str, str]]:
    openai = route.startswith("/v1/")
    models = COMPLETION_MODELS if "embed" not in route else ("bge-m3", "BGE-M3", "bge-m3:latest")
    model = json.dumps(rng.choice(models if rng.random() < 0.9 else INSTALLED))
    fields = [("model", model)]
    if route in ("/api/generate", "/v1/completions"):
        fields.append(("prompt", rng.choice(['"hi"', '"hi"', '""', "null"])))
    elif route in ("/api/chat", "/v1/chat/completions"):
        fields.append(("messages", rng.choice(MESSAGES[:1] * 4 + MESSAGES)))
    elif route == "/api/embeddings":
        fields.append(("prompt", '"hi"'))
    else:
        fields.append(("input", rng.choice(['"hi"', '["a"]', "null"])))
    if openai:
        if route == "/v1/chat/completions" and rng.random() < 0.3:
            fields.append(("response_format", '{"type": "json_object"}'))
        if rng.random() < 0.3:
            fields.append(("max_tokens", rng.choice(["2", "null", '"2"'])))
        return fields
    if rng.random() < 0.7:
        fields += [("options", text) for text in _options(rng)]
    if rng.random() < 0.5:
        fields.append(("keep_alive", rng.choice(KEEP_ALIVES)))
    if route in ("/api/generate", "/api/chat") and rng.random() < 0.6:
        fields.append(("format", rng.choice(FORMATS)))
    if route == "/api/generate":
        if rng.random() < 0.6:
            fields.append(("template", json.dumps(rng.choice(TEMPLATES))))
        if rng.random() < 0.1:
            fields.append(("raw", rng.choice(["true", "false", "null"])))
    if route in ("/api/generate", "/api/chat") and rng.random() < 0.1:
        fields.append(("think", rng.choice(["false", "null", "true", '"low"', '"x"', "1"])))
    return fields


def go_reading_body(rng: random.Random, route: str) -> str:
    """A loading request for `route` with Go's reading bent in up to three ways (none for
    one in five: its format or template is then all that can refuse it)."""
    fields = _fields(rng, route)
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        roll = rng.random()
        index = rng.randrange(len(fields))
        name, value = fields[index]
        if roll < 0.3:  # null after the value: kept for a value type, nil for the others
            fields.insert(index + 1, (name, "null"))
        elif roll < 0.4:  # null before it
            fields.insert(index, (name, "null"))
        elif roll < 0.65:  # the key spelled otherwise
            fields[index] = (_fold(rng, name), value)
        elif roll < 0.85:  # a duplicate whose key is spelled otherwise: the last wins
            other = rng.choice(['"llama3.2:3b"', '"nope:1b"', '""', "5", '"5m"', "{}", "[]"])
            fields.insert(index + 1, (_fold(rng, name), other))
        else:  # a key that folds only in Python, with a value of the wrong type
            key = rng.choice(["messages", "options", "stream", "images", "keep_alive"])
            fields.append((_fold(rng, key), "7"))
    ascii_keys = rng.random() < 0.5
    members = (f"{json.dumps(name, ensure_ascii=ascii_keys)}: {v}" for name, v in fields)
    return "{" + ", ".join(members) + "}"
