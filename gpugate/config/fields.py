"""How each field of the model is spelled in consumers.yaml: the metadata the loader reads.

Field metadata tells the loader (gpugate.config.walker) how the YAML is spelled:

* `kind`: how to read a scalar: "size" ("7.5GiB", "1216348160"), "duration" ("15m", "901s"),
  "token" (a literal, "env:NAME", "file:PATH", "credential:NAME" or "credential:NAME:PATH"),
  "scope" (a control token's scope), "cors_origin" (a header value: "*" or an origin);
  "control_token" is a token or a mapping `{token, scopes}` (TokenEntry), read as a
  ControlToken.
* `yaml`: the key's name in the file when it differs from the field's (`class:` for `priority`).
* `keyed_by`: a tuple written as a YAML mapping whose keys fill this field of each entry
  (`consumers: {ollama: {...}}` fills `Consumer.name`).
* `value_of`: with `keyed_by`, each entry's value is a scalar filling this field
  (`files: {ae.safetensors: 320MiB}` fills `FileSize.pattern` and `FileSize.size`).
"""

from __future__ import annotations

import attrs

SIZE = {"kind": "size"}
DURATION = {"kind": "duration"}
TOKEN = {"kind": "token"}
CONTROL_TOKEN = {"kind": "control_token"}
SCOPE = {"kind": "scope"}
STRING_MAP = {"kind": "string_map"}
CORS_ORIGIN = {"kind": "cors_origin"}
RUNTIME = {"kind": "runtime"}
SECTION = {"section_of": "runtime"}
CLASS_KEY = {"yaml": "class"}
MAX_CLASS_KEY = {"yaml": "max_class"}
BY_NAME = {"keyed_by": "name"}
BY_CLASS = {"keyed_by": "priority"}
BY_PATTERN = {"keyed_by": "pattern", "value_of": "size"}


def yaml_key(field: attrs.Attribute) -> str:
    """The key a field is written as in the file (`class` for a `priority` field)."""
    return field.metadata.get("yaml", field.name)
