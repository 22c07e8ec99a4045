"""Issue 42 items 8, 9 and 11, adversarial: what a receiver answers cannot take the sender over.

* ``reply``: a receiver answers 500 with a 400 MiB body; prints this process's peak RSS before and
  after one delivery attempt (gpumon.alerts.http_post.post_json) and how much of the body was taken.
* ``redirect``: a local server answers every POST with 301, 302 or 303 pointing at a real Alertmanager
  (Debian's prometheus-alertmanager); a gpumon sender delivers one alert through it. Prints what the
  sender counted (sent / failed), its last_error, and how many alerts the Alertmanager holds.
* ``fifo``: a TLS receiver, ``ca_file`` a FIFO at first; prints whether the sender thread answered
  (and how), then, after the FIFO is replaced by the CA, how long until the alert is delivered.

    PYTHONPATH=$PWD python scripts/adversary_receiver_replies.py reply
    PYTHONPATH=$PWD python scripts/adversary_receiver_replies.py redirect
    PYTHONPATH=$PWD python scripts/adversary_receiver_replies.py fifo
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import ssl
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpumon.alerts.config import ReceiverHttp, RetryConfig
from gpumon.alerts.http_post import new_session, post_json
from gpumon.alerts.notification import Notification
from gpumon.alerts.notify import Receiver
from tests.alerts.helpers import TestReceiver, run_alertmanager
from tests.pki import make_pki

HUGE = 400 * 1024 * 1024


def serve(reply: object) -> str:
    """A TCP server on 127.0.0.1 calling ``reply(conn, method, path)`` for each request head; its URL."""
    sock = socket.create_server(("127.0.0.1", 0))

    def loop() -> None:
        while True:
            conn, _ = sock.accept()
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    head += chunk
                if not head:
                    continue
                method, path = head.decode("latin-1").split(" ", 2)[:2]
                with contextlib.suppress(OSError):
                    reply(conn, method, path)  # type: ignore[operator]

    threading.Thread(target=loop, daemon=True).start()
    return f"http://127.0.0.1:{sock.getsockname()[1]}"


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reply_case() -> None:
    sent = [0]

    def huge(conn: socket.socket, method: str, path: str) -> None:
        if sent[0] < 0:  # the warm-up: a small reply
            conn.sendall(b"HTTP/1.1 500 Oops\r\nContent-Length: 2\r\n\r\nno")
            return
        conn.sendall(f"HTTP/1.1 500 Oops\r\nContent-Length: {HUGE}\r\n\r\n".encode())
        block = b"x" * (1 << 20)
        while sent[0] < HUGE:
            conn.sendall(block)
            sent[0] += len(block)

    url = serve(huge)
    sent[0] = -1
    post_json(new_session(), url, [{"labels": {}}], 60.0, time.time())  # warm: requests loaded
    sent[0] = 0
    before = rss_mib()
    start = time.monotonic()
    result = post_json(new_session(), url, [{"labels": {}}], 60.0, time.time())
    print(
        f"400 MiB reply: outcome {result.outcome}, peak RSS {before:.0f} -> {rss_mib():.0f} MiB, "
        f"{time.monotonic() - start:.2f} s, server got {sent[0] / 2**20:.0f} MiB out before the close"
    )


def redirect_case() -> None:
    with tempfile.TemporaryDirectory() as tmp, run_alertmanager(Path(tmp)) as am:
        for code in (301, 302, 303):

            def moved(conn: socket.socket, method: str, path: str, code: int = code) -> None:
                conn.sendall(
                    f"HTTP/1.1 {code} Moved\r\nLocation: {am.url}{path}\r\nContent-Length: 0\r\n"
                    "Connection: close\r\n\r\n".encode()
                )

            url = serve(moved)
            receiver = Receiver("alertmanager", url, RetryConfig(0.05, 0.2, 5.0), 100, 240.0)
            receiver.enqueue(
                Notification(f"fp{code}", "firing", {"alertname": f"Redirected{code}"}, {}, time.time()), time.time()
            )
            receiver.start()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and sum(receiver.stats.outcomes[k] for k in ("sent", "failed")) < 3:
                time.sleep(0.05)
            receiver.stop(2)
            held = [a for a in am.alerts() if a["labels"].get("alertname") == f"Redirected{code}"]
            print(
                f"HTTP {code} to a real Alertmanager: sent {receiver.stats.outcomes['sent']}, "
                f"failed {receiver.stats.outcomes['failed']}, queued {receiver.queue_length()}, "
                f"Alertmanager holds {len(held)}; last_error: {receiver.stats.last_error!r}"
            )


def fifo_case() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        pki = make_pki(Path(tmp))
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(pki.server_cert, pki.server_key)
        target = TestReceiver().start(tls=tls)
        ca = Path(tmp) / "ca-as-fifo.pem"
        os.mkfifo(ca)
        receiver = Receiver(
            "webhook", target.url, RetryConfig(0.2, 1.0, 5.0), 100, 240.0, http=ReceiverHttp(ca_file=str(ca))
        )
        receiver.enqueue(Notification("fp", "firing", {"alertname": "ViaFifo"}, {}, time.time()), time.time())
        receiver.start()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and receiver.stats.outcomes["failed"] == 0:
            time.sleep(0.05)
        print(
            f"ca_file a FIFO: after {15 - (deadline - time.monotonic()):.1f} s failed "
            f"{receiver.stats.outcomes['failed']} (0: the sender thread is blocked), sender "
            f"{receiver.health().state}, last_error {receiver.stats.last_error!r}"
        )
        ca.unlink()
        ca.write_bytes(pki.ca.read_bytes())
        fixed = time.monotonic()
        deadline = fixed + 30
        while time.monotonic() < deadline and not target.alerts():
            time.sleep(0.05)
        took = f"{time.monotonic() - fixed:.2f} s" if target.alerts() else "NOT within 30 s"
        print(f"ca_file fixed: the alert delivered after {took}; sent {receiver.stats.outcomes['sent']}")
        receiver.stop(1)
        if target.alerts():
            target.stop()
        else:
            os._exit(0)  # the blocked sender thread would keep the receiver's shutdown waiting


if __name__ == "__main__":
    {"reply": reply_case, "redirect": redirect_case, "fifo": fifo_case}[sys.argv[1]]()
