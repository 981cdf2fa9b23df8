"""A stand-in served teacher for client tests: replays recorded JSON responses over real HTTP on 127.0.0.1.

  python tests/replay_server.py --responses=FILE.json [--max_requests=N]

FILE maps "METHOD /path" to {"status": code, "body": json} (or a list of them, answered in turn, the last one
repeated); an answer with "cut": true announces its whole body but sends half of it and closes the connection,
as a server killed mid-answer does. Prints "serving replay at http://127.0.0.1:PORT/v1" once it listens on a
free port, answers at most N requests (a bounded loop), then exits; the test stops it either way, and it stops
itself once the process that started it is gone (opd_jax/serving/processes.py: exit_with_parent).
"""

import argparse
import http.server
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from opd_jax.serving.processes import exit_with_parent  # noqa: E402


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--responses", required=True)
  parser.add_argument("--max_requests", type=int, default=50)
  args = parser.parse_args()
  with open(args.responses) as f:
    table = json.load(f)
  served = {key: 0 for key in table}

  class Handler(http.server.BaseHTTPRequestHandler):
    def _answer(self, method):
      length = int(self.headers.get("Content-Length") or 0)
      self.rfile.read(length)
      key = f"{method} {self.path}"
      answers, cut = table.get(key), False
      if answers is None:
        status, body = 404, {"object": "error", "message": f"no recorded answer for {key}"}
      else:
        answers = answers if isinstance(answers, list) else [answers]
        answer = answers[min(served[key], len(answers) - 1)]
        served[key] += 1
        status, body = answer.get("status", 200), answer["body"]
        cut = answer.get("cut", False)
      raw = json.dumps(body).encode()
      self.send_response(status)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(raw)))
      self.end_headers()
      self.wfile.write(raw[:len(raw) // 2] if cut else raw)
      if cut:
        self.close_connection = True

    def do_GET(self):
      self._answer("GET")

    def do_POST(self):
      self._answer("POST")

    def log_message(self, *args):
      pass

  server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
  exit_with_parent(poll_s=0.2)
  print(f"serving replay at http://127.0.0.1:{server.server_address[1]}/v1", file=sys.stderr, flush=True)
  for _ in range(args.max_requests):
    server.handle_request()
  server.server_close()


if __name__ == "__main__":
  main()
