"""The request types the simulated Ollama binds bodies into: every field of Ollama
v0.24.0's own (api/types.go, openai/openai.go), since a wrong type in any of them fails the
decode (binding.py)."""

from __future__ import annotations

from gpugate.sim.ollama.binding import GoType, Struct

GENERATE = Struct(
    "api.GenerateRequest",
    {
        "model": GoType.STRING,
        "prompt": GoType.STRING,
        "suffix": GoType.STRING,
        "system": GoType.STRING,
        "template": GoType.STRING,
        "context": GoType.INTS,
        "stream": GoType.BOOL_POINTER,
        "raw": GoType.BOOL,
        "format": GoType.RAW,
        "keep_alive": GoType.DURATION,
        "images": GoType.IMAGES,
        "options": GoType.OPTIONS,
        "think": GoType.THINK,
        "truncate": GoType.BOOL_POINTER,
        "shift": GoType.BOOL_POINTER,
        "_debug_render_only": GoType.BOOL,
        "logprobs": GoType.BOOL,
        "top_logprobs": GoType.INT,
        "width": GoType.INT32,
        "height": GoType.INT32,
        "steps": GoType.INT32,
    },
)
"""api/types.go GenerateRequest: every field, as each can fail the decode."""
CHAT = Struct(
    "api.ChatRequest",
    {
        "model": GoType.STRING,
        "messages": GoType.MESSAGES,
        "stream": GoType.BOOL_POINTER,
        "format": GoType.RAW,
        "keep_alive": GoType.DURATION,
        "tools": GoType.TOOLS,
        "options": GoType.OPTIONS,
        "think": GoType.THINK,
        "truncate": GoType.BOOL_POINTER,
        "shift": GoType.BOOL_POINTER,
        "_debug_render_only": GoType.BOOL,
        "logprobs": GoType.BOOL,
        "top_logprobs": GoType.INT,
    },
)
"""api/types.go ChatRequest (its embedded Tools is the field `tools`)."""
EMBED = Struct(
    "api.EmbedRequest",
    {
        "model": GoType.STRING,
        "input": GoType.ANY,
        "keep_alive": GoType.DURATION,
        "truncate": GoType.BOOL_POINTER,
        "dimensions": GoType.INT,
        "options": GoType.OPTIONS,
    },
)
EMBEDDINGS = Struct(
    "api.EmbeddingRequest",
    {
        "model": GoType.STRING,
        "prompt": GoType.STRING,
        "keep_alive": GoType.DURATION,
        "options": GoType.OPTIONS,
    },
)
CHAT_COMPLETION = Struct(
    "openai.ChatCompletionRequest",
    {
        "model": GoType.STRING,
        "messages": GoType.OPENAI_MESSAGES,
        "stream": GoType.BOOL,
        "stream_options": GoType.STREAM_OPTIONS,
        "max_tokens": GoType.INT_POINTER,
        "seed": GoType.INT_POINTER,
        "stop": GoType.ANY,
        "temperature": GoType.FLOAT_POINTER,
        "frequency_penalty": GoType.FLOAT_POINTER,
        "presence_penalty": GoType.FLOAT_POINTER,
        "top_p": GoType.FLOAT_POINTER,
        "response_format": GoType.RESPONSE_FORMAT,
        "tools": GoType.TOOLS,
        "reasoning": GoType.REASONING,
        "reasoning_effort": GoType.STRING_POINTER,
        "logprobs": GoType.BOOL_POINTER,
        "top_logprobs": GoType.INT,
        "_debug_render_only": GoType.BOOL,
    },
)
"""openai/openai.go ChatCompletionRequest: every field, as each can fail the decode."""
COMPLETION = Struct(
    "openai.CompletionRequest",
    {
        "model": GoType.STRING,
        "prompt": GoType.STRING,
        "frequency_penalty": GoType.FLOAT32,
        "max_tokens": GoType.INT_POINTER,
        "presence_penalty": GoType.FLOAT32,
        "seed": GoType.INT_POINTER,
        "stop": GoType.ANY,
        "stream": GoType.BOOL,
        "stream_options": GoType.STREAM_OPTIONS,
        "temperature": GoType.FLOAT32_POINTER,
        "top_p": GoType.FLOAT32,
        "suffix": GoType.STRING,
        "logprobs": GoType.INT_POINTER,
        "_debug_render_only": GoType.BOOL,
    },
)
EMBEDDING = Struct(
    "openai.EmbedRequest",
    {
        "input": GoType.ANY,
        "model": GoType.STRING,
        "dimensions": GoType.INT,
        "encoding_format": GoType.STRING,
    },
)
