-- A small non-streaming generate request, as a chat client sends it.
wrk.method = "POST"
wrk.body = '{"model":"bench","prompt":"hi","stream":false}'
wrk.headers["Content-Type"] = "application/json"
