"""llama.cpp's token-in ``POST /completion`` on real llama.cpp inference, for ``make test-real``
(TOK-2). Run with the interpreter that has ``llama-cpp-python`` (the llama.cpp venv), not
imported by the test suite: ``python llama_token_server.py MODEL.gguf``; it prints ``PORT <n>``.

llama-cpp-python's own server speaks only the OpenAI routes, so this serves llama.cpp server's
``/completion`` shape (``tools/server/server-task.cpp``, ``to_json_non_oaicompat``: a token-array
``prompt``; per token ``tokens`` and ``completion_probabilities[].logprob``; a last chunk with
``stop: true`` and ``stop_type``) over the llama.cpp library: greedy decoding, logprobs from the
model's logits. ``GET /turns`` returns every prompt it read and the ids it sampled.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
from llama_cpp import Llama  # type: ignore[import-not-found, unused-ignore]

LOCK = threading.Lock()  # one generation at a time: the model's context is shared
TURNS: list[dict[str, list[int]]] = []


def generate(llm: Any, prompt: list[int], n_predict: int) -> list[tuple[int, float]]:
    llm.reset()
    llm.eval(prompt)
    out: list[tuple[int, float]] = []
    for _ in range(n_predict):
        logits = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        logprobs = logits - (np.log(np.sum(np.exp(logits - logits.max()))) + logits.max())
        token = int(np.argmax(logits))
        out.append((token, float(logprobs[token])))
        if token == llm.token_eos():
            break
        llm.eval([token])
    return out


class Handler(BaseHTTPRequestHandler):
    llm: Any = None

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        body = json.dumps(TURNS).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = [int(t) for t in request["prompt"]]
        limit = int(request.get("n_predict") or 16)
        if limit < 0:
            limit = 16
        with LOCK:
            sampled = generate(self.llm, prompt, limit)
        TURNS.append({"prompt": prompt, "answer": [t for t, _ in sampled]})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for n, (token, logprob) in enumerate(sampled):
            piece = self.llm.detokenize([token]).decode("utf-8", errors="replace")
            self._event(
                {
                    "index": 0,
                    "content": piece,
                    "tokens": [token],
                    "stop": False,
                    "id_slot": 0,
                    "tokens_predicted": n + 1,
                    "tokens_evaluated": len(prompt),
                    "completion_probabilities": [
                        {
                            "id": token,
                            "token": piece,
                            "bytes": [],
                            "logprob": logprob,
                            "top_logprobs": [],
                        }
                    ],
                }
            )
        eos = bool(sampled) and sampled[-1][0] == self.llm.token_eos()
        self._event(
            {
                "index": 0, "content": "", "tokens": [], "id_slot": 0, "stop": True,
                "tokens_predicted": len(sampled), "tokens_evaluated": len(prompt),
                "stop_type": "eos" if eos else "limit",
                "timings": {"prompt_n": len(prompt), "cache_n": 0},
            }
        )  # fmt: skip

    def _event(self, data: dict[str, Any]) -> None:
        self.wfile.write(f"data: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()


def main(model: str) -> None:
    Handler.llm = Llama(model_path=model, n_ctx=2048, logits_all=True, verbose=False, seed=0)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1])
