"""A scripted OpenAI-compatible server on 127.0.0.1 for the verifier tests.

The reply to a chat request is chosen by a marker in the rendered prompt ("REPLY=<kind>",
placed in the gold answer or the question), so one batch can mix every server behaviour.
"""

import http.server
import json
import re
import socket
import threading
import time

import pytest

MODEL_ID = "judge-model"
REPLIES = {"A": "A", "B": "B", "CORRECT": "CORRECT", "INCORRECT": "INCORRECT", "GARBAGE": "I cannot say."}


class ScriptedServer:
    """Serves GET /v1/models and POST /v1/chat/completions; records every chat body."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.release = threading.Event()  # set at teardown: hung handlers return
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(200, {"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.bodies.append(body)
                kind = re.search(r"REPLY=(\w+)", body["messages"][0]["content"]).group(1)
                if kind == "HANG":
                    owner.release.wait(60)
                    return
                if kind == "SLOW":
                    time.sleep(0.6)
                    kind = "A"
                if kind == "ERROR500":
                    self._send(500, {"error": "internal"})
                    return
                self._send(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": REPLIES[kind]}}]})

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.host = f"127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = ScriptedServer()
    yield s
    s.stop()


@pytest.fixture
def second_server():
    s = ScriptedServer()
    yield s
    s.stop()


@pytest.fixture
def refused_host():
    """host:port where nothing listens (a port just bound and released)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"127.0.0.1:{port}"
