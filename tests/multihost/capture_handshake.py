"""One legitimate client handshake with a krug listener, recorded for the attack test.

    capture_handshake.py HOST PORT [--encrypt] < secret      (prints JSON on stdout)

Plays the client side of src/net/handshake.cc with the job secret (read from stdin, never from
the command line, where other users could see it): reads the server's 32-byte nonce frame,
answers with its own nonce and HMAC-SHA256(secret, "krug client" | server nonce | client nonce),
and checks the server's verdict and proof. It prints the bytes it sent after the nonce, as they
went on the wire ("client_bytes", hex), which the attacker later replays verbatim; the replay
must fail because the server's nonce is fresh on every connection.

Frames are a 4-byte little-endian length and the payload (src/net/socket.cc). Stdlib only.
When the handshake of src/net/handshake.cc changes, answer() below must follow it: the test
fails with the server's reason when this client no longer gets accepted.
"""
import hashlib
import hmac
import json
import os
import socket
import struct
import sys

NONCE = 32
MAX_HANDSHAKE_FRAME = 4096
# The labels of a plain handshake, and of an encrypting one (KRUG_ENCRYPT=1, --encrypt).
LABELS = {False: (b"krug client", b"krug server"),
          True: (b"krug client aes-256-gcm", b"krug server aes-256-gcm")}


def recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the server closed the connection")
        buf += chunk
    return buf


def recv_frame(sock):
    (n,) = struct.unpack("<I", recv_exact(sock, 4))
    if n > MAX_HANDSHAKE_FRAME:
        raise ConnectionError(f"a {n}-byte handshake frame")
    return recv_exact(sock, n)


def frame(payload):
    return struct.pack("<I", len(payload)) + payload


def proof(secret, label, first, second):
    return hmac.new(secret, label + first + second, hashlib.sha256).digest()


def answer(secret, server_nonce, client_nonce, encrypt):
    """The client's answer frame's payload (handshake.cc, authenticate_as_client)."""
    return client_nonce + proof(secret, LABELS[encrypt][0], server_nonce, client_nonce)


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    encrypt = "--encrypt" in sys.argv[3:]
    secret = sys.stdin.read().strip().encode()
    with socket.create_connection((host, port), timeout=10) as sock:
        server_nonce = recv_frame(sock)
        if len(server_nonce) != NONCE:
            raise SystemExit(f"expected a {NONCE}-byte nonce, got {len(server_nonce)} bytes")
        client_nonce = os.urandom(NONCE)
        sent = frame(answer(secret, server_nonce, client_nonce, encrypt))
        sock.sendall(sent)
        verdict = recv_frame(sock)
    accepted = verdict[:1] == b"\x01"
    proven = accepted and hmac.compare_digest(
        verdict[1:], proof(secret, LABELS[encrypt][1], client_nonce, server_nonce))
    json.dump({"client_bytes": sent.hex(), "accepted": accepted, "server_proved": proven,
               "verdict": verdict[1:].decode("latin-1") if not accepted else ""}, sys.stdout)


if __name__ == "__main__":
    main()
