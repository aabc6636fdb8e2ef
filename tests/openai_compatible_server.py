"""A small OpenAI-compatible HTTP server for the tests: it answers ``/v1/chat/completions`` from recorded
responses (``tests/data/openai_compatible/*.json``) and enforces the history rules the real APIs enforce.

- The recording is chosen by the request's ``model``; the response by how many assistant messages
  the request holds (turn ``n`` gets ``responses[n]``), so a client retry or a resumed thread gets the
  same answer again, as a deterministic server would.
- ``"stream": true`` gets server-sent events cut from the same response the way vLLM streams: a role
  chunk, then per tool call a chunk with its id (``null`` when the recording has none), name and empty
  arguments, then the arguments in pieces, the finish reason, a usage chunk if asked, ``[DONE]``.
- Before answering it checks the request's messages as OpenAI's API does and answers HTTP 400 with
  OpenAI's own error text when an assistant message's tool calls are not each answered by a tool message
  right after it, or a tool message answers no call of the assistant message before it.
- ``{{customer:N}}`` in a recorded argument stands for the N-th id the first user message names
  (``The customer ids: Acme Analytics = 17.``), as a model reads it from the prompt.
- ``GET /v1/models`` lists the recorded models.
- A recording may be given as a dict instead of a file name (shapes written for a test, not recorded).
  A response may be ``{"raw": TEXT, "content_type": TYPE}``, sent as it is (streamed or not), or
  ``{"attempts": [R0, R1, ...]}``: the k-th request of that turn gets ``R{k}`` (the last one from then on),
  for a client that asks again after a reply it could not read.

Every request body is kept in :attr:`RecordedServer.requests` (the history as the client sent it).
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Self

DATA = Path(__file__).parent / "data" / "openai_compatible"


def recording(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text())


def openai_history_errors(messages: list[dict]) -> list[str]:
    """The errors OpenAI's Chat Completions API gives a request's ``messages`` for tool calls (its texts),
    written from the API's behaviour, independent of the kit: each assistant ``tool_calls`` entry needs a
    string id and a ``tool`` message right after the assistant message (before any other role); a
    ``tool`` message must answer a call of the assistant message before its run of tool messages; no call
    id is answered twice."""
    errors: list[str] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        if m.get("role") == "tool":
            errors.append(f"Invalid parameter: messages with role 'tool' must be a response to a preceeding message "
                          f"with 'tool_calls' (messages.[{i}], tool_call_id {m.get('tool_call_id')!r}).")
            i += 1
            continue
        calls = (m.get("tool_calls") or []) if m.get("role") == "assistant" else []
        i += 1
        if not calls:
            continue
        ids = [c.get("id") for c in calls]
        for c in calls:
            if not isinstance(c.get("id"), str) or not c["id"]:
                errors.append(f"Invalid type for 'messages.[{i - 1}].tool_calls.id': expected a string, but got "
                              f"{json.dumps(c.get('id'))} instead.")
        answered: list[str] = []
        while i < len(messages) and messages[i].get("role") == "tool":
            tid = messages[i].get("tool_call_id")
            if tid not in ids:
                errors.append(f"Invalid parameter: messages with role 'tool' must be a response to a preceeding "
                              f"message with 'tool_calls' (messages.[{i}], tool_call_id {tid!r}).")
            elif tid in answered:
                errors.append(f"Duplicate tool message for tool_call_id {tid!r} (messages.[{i}]).")
            answered.append(tid)
            i += 1
        missing = [cid for cid in dict.fromkeys(ids) if cid not in answered]
        if missing:
            errors.append("An assistant message with 'tool_calls' must be followed by tool messages responding to "
                          "each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                          + ", ".join(map(str, missing)))
    return errors


def _sse_chunks(body: dict, include_usage: bool) -> list[dict]:
    choice = body["choices"][0]
    msg = choice["message"]
    base = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"], "model": body["model"]}

    def chunk(delta: dict, finish=None) -> dict:
        return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    out = [chunk({"role": "assistant", "content": ""})]
    content = msg.get("content") or ""
    for piece in _pieces(content, 12):
        out.append(chunk({"content": piece}))
    for i, tc in enumerate(msg.get("tool_calls") or []):
        out.append(chunk({"tool_calls": [{"index": i, "id": tc.get("id"), "type": "function",
                                          "function": {"name": tc["function"].get("name"), "arguments": ""}}]}))
        for piece in _pieces(tc["function"]["arguments"], 9):
            out.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}))
    out.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        out.append({**base, "choices": [], "usage": body.get("usage")})
    return out


def _pieces(value, size: int) -> list:
    """A text cut in pieces of ``size`` characters, as a server streams it; any other value in one piece."""
    if not isinstance(value, str):
        return [value]
    return [value[k:k + size] for k in range(0, len(value), size)]


class RecordedServer:
    """The server on ``127.0.0.1`` (a free port) in a daemon thread; a context manager.

    Args:
        names: the recordings to serve (file names under ``tests/data/openai_compatible`` without ``.json``,
            or recordings as dicts).
    """

    def __init__(self, *names: str | dict):
        self.recordings = {r["model"]: r for r in (n if isinstance(n, dict) else recording(n) for n in names)}
        self.requests: list[dict] = []
        self._served: dict[tuple[str, int], int] = {}  # (model, turn) -> requests answered
        self.rejected: list[list[str]] = []
        self.streamed = 0
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def answer(self, request: dict) -> tuple[int, dict | list[dict]]:
        with self._lock:
            self.requests.append(request)
        errors = openai_history_errors(request.get("messages", []))
        if errors:
            with self._lock:
                self.rejected.append(errors)
            return 400, {"error": {"message": errors[0], "type": "invalid_request_error", "param": "messages",
                                   "code": None}}
        rec = self.recordings.get(request.get("model"))
        if rec is None:
            return 404, {"error": {"message": f"The model `{request.get('model')}` does not exist.",
                                   "type": "NotFoundError", "param": None, "code": 404}}
        turn = sum(m.get("role") == "assistant" for m in request["messages"])
        if turn >= len(rec["responses"]):
            return 500, {"error": {"message": f"no recorded response for turn {turn}", "type": "test_server"}}
        body = rec["responses"][turn]
        if "attempts" in body:
            with self._lock:
                k = self._served[(rec["model"], turn)] = self._served.get((rec["model"], turn), -1) + 1
            body = body["attempts"][min(k, len(body["attempts"]) - 1)]
        if "raw" in body:
            return 200, body
        first_user = next((m.get("content") for m in request["messages"] if m.get("role") == "user"), "") or ""
        ids = re.findall(r"= (\d+)", first_user if isinstance(first_user, str) else json.dumps(first_user))
        if ids:  # {{customer:N}}: the N-th id the prompt names, as a model reads it
            text = json.dumps(body)
            for n, cid in enumerate(ids):
                text = text.replace(f"{{{{customer:{n}}}}}", cid)
            body = json.loads(text)
        if request.get("stream"):
            with self._lock:
                self.streamed += 1
            return 200, _sse_chunks(body, bool((request.get("stream_options") or {}).get("include_usage")))
        return 200, body

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, payload, *, sse: bool = False) -> None:
                if sse:
                    data = "".join(f"data: {json.dumps(c)}\n\n" for c in payload) + "data: [DONE]\n\n"
                    ctype = "text/event-stream"
                else:
                    data, ctype = json.dumps(payload), "application/json"
                raw = data.encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _send_raw(self, text: str, ctype: str) -> None:
                raw = text.encode()
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self):
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": m, "object": "model", "owned_by": "test"}
                                                               for m in server.recordings]})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                request = json.loads(self.rfile.read(length) or b"{}")
                if self.path != "/v1/chat/completions":
                    self._send(404, {"error": {"message": "not found"}})
                    return
                status, payload = server.answer(request)
                if isinstance(payload, dict) and "raw" in payload:
                    self._send_raw(payload["raw"], payload.get("content_type", "application/json"))
                    return
                self._send(status, payload, sse=status == 200 and bool(request.get("stream")))

        return Handler
