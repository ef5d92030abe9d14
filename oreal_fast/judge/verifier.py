"""HTTP client of the LLM verifier: any OpenAI-compatible chat server (lmdeploy, vLLM, ...).

What it does: `VerifierClient.grade(question, gold, text)` renders the verify prompt, posts it
to ``/v1/chat/completions`` of the next host (round-robin) with the official sampling
settings, and reads the grade from the reply. The model name is the first id of
``GET /v1/models`` on that host, fetched at its first use (so an unreachable host never
breaks the start of a run) and cached once known.

Reply protocol (official): a reply containing "A" and not "B" is correct, "B" and not "A"
is wrong, anything else is no grade. With ``accept_correct_incorrect`` the words
INCORRECT / CORRECT (whole words, any case) decide first, since the prompt itself says
"reply with CORRECT, INCORRECT" and the official parse reads neither as a grade.

What it does not: it makes no reward decision; a call that gets no grade after
``max_retries`` attempts returns None and the router turns that into -1.

Invariant: `grade` returns True, False or None and never raises, and never waits longer
than about attempts x (connect + read timeout) + the back-off delays.
"""

import http.client
import json
import logging
import re
import threading
import time

from oreal_fast.judge.settings import MathJudgerSettings, split_host

# Official request settings (reference 4.3).
SAMPLING = {
    "temperature": 0.0,
    "top_p": 0.8,
    "top_k": 20,
    "repetition_penalty": 1.05,
    "max_tokens": 100,
    "stop": ["<|im_end|>", "<|endoftext|>"],
}

log = logging.getLogger(__name__)

_INCORRECT = re.compile(r"\bINCORRECT\b", re.IGNORECASE)
_CORRECT = re.compile(r"\bCORRECT\b", re.IGNORECASE)


class VerifierError(Exception):
    """One attempt failed: transport error, HTTP error, or a reply without a grade."""


def parse_grade(reply: str, accept_correct_incorrect: bool) -> bool | None:
    """Grade of a verifier reply: True (correct), False (wrong), None (no grade)."""
    if accept_correct_incorrect:
        if _INCORRECT.search(reply):
            return False
        if _CORRECT.search(reply):
            return True
    has_a, has_b = "A" in reply, "B" in reply
    if has_a != has_b:
        return has_a
    return None


class VerifierClient:
    """Round-robin client over the hosts of one judger; safe to call from many threads.

    Args:
        settings: the judger's settings (hosts, timeouts, retries, prompt, reply switch).
        start: index of the first host; the official drew it with ``random.randint`` once.
    """

    def __init__(self, settings: MathJudgerSettings, start: int = 0) -> None:
        self.settings = settings
        self._hosts = [split_host(h) for h in settings.hosts]
        self._next = start
        self._models: dict[tuple[str, int], str] = {}
        self._lock = threading.Lock()

    def grade(self, question: str, gold_answer: str, text: str) -> bool | None:
        """Ask the verifier whether `text` (the whole post-processed response) answers right.

        Returns:
            True / False as graded, None when every attempt failed.
        """
        s = self.settings
        prompt = s.verify_prompt.format(question=question, gold_answer=gold_answer, answer=text)
        error: Exception | None = None
        for attempt in range(s.max_retries):
            if attempt:
                time.sleep(s.retry_delay_s * 2 ** (attempt - 1))
            try:
                return self._attempt(self._pick(), prompt)
            except Exception as e:  # VerifierError, or anything odd in a reply: no grade
                error = e
        log.warning("judger %s: no grade after %d attempt(s): %s", s.name, s.max_retries, error)
        return None

    def _pick(self) -> tuple[str, int]:
        with self._lock:
            host = self._hosts[self._next % len(self._hosts)]
            self._next += 1
        return host

    def _attempt(self, host: tuple[str, int], prompt: str) -> bool:
        model = self._model(host)
        body = {"model": model, "messages": [{"role": "user", "content": prompt}], **SAMPLING}
        reply = self._request(host, "POST", "/v1/chat/completions", body)
        try:
            content = reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise VerifierError("reply has no choices[0].message.content") from None
        grade = parse_grade(str(content), self.settings.accept_correct_incorrect)
        if grade is None:
            raise VerifierError(f"reply has no grade: {content!r:.80}")
        return grade

    def _model(self, host: tuple[str, int]) -> str:
        if host not in self._models:
            listing = self._request(host, "GET", "/v1/models", None)
            try:
                self._models[host] = str(listing["data"][0]["id"])
            except (KeyError, IndexError, TypeError):
                raise VerifierError("GET /v1/models lists no model") from None
        return self._models[host]

    def _request(self, host: tuple[str, int], method: str, path: str, body: dict | None) -> dict:
        s = self.settings
        conn = http.client.HTTPConnection(*host, timeout=s.connect_timeout_s)
        try:
            conn.connect()
            conn.sock.settimeout(s.read_timeout_s)
            data = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if data else {}
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
            if resp.status != 200:
                raise VerifierError(f"HTTP {resp.status} from {host[0]}:{host[1]}{path}")
            return json.loads(raw)
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise VerifierError(f"{host[0]}:{host[1]}{path}: {e}") from None
        finally:
            conn.close()
