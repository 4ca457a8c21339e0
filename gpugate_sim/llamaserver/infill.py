"""/infill's request checks and prompt (tools/server/server-context.cpp `post_infill`,
server-common.cpp `format_prompt_infill`).

The prompt is tokens: `[extra context] BOS FIM_PRE prefix prompt FIM_SUF suffix FIM_MID`,
the prefix and suffix tokenized without parsing special tokens (each string with its own
`▁` space prefix, as every `common_tokenize` call gives one), the `prompt` field with them.
The prefix keeps its last 3/4 of a batch, the suffix its first quarter less the prompt; the
extra chunks (`input_extra`) fill what the context has left after a batch and twice
`n_predict`, which for the default batch of 2048 is nothing on a small context.
"""

from __future__ import annotations

from typing import Any

from gpugate_sim.llamaserver.framing import INVALID_REQUEST, ServerError
from gpugate_sim.llamaserver.text import Vocab, tokenize

N_BATCH = 2048
"""`--batch-size`'s default: the simulator does not take the option."""
CHUNK_PREFIX = "\n\n--- snippet ---\n\n"
"""What separates extra chunks when the vocabulary has no file-separator token."""
_FIM_NAMES = ("prefix", "suffix", "middle")


def missing_tokens(fim: tuple[int | None, ...]) -> str:
    """`post_infill`'s check: what the model lacks, empty when it can fill in."""
    pairs = zip(_FIM_NAMES, fim[:3], strict=True)
    return "".join(f"{name} token is missing. " for name, token in pairs if token is None)


def check_request(body: Any) -> tuple[str, str] | None:
    """The request errors `post_infill` answers before building the prompt (400), as
    (message, kind); None when there are none. (It sets an error for a missing prefix or
    suffix but does not return: the lookup of the missing field throws later, a 500.)"""
    if not isinstance(body, dict):
        return None
    extra = body.get("input_extra", [])
    if not isinstance(extra, list):
        message = '"input_extra" must be an array of {"filename": string, "text": string}'
        return message, INVALID_REQUEST
    for chunk in extra:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            message = 'extra_context chunk must contain a "text" field with a string value'
            return message, INVALID_REQUEST
        if "filename" in chunk and not isinstance(chunk["filename"], str):
            return 'extra_context chunk\'s "filename" field must be a string', INVALID_REQUEST
    return None


def infill_tokens(
    vocab: Vocab, fim: tuple[int | None, ...], body: Any, n_ctx: int, n_predict: int
) -> list[int]:
    """The prompt tokens `format_prompt_infill` builds; ServerError with nlohmann's message
    where the real server's JSON access throws."""
    if not isinstance(body, dict):
        if body is not None:  # `data["input_extra"] = ...` (null becomes an object)
            raise ServerError(
                "[json.exception.type_error.305] cannot use operator[] with a string "
                f"argument with {type_name(body)}"
            )
        body = {}
    prompt = body.get("prompt")
    prompt_tokens = tokenize(vocab, prompt if isinstance(prompt, str) else "",
                             add_special=False, parse_special=True)  # fmt: skip
    # the arguments are evaluated right to left: the suffix is looked up first
    suffix = _tokenize_mixed(vocab, _at(body, "input_suffix"))
    prefix = _tokenize_mixed(vocab, _at(body, "input_prefix"))
    pre, suf, mid, rep, sep = fim
    extra: list[int] = []
    if rep is not None:
        extra += [rep, *tokenize(vocab, "myproject\n", add_special=False, parse_special=False)]
    for chunk in body.get("input_extra", []):
        if sep is not None:
            name = str(chunk.get("filename", "tmp"))
            extra += [sep, *tokenize(vocab, name + "\n", add_special=False, parse_special=False)]
        else:
            extra += tokenize(vocab, CHUNK_PREFIX, add_special=False, parse_special=False)
        extra += tokenize(vocab, chunk["text"], add_special=False, parse_special=False)
    if sep is not None:
        extra += [sep, *tokenize(vocab, "filename\n", add_special=False, parse_special=False)]
    n_prefix = min(len(prefix), 3 * (N_BATCH // 4))
    n_suffix = min(len(suffix), max(0, N_BATCH // 4 - (2 + len(prompt_tokens))))
    n_extra = min(max(0, n_ctx - N_BATCH - 2 * n_predict), len(extra))
    head = [pre, *prefix[len(prefix) - n_prefix :], *prompt_tokens]
    tail = [suf, *suffix[:n_suffix]]
    bos = [vocab.bos] if vocab.add_bos and vocab.bos is not None else []
    tokens = extra[len(extra) - n_extra :] + bos + head + tail + [mid]
    return [t for t in tokens if t is not None]  # (prefix, suffix and middle are there)


def _at(body: dict[str, Any], key: str) -> Any:
    if key not in body:
        raise ServerError(f"[json.exception.out_of_range.403] key '{key}' not found")
    return body[key]


def _tokenize_mixed(vocab: Vocab, value: Any) -> list[int]:
    """`tokenize_mixed(vocab, value, false, false)`: a string, or an array of strings and
    token ids."""
    if not isinstance(value, list):
        if not isinstance(value, str):
            raise ServerError(
                f"[json.exception.type_error.302] type must be string, but is {type_name(value)}"
            )
        return tokenize(vocab, value, add_special=False, parse_special=False)
    tokens: list[int] = []
    for item in value:
        if isinstance(item, str):
            tokens += tokenize(vocab, item, add_special=False, parse_special=False)
        elif isinstance(item, int | float):
            tokens.append(int(item))
        else:
            raise ServerError(
                f"[json.exception.type_error.302] type must be number, but is {type_name(item)}"
            )
    return tokens


def type_name(value: Any) -> str:
    """nlohmann's `type_name()` of a parsed value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), "discarded")
