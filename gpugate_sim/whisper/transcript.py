"""A deterministic fake transcript of some audio, in whisper-server's five response formats.

The transcript depends only on the duration: one segment per started 5 seconds, about two
words a second, from a fixed word list; audio under 100 ms gives none (whisper_full's
"input is too short"), and so does a request that only detects the language. The formats
follow the server's handler: text (`output_str`), srt, vtt, json and verbose_json, whose
objects are built in the handler's order (nlohmann `ordered_json`, `dump(-1)`: no spaces,
UTF-8 as is). Numbers the server holds as C `float` go through single precision, as they
do there.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import attrs

from gpugate_sim.whisper.audio import (  # noqa: F401  (read where they used to live)
    Audio,
    AudioError,
    read_audio,
    wav_bytes,
)

SEGMENT_MS = 5000
WORDS_PER_SECOND = 2.0
TOO_SHORT_SAMPLES = 1600
"""whisper_full returns no segment for less than 10 mel frames (100 ms at 16 kHz)."""
TOKEN_BASE = 50365
"""Token ids start above the special tokens, as text tokens of a multilingual model do."""
TIMESTAMP_TOKENS = 2
"""A segment's own tokens include its begin and end timestamp tokens (never in `tokens`)."""
NO_DTW = -1
"""`t_dtw` of a token when the server runs without `--dtw` (whisper_sample_token's default)."""
_TEXT = (
    "and so my fellow listeners ask not what the card can hold for you ask what you "
    "can free for the card the model stays loaded while the server runs"
)
_WORDS = tuple(_TEXT.split(" "))
LANGUAGES = (
    ("en", "english"), ("zh", "chinese"), ("de", "german"), ("es", "spanish"),
    ("ru", "russian"), ("ko", "korean"), ("fr", "french"), ("ja", "japanese"),
    ("pt", "portuguese"), ("tr", "turkish"), ("pl", "polish"), ("ca", "catalan"),
    ("nl", "dutch"), ("ar", "arabic"), ("sv", "swedish"), ("it", "italian"),
    ("id", "indonesian"), ("hi", "hindi"), ("fi", "finnish"), ("vi", "vietnamese"),
)  # fmt: skip
"""The first language ids of whisper.cpp's table (`g_lang`), in id order."""
NAMES = dict(LANGUAGES)
DETECTED = "en"
"""What language detection finds in any audio here (the fake words are English)."""
LANGUAGE_PROBABILITIES = {
    "en": 0.9375, "de": 0.0196, "fr": 0.0098, "es": 0.0061, "nl": 0.0044, "it": 0.0037,
    "pt": 0.0029, "sv": 0.0024, "pl": 0.0018, "ru": 0.0015, "ja": 0.0012, "zh": 0.0011,
}  # fmt: skip
"""The softmax over language tokens that detection yields; the rest is below 0.001."""


def f32(value: float) -> float:
    """`value` as a C float, widened back to double (how nlohmann prints a float)."""
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


@attrs.frozen
class Token:
    id: int
    text: str
    t0: int
    t1: int
    prob: float = 0.75


@attrs.frozen
class Segment:
    text: str
    t0: int
    """Milliseconds."""
    t1: int
    tokens: tuple[Token, ...]
    no_speech_prob: float = 0.0


@attrs.frozen
class Transcript:
    segments: tuple[Segment, ...]
    samples: int
    """16 kHz samples of the audio (`pcmf32.size()`)."""
    language: str
    """The language's full name (`whisper_lang_str_full`)."""
    task: str

    @property
    def duration(self) -> float:
        return f32(self.samples / 16000)


def transcribe(
    audio: Audio, *, language: str = "en", translate: bool = False, detect_only: bool = False
) -> Transcript:
    """The fake transcript of `audio`: its length depends on the duration only.

    `language` "auto" (or empty) is detected; `detect_only` stops there, with no segments.
    """
    code = DETECTED if language in ("auto", "") or detect_only else language
    task = "translate" if translate else "transcribe"
    name = NAMES.get(code, code)
    if detect_only or audio.samples_16k < TOO_SHORT_SAMPLES:
        return Transcript((), audio.samples_16k, name, task)
    total_ms = math.floor(audio.seconds * 1000)
    segments = []
    word = 0
    for start in range(0, total_ms, SEGMENT_MS):
        end = min(start + SEGMENT_MS, total_ms)
        count = max(1, round((end - start) / 1000 * WORDS_PER_SECOND))
        step = (end - start) // count
        tokens = []
        for i in range(count):
            text = " " + _WORDS[word % len(_WORDS)]
            tokens.append(Token(TOKEN_BASE + word % len(_WORDS), text, start + i * step,
                                start + (i + 1) * step))  # fmt: skip
            word += 1
        segments.append(Segment("".join(t.text for t in tokens), start, end, tuple(tokens)))
    return Transcript(tuple(segments), audio.samples_16k, name, task)


def _timestamp(ms: int, comma: bool = False) -> str:
    # to_timestamp() of common-whisper.cpp, which takes centiseconds.
    msec = (ms // 10) * 10
    hours, msec = divmod(msec, 3_600_000)
    minutes, msec = divmod(msec, 60_000)
    seconds, msec = divmod(msec, 1000)
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}{',' if comma else '.'}{msec:03d}"


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def format_text(result: Transcript) -> str:
    return "".join(seg.text + "\n" for seg in result.segments)


def format_srt(result: Transcript, offset_n: int = 0) -> str:
    return "".join(
        f"{i + 1 + offset_n}\n{_timestamp(s.t0, True)} --> {_timestamp(s.t1, True)}\n{s.text}\n\n"
        for i, s in enumerate(result.segments)
    )


def format_vtt(result: Transcript) -> str:
    body = "".join(
        f"{_timestamp(s.t0)} --> {_timestamp(s.t1)}\n{s.text}\n\n" for s in result.segments
    )
    return "WEBVTT\n\n" + body


def format_json(result: Transcript) -> str:
    return _dump({"text": format_text(result)})


def format_verbose_json(
    result: Transcript,
    *,
    temperature: float,
    no_timestamps: bool,
    token_timestamps: bool,
    language_probabilities: bool = True,
) -> str:
    """The OpenAI-like verbose form, keys in the order the server's handler adds them."""
    doc: dict[str, Any] = {
        "task": result.task,
        "language": result.language,
        "duration": result.duration,
        "text": format_text(result),
        "segments": [],
    }
    if language_probabilities:
        doc["detected_language"] = NAMES[DETECTED]
        doc["detected_language_probability"] = f32(LANGUAGE_PROBABILITIES[DETECTED])
        doc["language_probabilities"] = {
            code: f32(LANGUAGE_PROBABILITIES[code])
            for code, _ in LANGUAGES
            if code in LANGUAGE_PROBABILITIES
        }
    doc["segments"] = [
        _verbose_segment(i, seg, temperature, no_timestamps, token_timestamps)
        for i, seg in enumerate(result.segments)
    ]
    return _dump(doc)


def _verbose_segment(
    i: int, seg: Segment, temperature: float, no_timestamps: bool, token_timestamps: bool
) -> dict[str, Any]:
    segment: dict[str, Any] = {"id": i, "text": seg.text}
    if not no_timestamps:
        # Centiseconds times 0.01, a double: 0.7000000000000001 for 70, as the server has it.
        segment["start"] = seg.t0 // 10 * 0.01
        segment["end"] = seg.t1 // 10 * 0.01
    total_logprob = 0.0
    for tok in seg.tokens:
        # Each token's id is pushed before its word, so "tokens" comes first in the object.
        segment.setdefault("tokens", []).append(tok.id)
        word: dict[str, Any] = {"word": tok.text}
        if not no_timestamps and token_timestamps:
            word["start"] = tok.t0 // 10 * 0.01
            word["end"] = tok.t1 // 10 * 0.01
            word["t_dtw"] = NO_DTW
        word["probability"] = f32(tok.prob)
        total_logprob = f32(total_logprob + f32(math.log(tok.prob)))
        segment.setdefault("words", []).append(word)
    segment["temperature"] = f32(temperature)
    n_tokens = len(seg.tokens) + (0 if no_timestamps else TIMESTAMP_TOKENS)
    segment["avg_logprob"] = f32(total_logprob / n_tokens) if n_tokens else 0.0
    segment["no_speech_prob"] = f32(seg.no_speech_prob)
    return segment
