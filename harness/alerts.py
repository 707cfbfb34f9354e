"""A small webhook receiver that keeps what Alertmanager-format POSTs it was sent."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class AlertReceiver:
    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.posts: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.posts.append({"content_type": self.headers.get("Content-Type"), "path": self.path,
                                       "body": json.loads(body)})
                self.send_response(receiver.status)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alerts(self, name: str | None = None) -> list[dict]:
        return [alert for post in self.posts for alert in post["body"]["alerts"]
                if name is None or alert["labels"]["alertname"] == name]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
