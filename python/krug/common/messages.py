"""A small authenticated message channel from a job's workers to its driver, and back.

krug.spark's tasks report to the driver through it: that they started, each line their rank
prints, and the rank's result or error, so that the driver can stream output, return results
in rank order and cancel the whole job at the first failure (a task that merely raised would
make Spark retry the stage). Before anything else on a connection, both sides prove the job's
secret (the mutual handshake of krug's C++ core, net/handshake.cc: fresh nonces from both
sides, HMAC-SHA256 over both under a label naming the role), within a deadline and in frames
of bounded size, so that a stray process can neither inject results nor pose as the driver
(whose replies are unpickled); messages are pickled tuples preceded by their length. A worker
that said ``("hello", key, ...)`` can be answered with :meth:`MessageServer.reply` and read it
with :meth:`MessageClient.receive`.

With ``encrypt`` (KRUG_ENCRYPT=1 on the driver) both sides prove the secret under the encrypting
labels and seal every message after the handshake as the C++ core does (net/cipher.h):
AES-256-GCM, one key per direction from HMAC-SHA256(secret, label | both nonces), the message's
number as nonce and its length prefix as associated data. That needs the ``cryptography``
package."""

import hashlib
import hmac
import logging
import os
import pickle
import queue
import socket
import struct
import threading

_LEN = struct.Struct("!I")


def _send(sock, payload):
    sock.sendall(_LEN.pack(len(payload)) + payload)


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed")
        buf += chunk
    return bytes(buf)


def _recv(sock, limit=None):
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if limit is not None and n > limit:
        raise ConnectionError("a %d-byte frame before the handshake (at most %d)" % (n, limit))
    return _recv_exact(sock, n)


_NONCE = 32
_HANDSHAKE_FRAME = 4096  # nothing bigger from a peer not yet authenticated
_HANDSHAKE_SECONDS = 10.0
_LABELS = {False: (b"krug client", b"krug server"),
           True: (b"krug client aes-256-gcm", b"krug server aes-256-gcm")}
_TO_SERVER_KEY, _TO_CLIENT_KEY = b"krug key client to server", b"krug key server to client"
_TAG = 16
_log = logging.getLogger("krug.messages")


def _proof(secret, label, first, second):
    return hmac.new(secret.encode(), label + first + second, hashlib.sha256).digest()


class _Sealed:
    """One connection's two AES-256-GCM directions; a message's number is its nonce."""

    def __init__(self, secret, server_nonce, client_nonce, client):
        try:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError:
            raise RuntimeError("KRUG_ENCRYPT=1: krug's driver channel needs the 'cryptography' "
                               "package (pip install cryptography)") from None
        to_server = AESGCM(_proof(secret, _TO_SERVER_KEY, server_nonce, client_nonce))
        to_client = AESGCM(_proof(secret, _TO_CLIENT_KEY, server_nonce, client_nonce))
        self._send, self._recv = (to_server, to_client) if client else (to_client, to_server)
        self._sent = self._received = 0
        self._send_lock = threading.Lock()  # a number and its message leave together

    @staticmethod
    def _nonce(n):
        return bytes(4) + n.to_bytes(8, "little")

    def send(self, sock, payload):
        with self._send_lock:
            header = _LEN.pack(len(payload) + _TAG)
            box = self._send.encrypt(self._nonce(self._sent), payload, header)
            self._sent += 1
            sock.sendall(header + box)

    def recv(self, sock):
        header = _recv_exact(sock, _LEN.size)
        (n,) = _LEN.unpack(header)
        if n < _TAG:
            raise ConnectionError("a sealed message shorter than its tag")
        box = _recv_exact(sock, n)
        from cryptography.exceptions import InvalidTag
        try:
            payload = self._recv.decrypt(self._nonce(self._received), box, header)
        except InvalidTag:
            raise ConnectionError("a message failed authentication (altered on the way, or not "
                                  "this job's key)") from None
        self._received += 1
        return payload


class _Plain:
    @staticmethod
    def send(sock, payload):
        _send(sock, payload)

    @staticmethod
    def recv(sock):
        return _recv(sock)


def _handshake_as_server(conn, secret, encrypt):
    """The connection's channel (_Sealed or _Plain) when the peer proved the secret (it then
    holds our proof); None otherwise."""
    conn.settimeout(_HANDSHAKE_SECONDS)
    server_nonce = os.urandom(_NONCE)
    _send(conn, server_nonce)
    answer = _recv(conn, _HANDSHAKE_FRAME)
    client_nonce, theirs = answer[:_NONCE], answer[_NONCE:]
    client_label, server_label = _LABELS[encrypt]
    if len(answer) != 2 * _NONCE or not hmac.compare_digest(
            theirs, _proof(secret, client_label, server_nonce, client_nonce)):
        return None
    _send(conn, _proof(secret, server_label, client_nonce, server_nonce))
    conn.settimeout(None)
    return _Sealed(secret, server_nonce, client_nonce, False) if encrypt else _Plain()


def _handshake_as_client(sock, secret, where, encrypt):
    server_nonce = _recv(sock, _HANDSHAKE_FRAME)
    client_nonce = os.urandom(_NONCE)
    client_label, server_label = _LABELS[encrypt]
    _send(sock, client_nonce + _proof(secret, client_label, server_nonce, client_nonce))
    try:
        theirs = _recv(sock, _HANDSHAKE_FRAME)
    except ConnectionError:
        raise ConnectionError("the driver at %s refused this worker's proof of the job secret "
                              "(or its KRUG_ENCRYPT differs)" % where) from None
    if not hmac.compare_digest(theirs, _proof(secret, server_label, client_nonce, server_nonce)):
        raise ConnectionError("the server at %s could not prove the job secret: it is not this "
                              "job's driver" % where)
    return _Sealed(secret, server_nonce, client_nonce, True) if encrypt else _Plain()


class MessageServer:
    """Listens on ``bind``; every message of an authenticated client lands in ``self.queue``."""

    def __init__(self, secret, bind="127.0.0.1", encrypt=False):
        self._secret = secret
        self._encrypt = encrypt
        self.queue = queue.Queue()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((bind, 0))
        self._sock.listen(128)
        self.port = self._sock.getsockname()[1]
        self._closed = threading.Event()
        self._conns = []
        self._by_key = {}  # "hello" key -> (its connection, its channel), for reply()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name="krug-messages").start()

    def _accept(self):
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        sender = None
        channel = None
        try:
            channel = _handshake_as_server(conn, self._secret, self._encrypt)
            if channel is None:
                _log.warning("refused a connection from %s: wrong job secret (or KRUG_ENCRYPT "
                             "differs)", _peer_name(conn))
                return  # not one of ours: drop it without reading anything it sends
            while True:
                message = pickle.loads(channel.recv(conn))
                if message and message[0] == "started":
                    sender = message[1]
                elif message and message[0] == "hello":
                    with self._lock:
                        self._by_key[message[1]] = (conn, channel)
                self.queue.put(message)
        except (OSError, ConnectionError, EOFError, pickle.UnpicklingError) as e:
            if channel is None and not self._closed.is_set():
                _log.warning("refused a connection from %s: %s", _peer_name(conn), e)
        finally:
            conn.close()
        if sender is not None:
            # The sender's end: after its "done", or instead of it when its process died.
            self.queue.put(("closed", sender))

    def reply(self, key, *message):
        """Sends ``message`` to the worker that said hello with ``key``; False when it is gone."""
        with self._lock:
            conn, channel = self._by_key.get(key, (None, None))
        if conn is None:
            return False
        try:
            channel.send(conn, pickle.dumps(message))
            return True
        except OSError:
            return False

    def close(self):
        self._closed.set()
        self._sock.close()
        with self._lock:
            for c in self._conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class MessageClient:
    """A worker's connection to the driver's MessageServer. Thread-safe."""

    def __init__(self, host, port, secret, timeout=60.0, encrypt=False):
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.settimeout(_HANDSHAKE_SECONDS)
        self._channel = _handshake_as_client(self._sock, secret, "%s:%d" % (host, port), encrypt)
        self._sock.settimeout(None)
        self._lock = threading.Lock()

    def send(self, *message):
        data = pickle.dumps(message)
        with self._lock:
            self._channel.send(self._sock, data)

    def receive(self, timeout):
        """The driver's next reply (a tuple); TimeoutError after ``timeout`` seconds,
        ConnectionError when the driver closed the connection."""
        self._sock.settimeout(timeout)
        try:
            return pickle.loads(self._channel.recv(self._sock))
        except socket.timeout:
            raise TimeoutError("no answer from the driver within %.0f s" % timeout) from None
        finally:
            self._sock.settimeout(None)

    def close(self):
        self._sock.close()


def _peer_name(conn):
    try:
        return "%s:%d" % conn.getpeername()[:2]
    except OSError:
        return "a closed socket"
