"""Tokens in and text out, without a model: a vocabulary-driven tokenizer and filler text.

Tokenizing follows llama.cpp's SentencePiece path (src/llama-vocab.cpp, `LLAMA_VOCAB_TYPE_SPM`)
far enough to count tokens right for vocabularies whose normal tokens do not overlap: the
text gets a `▁` prefix and its spaces become `▁` (`add_space_prefix`,
`escape_whitespaces`), then the longest normal token is taken at each position, else the
byte tokens `<0xNN>` of the character (byte fallback), else `<unk>`; a BOS token first when
the vocabulary adds one. With `parse_special` the control tokens' texts in the input are
those tokens. Real SPM merges by score; for a byte-fallback vocabulary (the project's test
models) the result is the same.

Generation is filler: printable ASCII, one byte token per character, cut to the budget.
"""

from __future__ import annotations

import attrs

from gpugate_sim.llamaserver.model import ModelInfo

SPACE = "▁"
FILLER = "The quick brown fox jumps over the lazy dog. "
_NORMAL, _CONTROL, _BYTE = 1, 3, 6


@attrs.frozen
class Vocab:
    """The tokens of a model, indexed for tokenizing and detokenizing."""

    tokens: tuple[str, ...]
    normal: dict[str, int]
    special: dict[str, int]
    bytes_: dict[int, int]
    longest: int
    bos: int | None
    add_bos: bool
    unk: int

    def piece(self, token: int, special: bool = True) -> bytes:
        """`common_token_to_piece`: a byte token is its byte, a control token its text
        (when `special`), a normal token its text with `▁` as a space."""
        if not 0 <= token < len(self.tokens):
            return b""
        text = self.tokens[token]
        if text.startswith("<0x") and text.endswith(">") and len(text) == 6:
            return bytes([int(text[3:5], 16)])
        if text in self.special:
            return text.encode() if special else b""
        return text.replace(SPACE, " ").encode()


def vocab_of(model: ModelInfo) -> Vocab:
    normal: dict[str, int] = {}
    special: dict[str, int] = {}
    byte_tokens: dict[int, int] = {}
    for i, text in enumerate(model.tokens):
        if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            try:
                byte_tokens[int(text[3:5], 16)] = i
                continue
            except ValueError:
                pass
        if text.startswith("<") and text.endswith(">") and len(text) > 2:
            special[text] = i
        else:
            normal[text] = i
    longest = max((len(t) for t in normal), default=1)
    return Vocab(model.tokens, normal, special, byte_tokens, longest, model.bos,
                 model.add_bos, special.get("<unk>", 0))  # fmt: skip


def tokenize(vocab: Vocab, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
    """Token ids of `text`, with the BOS token first when `add_special` and the vocabulary
    adds one."""
    out: list[int] = []
    if add_special and vocab.add_bos and vocab.bos is not None:
        out.append(vocab.bos)
    segments = _split_special(vocab, text) if parse_special else [(text, None)]
    first = True
    for segment, token in segments:
        if token is not None:
            out.append(token)
            continue
        if not segment:
            continue
        # SPM adds the space prefix once, to the first text fragment only.
        escaped = (SPACE if first else "") + segment.replace(" ", SPACE)
        first = False
        out.extend(_spm(vocab, escaped))
    return out


def _split_special(vocab: Vocab, text: str) -> list[tuple[str, int | None]]:
    parts: list[tuple[str, int | None]] = []
    start = i = 0
    while i < len(text):
        match = next((s for s in vocab.special if s != "<unk>" and text.startswith(s, i)), None)
        if match is None:
            i += 1
            continue
        parts.append((text[start:i], None))
        parts.append(("", vocab.special[match]))
        i = start = i + len(match)
    parts.append((text[start:], None))
    return parts


def _spm(vocab: Vocab, text: str) -> list[int]:
    out: list[int] = []
    i = 0
    while i < len(text):
        for size in range(min(vocab.longest, len(text) - i), 0, -1):
            token = vocab.normal.get(text[i : i + size])
            if token is not None:
                out.append(token)
                i += size
                break
        else:
            for byte in text[i].encode():
                out.append(vocab.bytes_.get(byte, vocab.unk))
            i += 1
    return out


def detokenize(vocab: Vocab, tokens: list[int], special: bool = True) -> str:
    """`tokens_to_str`: the pieces' bytes joined, then read as UTF-8."""
    return b"".join(vocab.piece(t, special) for t in tokens).decode("utf-8", errors="replace")


def filler(n_tokens: int) -> list[str]:
    """The pieces of `n_tokens` generated tokens: printable ASCII, one character each."""
    return [FILLER[i % len(FILLER)] for i in range(n_tokens)]
