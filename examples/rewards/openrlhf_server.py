"""A reward server speaking OpenRLHF's remote reward model protocol, as its
`openrlhf.cli.serve_rm` does: POST /get_reward with {"query": [...],
"prompts": [...], "labels": [...]} answers {"rewards": [...], "scores":
[...], "extra_logs": {...}}. Standard library only.

    python3 examples/rewards/openrlhf_server.py --port 5000

    [[reward.custom]]
    name = "judge"
    kind = "http"
    urls = ["http://127.0.0.1:5000/get_reward"]
"""

import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def get_reward(queries, prompts):
    """Here: how much of the answer is code rather than prose."""
    out = []
    for q, p in zip(queries, prompts):
        completion = q[len(p):] if q.startswith(p) else q
        lines = [l for l in completion.splitlines() if l.strip()]
        code = [l for l in lines if l.startswith((" ", "def ", "return", "import", "from", "class "))]
        out.append(len(code) / len(lines) if lines else 0.0)
    return out


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        if self.path.rstrip("/") != "/get_reward":
            self.send_error(404)
            return
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            data = json.loads(body)
            queries = data.get("query")
            prompts = data.get("prompts") or [""] * len(queries)
            rewards = get_reward(queries, prompts)
        except Exception as e:  # a bad request is the client's: 400 with why
            self.send_error(400, str(e))
            return
        reply = json.dumps({"rewards": rewards, "scores": rewards, "extra_logs": {"dummy_scores": rewards}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5000)
    args = ap.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print("serving /get_reward on http://%s:%d" % (args.host, server.server_address[1]), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
