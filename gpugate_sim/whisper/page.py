# ruff: noqa: E501  (the page's own lines, kept as they are)
"""The page whisper-server serves at `/` when its `--public` directory has no index.html.

The text of `default_content` in server.cpp's `main` (v1.9.3), byte for byte: 2,130 bytes
with the default paths and a four-digit port.
"""

from __future__ import annotations

_PAGE = """
    <html>
    <head>
        <title>Whisper.cpp Server</title>
        <meta charset="utf-8">
        <meta name="viewport" content="width=device-width">
        <style>
        body {{
            font-family: sans-serif;
        }}
        form {{
            display: flex;
            flex-direction: column;
            align-items: flex-start;
        }}
        label {{
            margin-bottom: 0.5rem;
        }}
        input, select {{
            margin-bottom: 1rem;
        }}
        button {{
            margin-top: 1rem;
        }}
        </style>
    </head>
    <body>
        <h1>Whisper.cpp Server</h1>

        <h2>{path}</h2>
        <pre>
    curl 127.0.0.1:{port}{path} \\
    -H "Content-Type: multipart/form-data" \\
    -F file="@&lt;file-path&gt;" \\
    -F temperature="0.0" \\
    -F temperature_inc="0.2" \\
    -F no_speech_thold="0.6" \\
    -F response_format="json"
        </pre>

        <h2>/load</h2>
        <pre>
    curl 127.0.0.1:{port}/load \\
    -H "Content-Type: multipart/form-data" \\
    -F model="&lt;path-to-model-file&gt;"
        </pre>

        <div>
            <h2>Try it out</h2>
            <form action="{path}" method="POST" enctype="multipart/form-data">
                <label for="file">Choose an audio file:</label>
                <input type="file" id="file" name="file" accept="audio/*" required><br>

                <label for="temperature">Temperature:</label>
                <input type="number" id="temperature" name="temperature" value="0.0" step="0.01" placeholder="e.g., 0.0"><br>

                <label for="response_format">Response Format:</label>
                <select id="response_format" name="response_format">
                    <option value="verbose_json">Verbose JSON</option>
                    <option value="json">JSON</option>
                    <option value="text">Text</option>
                    <option value="srt">SRT</option>
                    <option value="vtt">VTT</option>
                </select><br>

                <button type="submit">Submit</button>
            </form>
        </div>
    </body>
    </html>
    """


def default_content(port: int, path: str) -> str:
    """The page for a server on `port` whose inference route is `path` (request path included)."""
    return _PAGE.format(port=port, path=path)
