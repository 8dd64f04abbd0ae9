"""A fake OpenAI-compatible server on loopback, for the policy sync's checks: it serves
"weights" that are just next-token log-prob vectors, one per served name.

`GET /v1/models`, `POST /v1/load_lora_adapter` (the weights are the folder's probe.json
log-probs, shifted by `noise` nats: another dtype), `POST /v1/unload_lora_adapter`, and
`POST /v1/completions` answering one greedy token with its top log-probs. With
`ignore_loads` it answers a load with 200 and lists the new name, but keeps serving the
weights it had: the failure the probe exists to catch.
"""

from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class FakeServer:
    def __init__(self, base: list[float], ignore_loads: bool = False, noise: float = 0.0):
        self.weights: dict[str, list[float]] = {"base": base}
        self.current = base  # what an ignored load leaves served
        self.ignore_loads = ignore_loads
        self.noise = noise

    def load(self, name: str, path: str) -> None:
        if not self.ignore_loads:
            logprobs = json.loads((Path(path) / "probe.json").read_text())["logprobs"]
            self.current = [lp + self.noise for lp in logprobs]
        self.weights[name] = self.current

    def complete(self, body: dict) -> dict:
        logprobs = self.weights[body["model"]]
        top = sorted(range(len(logprobs)), key=lambda t: -logprobs[t])[: body.get("logprobs", 1)]
        return {"model": body["model"], "choices": [{"index": 0, "text": "", "logprobs": {
            "tokens": [f"token_id:{top[0]}"], "token_logprobs": [logprobs[top[0]]],
            "top_logprobs": [{f"token_id:{t}": logprobs[t] for t in top}],
        }}]}  # fmt: skip


def _handler(fake: FakeServer):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def _send(self, status: int, body: dict | str) -> None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/v1/models":
                self._send(200, {"data": [{"id": n} for n in fake.weights]})
            else:
                self._send(404, "not found")

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/v1/load_lora_adapter":
                fake.load(body["lora_name"], body["lora_path"])
                self._send(200, "Success")
            elif self.path == "/v1/unload_lora_adapter":
                fake.weights.pop(body["lora_name"], None)
                self._send(200, "Success")
            elif self.path == "/v1/completions" and body["model"] in fake.weights:
                self._send(200, fake.complete(body))
            else:
                self._send(404, "not found")

    return Handler


@contextlib.contextmanager
def fake_server(fake: FakeServer):
    """Serve `fake` on a free loopback port; yields its base URL (…/v1)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
