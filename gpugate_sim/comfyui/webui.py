"""The page served at `/`: a small stand-in for ComfyUI's frontend.

Like the real frontend it keeps its client id in sessionStorage, opens `<base>/ws` with it,
sends its feature flags first, shows `status` live, queues through `<base>/api/prompt` with
its `client_id`, and falls back to polling `api/prompt` when the socket is down.
"""

INDEX_HTML = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>ComfyUI</title>
<style>
body { font: 14px sans-serif; background: #202020; color: #ddd; margin: 2em; }
#log { font: 12px monospace; white-space: pre-wrap; max-height: 24em; overflow: auto; }
img { max-width: 256px; margin: 4px; border: 1px solid #444; }
</style>
</head>
<body>
<h1>ComfyUI</h1>
<p>Socket: <span id="socket">connecting</span> &middot;
   Queue remaining: <span id="queue">?</span> &middot;
   Executing: <span id="executing">-</span> &middot;
   Progress: <span id="progress">-</span></p>
<p><button id="queue-button">Queue a blank image</button></p>
<div id="images"></div>
<div id="log"></div>
<script>
(function () {
  const base = location.pathname.replace(/[^/]*$/, "");
  const api = (route) => base + "api" + route;
  const $ = (id) => document.getElementById(id);
  let clientId = sessionStorage.getItem("clientId");
  let socket = null;
  let poll = null;

  function log(line) {
    const el = $("log");
    el.textContent = line + "\\n" + el.textContent.slice(0, 20000);
  }
  function setQueue(status) {
    $("queue").textContent = status.exec_info.queue_remaining;
  }
  function show(output) {
    for (const image of (output && output.images) || []) {
      const img = document.createElement("img");
      const q = new URLSearchParams({filename: image.filename, subfolder: image.subfolder,
                                     type: image.type});
      img.src = api("/view?" + q);
      $("images").prepend(img);
    }
  }
  function startPolling() {
    if (poll) return;
    poll = setInterval(async () => {
      try { setQueue(await (await fetch(api("/prompt"))).json()); } catch (e) {}
    }, 1000);
  }
  function connect() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const query = clientId ? "?clientId=" + encodeURIComponent(clientId) : "";
    socket = new WebSocket(scheme + "//" + location.host + base + "ws" + query);
    socket.binaryType = "arraybuffer";
    socket.onopen = () => {
      $("socket").textContent = "open";
      clearInterval(poll); poll = null;
      socket.send(JSON.stringify({type: "feature_flags",
                                  data: {supports_preview_metadata: true}}));
    };
    socket.onclose = () => {
      $("socket").textContent = "closed";
      startPolling();
      setTimeout(connect, 300);
    };
    socket.onmessage = (event) => {
      if (typeof event.data !== "string") {
        const view = new DataView(event.data);
        log("binary event " + view.getUint32(0) + " (" + event.data.byteLength + " bytes)");
        return;
      }
      const msg = JSON.parse(event.data);
      log(msg.type + " " + JSON.stringify(msg.data));
      switch (msg.type) {
        case "status":
          if (msg.data.sid) {
            clientId = msg.data.sid;
            sessionStorage.setItem("clientId", clientId);
          }
          setQueue(msg.data.status);
          break;
        case "executing":
          $("executing").textContent = msg.data.node === null ? "-" : msg.data.node;
          break;
        case "progress":
          $("progress").textContent = msg.data.value + "/" + msg.data.max;
          break;
        case "executed":
          show(msg.data.output);
          break;
      }
    };
  }
  $("queue-button").onclick = async () => {
    const prompt = {
      "1": {class_type: "EmptyImage", inputs: {width: 64, height: 64, batch_size: 1,
                                               color: Math.floor(Math.random() * 0xffffff)}},
      "2": {class_type: "SaveImage", inputs: {images: ["1", 0], filename_prefix: "ComfyUI"}},
    };
    const resp = await fetch(api("/prompt"), {
      method: "POST", headers: {"Content-Type": "application/json"},
      body: JSON.stringify({client_id: clientId, prompt: prompt}),
    });
    log("queued: " + resp.status + " " + await resp.text());
  };
  connect();
})();
</script>
</body>
</html>
"""
