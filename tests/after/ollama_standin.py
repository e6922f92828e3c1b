"""A stand-in for an Ollama server (none can be installed here: no release or Go module proxy is reachable), for the
routes Create in Ollama uses, with the checks Ollama's own server makes (ollama/ollama server/routes.go, create.go):

  GET  /api/tags               the models held
  HEAD /api/blobs/<digest>     200 when the blob is held, 404 otherwise
  POST /api/blobs/<digest>     the body stored when its sha256 is the digest ("digest mismatch" otherwise), 201
  POST /api/create             {model, files: {name: digest}, template, parameters, system}: a valid name, valid
                               file paths, each digest uploaded, each file a GGUF (read with the `gguf` package's
                               reader); streams {"status"} lines ending in "success", as Ollama does
  POST /api/show               {model}: its template, parameters, system and files as created

It listens on 127.0.0.1 at a free port; `requests` records every request in order.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

DIGEST = re.compile(r"^sha256[:-][0-9a-f]{64}$")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,79}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,79})?$")  # model.ParseName's parts
VERSION = "0.13.0-standin"


class OllamaStandIn:
    def __init__(self, blobs_dir: Path):
        self.blobs_dir = Path(blobs_dir)
        self.blobs_dir.mkdir(parents=True, exist_ok=True)
        self.models: dict[str, dict] = {}
        self.requests: list[tuple[str, str]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, name="ollama-standin", daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def blob(self, digest: str) -> Path:
        return self.blobs_dir / digest.replace(":", "-")

    def _handler(self):
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet: the test reads `requests`
                pass

            def _json(self, status: int, body: dict | None = None) -> None:
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while size := int(self.rfile.readline().strip() or b"0", 16):
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                    self.rfile.readline()
                    return b"".join(chunks)
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def do_GET(self):
                standin.requests.append(("GET", self.path))
                if self.path == "/api/tags":
                    return self._json(200, {"models": [m["listed"] for m in standin.models.values()]})
                if self.path == "/api/version":
                    return self._json(200, {"version": VERSION})
                return self._json(404, {"error": "404 page not found"})

            def do_HEAD(self):
                standin.requests.append(("HEAD", self.path))
                digest = self.path.removeprefix("/api/blobs/")
                self._json(200 if DIGEST.match(digest) and standin.blob(digest).is_file() else 404)

            def do_POST(self):
                standin.requests.append(("POST", self.path))
                body = self._body()
                if self.path.startswith("/api/blobs/"):
                    return self._blob(self.path.removeprefix("/api/blobs/"), body)
                try:
                    request = json.loads(body or b"{}")
                except ValueError as exc:
                    return self._json(400, {"error": str(exc)})
                if self.path == "/api/create":
                    return self._create(request)
                if self.path == "/api/show":
                    model = standin.models.get(request.get("model", ""))
                    if model is None:
                        return self._json(404, {"error": f"model '{request.get('model')}' not found"})
                    return self._json(200, model["shown"])
                return self._json(404, {"error": "404 page not found"})

            def _blob(self, digest: str, body: bytes) -> None:
                if not DIGEST.match(digest):
                    return self._json(400, {"error": "invalid digest format"})
                got = "sha256:" + hashlib.sha256(body).hexdigest()
                if got != digest.replace("-", ":", 1):
                    return self._json(400, {"error": f'digest mismatch, expected "{digest}", got "{got}"'})
                standin.blob(digest).write_bytes(body)
                self._json(201)

            def _create(self, request: dict) -> None:
                import sys

                from tunedeck.backend.after import gguf_tools

                # llama.cpp's own gguf-py, kept beside its converter (the `gguf` package is not installed)
                gguf_py = str(gguf_tools.converter(fetch=False) / "gguf-py")
                if gguf_py not in sys.path:  # once, not at every create
                    sys.path.insert(0, gguf_py)
                from gguf import GGUFReader

                name = request.get("model") or request.get("name") or ""
                if not NAME.match(name):
                    return self._json(400, {"error": "invalid model name"})
                files = request.get("files") or {}
                if not files:
                    return self._json(400, {"error": "neither 'from' or 'files' was specified"})
                for path, digest in files.items():
                    if path.startswith("/") or ".." in path.split("/") or not DIGEST.match(digest or ""):
                        return self._json(
                            400, {"error": "file path must be relative" if digest else "invalid digest format"}
                        )
                    if not standin.blob(digest).is_file():
                        return self._json(400, {"error": f"open {standin.blob(digest)}: no such file or directory"})
                lines = [{"status": "parsing GGUF"}]
                architectures = []
                for digest in files.values():
                    reader = GGUFReader(standin.blob(digest))  # raises on anything but a GGUF, as Ollama refuses it
                    field = reader.fields["general.architecture"]
                    architectures.append(bytes(field.parts[field.data[0]]).decode())
                    lines.append({"status": f"using existing layer {digest}"})
                parameters = request.get("parameters") or {}
                standin.models[name] = {
                    "listed": {
                        "name": name,
                        "model": name,
                        "size": sum(standin.blob(d).stat().st_size for d in files.values()),
                        "digest": hashlib.sha256(name.encode()).hexdigest(),
                        "details": {"format": "gguf", "family": architectures[0]},
                    },
                    "shown": {
                        "template": request.get("template") or "",
                        "system": request.get("system") or "",
                        "parameters": "\n".join(
                            f"{k} {json.dumps(v)}"
                            for k, vs in parameters.items()
                            for v in (vs if isinstance(vs, list) else [vs])
                        ),
                        "details": {"format": "gguf", "family": architectures[0]},
                    },
                    "request": request,
                }
                lines += [{"status": "writing manifest"}, {"status": "success"}]
                if request.get("stream") is False:
                    return self._json(200, lines[-1])
                data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-ndjson")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
