"""A fault hook for the tests: an HTTP proxy in front of a real MinIO that
flips one byte of every GET response body for keys containing a marker.
Requests pass through unchanged (the Host header too, so SigV4 signatures
made for the proxy's address still verify at MinIO)."""

import http.client
import http.server
import threading

MARKER = "corrupt-me"


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream = ("127.0.0.1", 0)

    def log_message(self, *args):
        pass

    def _forward(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        connection = http.client.HTTPConnection(*self.upstream, timeout=60)
        headers = {k: v for k, v in self.headers.items()}
        connection.request(self.command, self.path, body=body, headers=headers)
        response = connection.getresponse()
        data = response.read()
        if self.command == "GET" and MARKER in self.path and response.status in (200, 206) and data:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        self.send_response(response.status, response.reason)
        for key, value in response.getheaders():
            if key.lower() not in ("transfer-encoding", "content-length", "connection"):
                self.send_header(key, value)
        # A HEAD announces the object's length without a body.
        announced = response.getheader("Content-Length") if self.command == "HEAD" else str(len(data))
        self.send_header("Content-Length", announced or "0")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        connection.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward


class CorruptingProxy:
    """Listens on a free loopback port; `endpoint` is its URL."""

    def __init__(self, upstream_port):
        handler = type("Handler", (_Handler,), {"upstream": ("127.0.0.1", upstream_port)})
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
