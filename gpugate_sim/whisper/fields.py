"""Multipart fields of a request, read as whisper-server's `get_req_parameters` reads them.

Every field is a multipart part (`req.has_file`; the parts as cpp-httplib reads them are
framing.py's); numbers go through `std::stoi` or
`std::stof`, which take the longest numeric prefix after leading blanks and throw
`std::invalid_argument` / `std::out_of_range` whose what() is the function's name. The
server's exception handler turns that into a 500 `text/plain` body.
"""

from __future__ import annotations

import re

import attrs

INT_MAX = 2**31 - 1
FLOAT_MAX = 3.4028234663852886e38
_INT = re.compile(r"[ \t\n\v\f\r]*([+-]?\d+)")
_FLOAT = re.compile(
    r"[ \t\n\v\f\r]*([+-]?(?:infinity|inf|nan(?:\([0-9a-z_]*\))?|"
    r"(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?))",
    re.IGNORECASE,
)

NUMBER_FIELDS = (
    ("offset_t", "i"), ("offset_n", "i"), ("duration", "i"), ("max_context", "i"),
    ("max_len", "i"), ("best_of", "i"), ("beam_size", "i"), ("audio_ctx", "f"),
    ("word_thold", "f"), ("entropy_thold", "f"), ("logprob_thold", "f"),
    ("no_speech_thold", "f"), ("temperature", "f"), ("temperature_inc", "f"),
    ("vad_threshold", "f"), ("vad_min_speech_duration_ms", "f"),
    ("vad_min_silence_duration_ms", "f"), ("vad_max_speech_duration_s", "f"),
    ("vad_speech_pad_ms", "i"), ("vad_samples_overlap", "f"),
)  # fmt: skip
"""Numeric fields in the order the server reads them, with std::stoi (i) or std::stof (f)."""


class CppException(Exception):
    """What a std::stoi/std::stof call would throw; str() is its what()."""


def stoi(text: str) -> int:
    """`std::stoi`."""
    found = _INT.match(text)
    if found is None:
        raise CppException("stoi")
    value = int(found.group(1))
    if not -INT_MAX - 1 <= value <= INT_MAX:
        raise CppException("stoi")
    return value


def stof(text: str) -> float:
    """`std::stof` (strtof: decimal, inf and nan; ERANGE is out_of_range)."""
    found = _FLOAT.match(text)
    if found is None:
        raise CppException("stof")
    word = found.group(1).lower()
    value = float(word.split("(")[0].replace("infinity", "inf"))
    if word.lstrip("+-")[:3] not in ("inf", "nan") and abs(value) > FLOAT_MAX:
        raise CppException("stof")
    return value


def str_to_bool(text: str) -> bool:
    """`parse_str_to_bool` of the server."""
    return text in ("true", "1", "yes", "y")


@attrs.frozen
class Part:
    content: bytes
    filename: str = ""

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


@attrs.define
class InferenceParams:
    """The request's parameters after the server's defaults."""

    response_format: str = "json"
    language: str = "en"
    translate: bool = False
    detect_language: bool = False
    temperature: float = 0.0
    no_timestamps: bool = False
    token_timestamps: bool = True
    offset_n: int = 0
    no_language_probabilities: bool = False
    numbers: dict[str, float] = attrs.field(factory=dict)


def inference_params(parts: dict[str, Part]) -> InferenceParams:
    """Read the fields as the server does; CppException on a bad number."""
    params = InferenceParams()
    for name, kind in NUMBER_FIELDS:
        if name in parts:
            text = parts[name].text
            params.numbers[name] = stoi(text) if kind == "i" else stof(text)
    flag = {name: str_to_bool(part.text) for name, part in parts.items()}
    params.translate = flag.get("translate", False)
    params.no_timestamps = flag.get("no_timestamps", False)
    params.token_timestamps = flag.get("token_timestamps", not params.no_timestamps)
    params.detect_language = flag.get("detect_language", False)
    params.no_language_probabilities = flag.get("no_language_probabilities", False)
    if "language" in parts:
        params.language = parts["language"].text
    if "response_format" in parts:
        params.response_format = parts["response_format"].text
    params.temperature = params.numbers.get("temperature", 0.0)
    params.offset_n = int(params.numbers.get("offset_n", 0))
    # detect_language makes the language "auto" only after the handler's check of an
    # English-only model (server.py), as in server.cpp.
    return params
