"""krug.common.messages, the authenticated channel between krug.spark's tasks and its driver:
both sides prove the job secret before a message is read or unpickled, within a deadline and in
bounded frames."""

import os
import socket
import struct
import threading
import time

import pytest

from krug.common import messages


@pytest.fixture
def server():
    s = messages.MessageServer("the-secret")
    yield s
    s.close()


def test_messages_flow_both_ways_after_the_handshake(server):
    client = messages.MessageClient("127.0.0.1", server.port, "the-secret")
    client.send("hello", "k1", 7)
    assert server.queue.get(timeout=10) == ("hello", "k1", 7)
    assert server.reply("k1", "go", [1, 2])
    assert client.receive(10) == ("go", [1, 2])
    client.close()


def test_a_wrong_secret_is_refused_and_nothing_it_sends_is_read(server):
    with pytest.raises(ConnectionError, match="refused this worker's proof"):
        messages.MessageClient("127.0.0.1", server.port, "not-the-secret")
    client = messages.MessageClient("127.0.0.1", server.port, "the-secret")
    client.send("after", 1)
    assert server.queue.get(timeout=10) == ("after", 1)  # nothing of the refused one
    client.close()


def impostor_driver(accept_anyone_secret):
    """A listener that speaks the handshake with its own secret and would send a pickle."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = listener.accept()
        with conn:
            server_nonce = os.urandom(32)
            messages._send(conn, server_nonce)
            answer = messages._recv(conn)
            server_label = messages._LABELS[False][1]
            messages._send(conn, messages._proof(accept_anyone_secret, server_label,
                                                 answer[:32], server_nonce))
            time.sleep(1)

    threading.Thread(target=serve, daemon=True).start()
    return listener


def test_a_server_that_cannot_prove_the_secret_is_not_trusted():
    listener = impostor_driver("a-guess")
    with listener:
        with pytest.raises(ConnectionError, match="could not prove the job secret"):
            messages.MessageClient("127.0.0.1", listener.getsockname()[1], "the-secret")


def test_a_huge_length_prefix_before_the_handshake_is_refused_without_reading_it(server):
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        messages._recv(sock)  # the server's nonce
        sock.sendall(struct.pack("!I", 0xFFFFFFF0))
        sock.settimeout(10)
        assert sock.recv(1) == b""  # closed at once, without waiting for 4 GB
    client = messages.MessageClient("127.0.0.1", server.port, "the-secret")
    client.send("still", "serving")
    assert server.queue.get(timeout=10) == ("still", "serving")
    client.close()


def test_a_silent_peer_is_dropped_after_the_handshake_deadline(server, monkeypatch):
    monkeypatch.setattr(messages, "_HANDSHAKE_SECONDS", 0.2)
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        messages._recv(sock)
        sock.settimeout(10)
        assert sock.recv(1) == b""  # the server gave up on us


# ---- KRUG_ENCRYPT=1: the channel seals every message after the handshake (AES-256-GCM).

def test_an_encrypted_channel_flows_both_ways_and_hides_its_messages():
    pytest.importorskip("cryptography")
    listener = socket.create_server(("127.0.0.1", 0))
    seen = {}

    def serve():
        conn, _ = listener.accept()
        with conn:
            channel = messages._handshake_as_server(conn, "the-secret", True)
            raw = messages._recv_exact(conn, 4)
            raw += messages._recv_exact(conn, struct.unpack("!I", raw)[0])
            seen["wire"] = raw
            channel.send(conn, b"reply")

    threading.Thread(target=serve, daemon=True).start()
    with listener:
        client = messages.MessageClient("127.0.0.1", listener.getsockname()[1], "the-secret",
                                        encrypt=True)
        client.send("gradients of layer 7", 0.125)
        assert client._channel.recv(client._sock) == b"reply"
        client.close()
    assert b"gradients" not in seen["wire"] and b"layer" not in seen["wire"]

    server = messages.MessageServer("the-secret", encrypt=True)
    try:
        client = messages.MessageClient("127.0.0.1", server.port, "the-secret", encrypt=True)
        client.send("hello", "k1", 7)
        assert server.queue.get(timeout=10) == ("hello", "k1", 7)
        assert server.reply("k1", "go", [1, 2])
        assert client.receive(10) == ("go", [1, 2])
        client.close()
    finally:
        server.close()


def test_ends_that_disagree_about_encryption_are_refused():
    pytest.importorskip("cryptography")
    for server_encrypts in (True, False):
        server = messages.MessageServer("the-secret", encrypt=server_encrypts)
        try:
            with pytest.raises(ConnectionError, match="KRUG_ENCRYPT"):
                messages.MessageClient("127.0.0.1", server.port, "the-secret",
                                       encrypt=not server_encrypts)
        finally:
            server.close()


def test_an_altered_encrypted_message_is_refused():
    pytest.importorskip("cryptography")
    listener = socket.create_server(("127.0.0.1", 0))
    outcome = {}

    def serve():
        conn, _ = listener.accept()
        with conn:
            channel = messages._handshake_as_server(conn, "the-secret", True)
            try:
                channel.recv(conn)
            except ConnectionError as e:
                outcome["error"] = str(e)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    with listener:
        client = messages.MessageClient("127.0.0.1", listener.getsockname()[1], "the-secret",
                                        encrypt=True)
        header = struct.pack("!I", 5 + messages._TAG)
        box = client._channel._send.encrypt(bytes(12), b"hello", header)
        altered = bytes([box[0] ^ 1]) + box[1:]
        client._sock.sendall(header + altered)
        t.join(10)
        client.close()
    assert "failed authentication" in outcome.get("error", "")
