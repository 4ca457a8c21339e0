"""Audio in, a deterministic fake transcript out, in whisper-server's five response formats.

The audio is read as whisper.cpp's `read_audio_data` would for a WAV file (any rate and
channel count; anything else fails). The transcript depends only on the duration: one
segment per started 5 seconds, about two words a second, from a fixed word list. The
formats follow `format_text`, `format_srt`, `format_vtt`, `format_json` and
`format_verbose_json` of the server (nlohmann `dump(-1)`: no spaces, UTF-8 as is).
"""

from __future__ import annotations

import io
import json
import math
import wave
from typing import Any

import attrs

SEGMENT_MS = 5000
WORDS_PER_SECOND = 2.0
TOKEN_BASE = 50365
"""Token ids start above the special tokens, as text tokens of a multilingual model do."""
_TEXT = (
    "and so my fellow listeners ask not what the card can hold for you ask what you "
    "can free for the card the model stays loaded while the server runs"
)
_WORDS = tuple(_TEXT.split(" "))
LANGUAGES = {"en": "english", "de": "german", "fr": "french", "es": "spanish", "it": "italian"}


class AudioError(ValueError):
    """The bytes are not audio whisper.cpp could decode."""


@attrs.frozen
class Audio:
    frames: int
    rate: int
    channels: int

    @property
    def seconds(self) -> float:
        return self.frames / self.rate if self.rate else 0.0

    @property
    def samples_16k(self) -> int:
        """Samples after the decoder's resampling to 16 kHz mono (what the log reports)."""
        return round(self.seconds * 16000)


def read_audio(data: bytes) -> Audio:
    """Parse a RIFF/WAVE header; AudioError when it is not one."""
    try:
        with wave.open(io.BytesIO(data), "rb") as wav:
            return Audio(wav.getnframes(), wav.getframerate(), wav.getnchannels())
    except (wave.Error, EOFError, ValueError) as exc:
        raise AudioError(str(exc)) from None


def wav_bytes(seconds: float, rate: int = 16000, channels: int = 1) -> bytes:
    """A silent 16-bit PCM WAV of this length (for tests and demos)."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(channels)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(b"\0\0" * channels * round(seconds * rate))
    return buffer.getvalue()


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
    duration: float
    language: str
    task: str


def transcribe(audio: Audio, *, language: str = "en", translate: bool = False) -> Transcript:
    """The fake transcript of `audio`: its length depends on the duration only."""
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
    code = "en" if language in ("auto", "") else language
    return Transcript(
        tuple(segments),
        audio.samples_16k / 16000,
        LANGUAGES.get(code, code),
        "translate" if translate else "transcribe",
    )


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
    """The OpenAI-like verbose form, keys in the server's order."""
    doc: dict[str, Any] = {
        "task": result.task,
        "language": result.language,
        "duration": result.duration,
        "text": format_text(result),
        "segments": [],
    }
    if language_probabilities:
        doc["detected_language"] = result.language
        doc["detected_language_probability"] = 0.96875
        doc["language_probabilities"] = {_code(result.language): 0.96875}
    for i, seg in enumerate(result.segments):
        segment: dict[str, Any] = {"id": i, "text": seg.text}
        if not no_timestamps:
            segment["start"] = seg.t0 / 1000
            segment["end"] = seg.t1 / 1000
        words = []
        for tok in seg.tokens:
            word: dict[str, Any] = {"word": tok.text}
            if not no_timestamps and token_timestamps:
                word["start"] = tok.t0 / 1000
                word["end"] = tok.t1 / 1000
            word["probability"] = tok.prob
            words.append(word)
        segment["words"] = words
        segment["tokens"] = [tok.id for tok in seg.tokens]
        segment["temperature"] = temperature
        logprobs = [math.log(tok.prob + 1e-10) for tok in seg.tokens]
        segment["avg_logprob"] = sum(logprobs) / len(logprobs) if logprobs else 0.0
        segment["no_speech_prob"] = seg.no_speech_prob
        doc["segments"].append(segment)
    return _dump(doc)


def _code(language: str) -> str:
    for code, name in LANGUAGES.items():
        if name == language:
            return code
    return language
