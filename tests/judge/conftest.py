"""A scripted OpenAI-compatible server on 127.0.0.1 for the verifier tests.

The reply to a chat request is chosen by a marker in the rendered prompt ("REPLY=<kind>",
placed in the gold answer or the question), so one batch can mix every server behaviour.
The server records what it saw (bodies, requests in flight, requests the client gave up
on), so tests assert what happened, never how long it took.
"""

import http.server
import json
import re
import socket
import threading

import pytest

MODEL_ID = "judge-model"
REPLIES = {"A": "A", "B": "B", "CORRECT": "CORRECT", "INCORRECT": "INCORRECT", "GARBAGE": "I cannot say."}
# A safety limit, not a measurement: how long a GATE request waits for the rest of its group
# before the server gives up on it (HTTP 500) so that a broken test fails instead of hanging.
GATE_WAIT_S = 60.0


class ScriptedServer:
    """Serves GET /v1/models and POST /v1/chat/completions; records every chat body.

    Reply kinds besides REPLIES: ERROR500; HANG (never answers; returns once the client has
    closed the connection, counted in ``abandoned``); GATE (answers "A" once ``gate_size``
    GATE requests are in flight together, so it only succeeds if the client runs that many
    requests concurrently).
    """

    def __init__(self, gate_size: int = 1) -> None:
        self.bodies: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.abandoned = 0  # HANG requests whose client hung up first
        self.gate = threading.Barrier(gate_size)
        self.gate_wait_s = GATE_WAIT_S
        self.release = threading.Event()  # set at teardown: hung handlers return
        self._lock = threading.Lock()
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

            def _wait_for_hang_up(self) -> None:
                self.connection.settimeout(0.05)
                while not owner.release.is_set():
                    try:
                        if self.connection.recv(1) == b"":
                            with owner._lock:
                                owner.abandoned += 1
                            return
                    except socket.timeout:
                        continue
                    except OSError:
                        return

            def do_GET(self):
                self._send(200, {"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with owner._lock:
                    owner.bodies.append(body)
                    owner.in_flight += 1
                    owner.max_in_flight = max(owner.max_in_flight, owner.in_flight)
                try:
                    self._reply(re.search(r"REPLY=(\w+)", body["messages"][0]["content"]).group(1))
                finally:
                    with owner._lock:
                        owner.in_flight -= 1

            def _reply(self, kind: str) -> None:
                if kind == "HANG":
                    self._wait_for_hang_up()
                    return
                if kind == "GATE":
                    try:
                        owner.gate.wait(GATE_WAIT_S)
                        kind = "A"
                    except threading.BrokenBarrierError:
                        kind = "ERROR500"
                if kind == "ERROR500":
                    self._send(500, {"error": "internal"})
                    return
                self._send(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": REPLIES[kind]}}]})

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.host = f"127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def kinds(self) -> list[str]:
        """The REPLY kind of every chat request received, in arrival order."""
        return [re.search(r"REPLY=(\w+)", b["messages"][0]["content"]).group(1) for b in self.bodies]

    def stop(self) -> None:
        self.release.set()
        self.gate.abort()
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
def gated_server(request):
    """A server whose GATE replies need ``request.param`` requests in flight together."""
    s = ScriptedServer(gate_size=request.param)
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
