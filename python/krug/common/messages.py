"""A small authenticated message channel from a job's workers to its driver, and back.

krug.spark's tasks report to the driver through it: that they started, each line their rank
prints, and the rank's result or error, so that the driver can stream output, return results
in rank order and cancel the whole job at the first failure (a task that merely raised would
make Spark retry the stage). Before anything else on a connection, both sides prove the job's
secret (the mutual handshake of krug's C++ core, net/handshake.cc: fresh nonces from both
sides, HMAC-SHA256 over both under a label naming the role), within a deadline and in frames
of bounded size, so that a stray process can neither inject results nor pose as the driver
(whose replies are unpickled); messages are pickled tuples preceded by their length. A worker that said ``("hello", key, ...)`` can be answered with
:meth:`MessageServer.reply` and read it with :meth:`MessageClient.receive`."""

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
_CLIENT, _SERVER = b"krug client", b"krug server"
_log = logging.getLogger("krug.messages")


def _proof(secret, label, first, second):
    return hmac.new(secret.encode(), label + first + second, hashlib.sha256).digest()


def _handshake_as_server(conn, secret):
    """True when the peer proved the secret (it then holds our proof); False otherwise."""
    conn.settimeout(_HANDSHAKE_SECONDS)
    server_nonce = os.urandom(_NONCE)
    _send(conn, server_nonce)
    answer = _recv(conn, _HANDSHAKE_FRAME)
    client_nonce, theirs = answer[:_NONCE], answer[_NONCE:]
    if len(answer) != 2 * _NONCE or not hmac.compare_digest(
            theirs, _proof(secret, _CLIENT, server_nonce, client_nonce)):
        return False
    _send(conn, _proof(secret, _SERVER, client_nonce, server_nonce))
    conn.settimeout(None)
    return True


def _handshake_as_client(sock, secret, where):
    server_nonce = _recv(sock, _HANDSHAKE_FRAME)
    client_nonce = os.urandom(_NONCE)
    _send(sock, client_nonce + _proof(secret, _CLIENT, server_nonce, client_nonce))
    try:
        theirs = _recv(sock, _HANDSHAKE_FRAME)
    except ConnectionError:
        raise ConnectionError("the driver at %s refused this worker's proof of the job secret"
                              % where) from None
    if not hmac.compare_digest(theirs, _proof(secret, _SERVER, client_nonce, server_nonce)):
        raise ConnectionError("the server at %s could not prove the job secret: it is not this "
                              "job's driver" % where)


class MessageServer:
    """Listens on ``bind``; every message of an authenticated client lands in ``self.queue``."""

    def __init__(self, secret, bind="127.0.0.1"):
        self._secret = secret
        self.queue = queue.Queue()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((bind, 0))
        self._sock.listen(128)
        self.port = self._sock.getsockname()[1]
        self._closed = threading.Event()
        self._conns = []
        self._by_key = {}  # "hello" key -> its connection, for reply()
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
        authenticated = False
        try:
            authenticated = _handshake_as_server(conn, self._secret)
            if not authenticated:
                _log.warning("refused a connection from %s: wrong job secret",
                             _peer_name(conn))
                return  # not one of ours: drop it without reading anything it sends
            while True:
                message = pickle.loads(_recv(conn))
                if message and message[0] == "started":
                    sender = message[1]
                elif message and message[0] == "hello":
                    with self._lock:
                        self._by_key[message[1]] = conn
                self.queue.put(message)
        except (OSError, ConnectionError, EOFError, pickle.UnpicklingError) as e:
            if not authenticated and not self._closed.is_set():
                _log.warning("refused a connection from %s: %s", _peer_name(conn), e)
        finally:
            conn.close()
        if sender is not None:
            # The sender's end: after its "done", or instead of it when its process died.
            self.queue.put(("closed", sender))

    def reply(self, key, *message):
        """Sends ``message`` to the worker that said hello with ``key``; False when it is gone."""
        with self._lock:
            conn = self._by_key.get(key)
        try:
            _send(conn, pickle.dumps(message))
            return True
        except (AttributeError, OSError):
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

    def __init__(self, host, port, secret, timeout=60.0):
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.settimeout(_HANDSHAKE_SECONDS)
        _handshake_as_client(self._sock, secret, "%s:%d" % (host, port))
        self._sock.settimeout(None)
        self._lock = threading.Lock()

    def send(self, *message):
        data = pickle.dumps(message)
        with self._lock:
            _send(self._sock, data)

    def receive(self, timeout):
        """The driver's next reply (a tuple); TimeoutError after ``timeout`` seconds,
        ConnectionError when the driver closed the connection."""
        self._sock.settimeout(timeout)
        try:
            return pickle.loads(_recv(self._sock))
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
