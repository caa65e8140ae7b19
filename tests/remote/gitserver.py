"""Real Git servers on loopback for the remote tests: ``git daemon`` and smart HTTP.

``git daemon --enable=receive-pack`` serves a directory of bare repositories
over ``git://127.0.0.1:PORT/``; :class:`HttpGitServer` serves the same over
``http://127.0.0.1:PORT/`` by running ``git http-backend`` as a CGI program
for every request, from a small threaded HTTP server of the standard
library. Both listen on a free port chosen by the kernel, and both are
waited for by connecting (an event the test needs), never by sleeping.

Nothing is mocked: the client side is the real ``git`` that kxen-agent runs.
"""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

__all__ = ["GitDaemon", "HttpGitServer", "bare_repo", "wait_listening"]


def bare_repo(path: Path) -> Path:
    """A bare repository at ``path`` that accepts pushes over every transport."""
    subprocess.run(["git", "init", "-q", "--bare", str(path)], check=True)
    # git http-backend refuses receive-pack to an unauthenticated client
    # unless the repository says so; git daemon needs --enable=receive-pack.
    subprocess.run(["git", "-C", str(path), "config", "http.receivepack", "true"], check=True)
    return path


def wait_listening(port: int, proc: subprocess.Popen | None = None, timeout_s: float = 20.0) -> None:
    """Block until something accepts connections on 127.0.0.1:``port``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if proc is not None and proc.poll() is not None:
                raise AssertionError(f"server exited ({proc.returncode}) before listening on {port}") from None
            if time.monotonic() > deadline:
                raise AssertionError(f"nothing listens on 127.0.0.1:{port} after {timeout_s}s") from None
            time.sleep(0.02)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GitDaemon:
    """``git daemon`` serving every repository under ``base`` at ``git://127.0.0.1:PORT/NAME``."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = _free_port()
        self.proc = subprocess.Popen(
            ["git", "daemon", "--reuseaddr", "--export-all", "--enable=receive-pack", "--informative-errors",
             f"--base-path={base}", "--listen=127.0.0.1", f"--port={self.port}", str(base)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_listening(self.port, self.proc)

    def url(self, name: str) -> str:
        return f"git://127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=10)


class _CgiHandler(http.server.BaseHTTPRequestHandler):
    """Runs ``git http-backend`` for one request, as a web server's CGI gateway does."""

    server: "_Server"
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._cgi()

    def do_POST(self) -> None:
        self._cgi()

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            # git sends a large push as chunks; a CGI program reads a plain body.
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _cgi(self) -> None:
        path, _, query = self.path.partition("?")
        body = self._body()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": str(self.server.base),
            "GIT_HTTP_EXPORT_ALL": "1",
            "GIT_HTTP_MAX_REQUEST_BUFFER": str(1 << 30),
            "REQUEST_METHOD": self.command,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_ADDR": "127.0.0.1",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "GATEWAY_INTERFACE": "CGI/1.1",
        }
        if self.headers.get("Content-Encoding"):
            env["HTTP_CONTENT_ENCODING"] = self.headers["Content-Encoding"]
        if self.headers.get("Git-Protocol"):
            env["GIT_PROTOCOL"] = self.headers["Git-Protocol"]
        done = subprocess.run(["git", "http-backend"], input=body, capture_output=True, env=env)
        head, _, payload = done.stdout.partition(b"\r\n\r\n")
        if not _:
            head, _, payload = done.stdout.partition(b"\n\n")
        status = 200
        headers = []
        for line in head.decode("latin-1").splitlines():
            key, _, value = line.partition(":")
            if key.lower() == "status":
                status = int(value.strip().split()[0])
            elif key:
                headers.append((key, value.strip()))
        self.send_response(status)
        for key, value in headers:
            if key.lower() != "content-length":
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    base: Path


class HttpGitServer:
    """Smart HTTP: ``http://127.0.0.1:PORT/NAME`` for every repository under ``base``."""

    def __init__(self, base: Path) -> None:
        self.httpd = _Server(("127.0.0.1", 0), _CgiHandler)
        self.httpd.base = base
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="git-http", daemon=True)
        self.thread.start()
        wait_listening(self.port)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def git_ok() -> bool:
    return shutil.which("git") is not None
