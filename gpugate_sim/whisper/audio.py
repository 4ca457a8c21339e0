"""Audio bytes read as whisper-server reads them: `read_audio_data` of common-whisper.cpp.

The server hands the uploaded bytes to miniaudio (`ma_decoder_init_memory`), which knows
WAV (dr_wav), FLAC (dr_flac) and MP3 (dr_mp3), then asks the decoder for its length in
16 kHz frames and reads that many (`read_audio_from_decoder`). Only the length matters
here, so only headers are read: a WAV's `fmt `/`data` chunks (PCM, IEEE float, A-law,
µ-law, or those inside WAVE_FORMAT_EXTENSIBLE), a FLAC's STREAMINFO, an MP3's frame headers.
A length of 0 frames fails the read, as `ma_decoder_read_pcm_frames` refuses a count of 0.
"""

from __future__ import annotations

import io
import math
import struct
import wave

import attrs

SAMPLE_RATE = 16000
"""WHISPER_SAMPLE_RATE: what the decoder resamples to."""
WAVE_FORMATS = {1: "pcm", 3: "float", 6: "alaw", 7: "mulaw"}
WAVE_FORMAT_EXTENSIBLE = 0xFFFE
DECODE_FAILED = "error: failed to decode audio data from memory buffer"
NO_FRAMES = "error: failed to read the frames of the audio data (Invalid argument)"

_MP3_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}
_MP3_KBPS = {
    (1, 1): (0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),
    (1, 2): (0, 32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
    (1, 3): (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (2, 1): (0, 32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),
    (2, 2): (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
"""Kbit/s by (MPEG-1 or not, layer) and bitrate index; MPEG-2/2.5 layer III as layer II."""


class AudioError(ValueError):
    """The bytes are not audio whisper.cpp could decode; str() is the line it logs."""


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
        """Samples after the decoder's resampling to 16 kHz mono (what the server counts)."""
        return round(self.seconds * SAMPLE_RATE)


def read_audio(data: bytes) -> Audio:
    """The audio's length and format; AudioError when miniaudio would not decode it."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        audio = _wav(data)
    elif data[:4] == b"fLaC":
        audio = _flac(data)
    else:
        audio = _mp3(data)
    if audio.samples_16k == 0:
        raise AudioError(NO_FRAMES)
    return audio


def _wav(data: bytes) -> Audio:
    fmt: tuple[int, int, int, int] | None = None
    pos = 12
    while pos + 8 <= len(data):
        chunk, size = data[pos : pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        body = data[pos + 8 : pos + 8 + size]
        if chunk == b"fmt " and len(body) >= 16:
            tag, channels, rate, _, align, _ = struct.unpack_from("<HHIIHH", body)
            if tag == WAVE_FORMAT_EXTENSIBLE and len(body) >= 26:
                tag = struct.unpack_from("<H", body, 24)[0]  # the sub-format GUID's first field
            fmt = (tag, channels, rate, align)
        elif chunk == b"data":
            if fmt is None or fmt[0] not in WAVE_FORMATS or not (fmt[1] and fmt[2] and fmt[3]):
                break
            # The header's count: dr_wav trusts the chunk size, and the server reads that
            # many frames whether or not the bytes are all there.
            return Audio(size // fmt[3], fmt[2], fmt[1])
        pos += 8 + size + (size & 1)
    raise AudioError(DECODE_FAILED)


def _flac(data: bytes) -> Audio:
    # The first metadata block is STREAMINFO: 34 bytes, the sample rate (20 bits), the
    # channels (3), the bits per sample (5) and the total samples (36) from byte 10.
    if len(data) < 8 + 18 or data[4] & 0x7F != 0:
        raise AudioError(DECODE_FAILED)
    packed = int.from_bytes(data[18:26], "big")
    rate = packed >> 44
    channels = ((packed >> 41) & 0x7) + 1
    total = packed & ((1 << 36) - 1)
    if rate == 0:
        raise AudioError(DECODE_FAILED)
    return Audio(total, rate, channels)


def _mp3(data: bytes) -> Audio:
    pos = 0
    if data[:3] == b"ID3" and len(data) >= 10:
        size = 0
        for byte in data[6:10]:
            size = size << 7 | (byte & 0x7F)
        pos = 10 + size + (10 if data[5] & 0x10 else 0)
    samples = 0
    rate = channels = 0
    first = True
    while pos + 4 <= len(data):
        frame = _mp3_frame(data[pos : pos + 4])
        if frame is None:
            break
        length, frame_samples, frame_rate, frame_channels = frame
        # A Xing/Info frame (the VBR header an encoder writes first) holds no audio.
        if not (first and (b"Xing" in data[pos : pos + 64] or b"Info" in data[pos : pos + 64])):
            samples += frame_samples
        rate, channels, first = frame_rate, frame_channels, False
        pos += length
    if rate == 0:
        raise AudioError(DECODE_FAILED)
    return Audio(samples, rate, channels)


def _mp3_frame(head: bytes) -> tuple[int, int, int, int] | None:
    """(bytes, samples, rate, channels) of the MPEG audio frame `head` starts; None if none."""
    if head[0] != 0xFF or head[1] & 0xE0 != 0xE0:
        return None
    version, layer_bits = (head[1] >> 3) & 3, (head[1] >> 1) & 3
    bitrate_index, rate_index = head[2] >> 4, (head[2] >> 2) & 3
    if version == 1 or layer_bits == 0 or bitrate_index in (0, 15) or rate_index == 3:
        return None  # reserved values, or free format (which the sim does not follow)
    layer = 4 - layer_bits
    mpeg1 = version == 3
    kbps = _MP3_KBPS[(1, layer) if mpeg1 else (2, 1 if layer == 1 else 2)][bitrate_index]
    rate = _MP3_RATES[version][rate_index]
    padding = (head[2] >> 1) & 1
    channels = 1 if head[3] >> 6 == 3 else 2
    if layer == 1:
        return (12 * kbps * 1000 // rate + padding) * 4, 384, rate, channels
    samples = 1152 if mpeg1 or layer == 2 else 576
    return samples // 8 * kbps * 1000 // rate + padding, samples, rate, channels


# -- making audio, for tests and demos ----------------------------------------------------------


def wav_bytes(seconds: float, rate: int = 16000, channels: int = 1) -> bytes:
    """A silent 16-bit PCM WAV of this length."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(channels)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(b"\0\0" * channels * round(seconds * rate))
    return buffer.getvalue()


def float_wav_bytes(seconds: float, rate: int = 16000, channels: int = 1) -> bytes:
    """A silent 32-bit IEEE float WAV (format 3) of this length."""
    frames = round(seconds * rate)
    data = b"\0" * 4 * channels * frames
    fmt = struct.pack("<HHIIHH", 3, channels, rate, rate * 4 * channels, 4 * channels, 32)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def mp3_bytes(seconds: float) -> bytes:
    """Silent MPEG-1 layer III frames (44.1 kHz mono, 128 kbit/s) covering `seconds`."""
    head = bytes((0xFF, 0xFB, 0x90, 0xC0))
    length = 1152 // 8 * 128_000 // 44100
    frame = head + b"\0" * (length - len(head))
    return frame * math.ceil(seconds * 44100 / 1152)
