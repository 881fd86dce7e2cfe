"""A hostile host for the attack test (test_attack.py): it does not know the job secret and
throws at every port a krug job listens on what a stranger on the network could.

    attacker.py --out RESULT.json [--wait S] [--seed N]      (commands on stdin, one a line)

Commands, sent by the harness as it learns them:

    replay HEX           the client's bytes of a handshake captured on the wire
    target NAME HOST:PORT  attack this listener now (every phase below, all at once)
    flood N HOLD NAME,...  N connections at once, spread over those targets, held HOLD s
    stop                 the job ended: stop the tricklers, write RESULT.json, exit (so does EOF)

It prints "flood-open N" on stdout once a flood's connections are made (N of them open).

Phases per target, each on a connection of its own:

    garbage         2 KiB of random bytes
    truncated       a frame header saying 100 bytes, 10 of them, then this side closes
    truncated_hold  the same, but kept open: the listener must give up on its own (deadline)
    huge_ffffffff   header 0xFFFFFFFF and 1 KiB
    huge_1gib       header 1 << 30 (the data frames' limit) and 1 KiB
    replay          the captured client bytes sent verbatim after the server's nonce
    trickle         one byte a second for as long as the job runs; when the listener closes
                    the connection, a new one starts (at most 200)

Every connection records how it ended: refused (nothing listens), connect_timeout,
closed_by_server (EOF), reset_by_server (RST), closed_by_attacker (truncated), still_open
(the listener kept it past --wait seconds, or the trickler's when the job ended), after how many
seconds, and what the server sent. A krug server may send a stranger its nonce frame (32 bytes)
and then at most a rejection verdict (a frame whose first byte is 0); "server_bytes_ok" is
false when anything else came back: an acceptance, or data. Stdlib only: it runs in the
attacker's network namespace with any python3.
"""
import argparse
import errno
import json
import random
import resource
import selectors
import socket
import struct
import sys
import threading
import time

NONCE = 32
MAX_HANDSHAKE_FRAME = 4096
RECEIVE_CAP = 64 * 1024  # more than any handshake; a server that sends more is wrong anyway
MAX_TRICKLES = 200


def log(*args):
    sys.stderr.write(" ".join(["attacker:"] + [str(a) for a in args]) + "\n")  # one write: threads
    sys.stderr.flush()


def check_server_bytes(data):
    """(ok, what): is `data` a prefix of [nonce frame][rejection verdict frame]?"""
    def header(n):
        return struct.pack("<I", n)

    expected_header = header(NONCE)
    if len(data) < 4:
        return expected_header.startswith(data), "partial nonce header" if data else "nothing"
    if data[:4] != expected_header:
        return False, f"first frame of {struct.unpack('<I', data[:4])[0]} bytes, not a nonce"
    if len(data) <= 4 + NONCE:
        return True, "nonce" if len(data) == 4 + NONCE else "partial nonce"
    rest = data[4 + NONCE:]
    if len(rest) < 4:
        return True, "nonce, partial verdict header"
    (n,) = struct.unpack("<I", rest[:4])
    if n > MAX_HANDSHAKE_FRAME:
        return False, f"second frame of {n} bytes"
    body = rest[4:4 + n]
    if body and body[0] != 0:
        return False, "an acceptance verdict (first byte %d)" % body[0]
    if len(rest) > 4 + n:
        return False, f"{len(rest) - 4 - n} bytes after the verdict"
    reason = ""
    if len(body) >= 5:
        (m,) = struct.unpack("<I", body[1:5])
        reason = body[5:5 + m].decode("utf-8", "replace")
    return True, "nonce, rejection" + (f" ({reason})" if reason else "")


class Record(dict):
    """One connection: phase, how it ended, after how long, what the server sent."""

    def finish(self, ended, started, received):
        ok, what = check_server_bytes(received)
        self.update(ended=ended, seconds=round(time.monotonic() - started, 2),
                    received=len(received), server_bytes=what, server_bytes_ok=ok)
        return self


def connect(address, timeout=5.0):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(address)
    except ConnectionRefusedError:
        s.close()
        return None, "refused"
    except socket.timeout:
        s.close()
        return None, "connect_timeout"
    except OSError as e:
        s.close()
        return None, "connect_error: " + (e.strerror or str(e))
    return s, "ok"


def drain(sock, until, received):
    """Reads until the server closes or `until` (monotonic); returns how it ended."""
    while True:
        left = until - time.monotonic()
        if left <= 0:
            return "still_open"
        sock.settimeout(min(left, 1.0))
        try:
            chunk = sock.recv(4096)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return "reset_by_server"
        except OSError as e:
            return "error: " + (e.strerror or str(e))
        if not chunk:
            return "closed_by_server"
        if len(received) < RECEIVE_CAP:
            received += chunk


def send(sock, data):
    """sendall that reports a server's close instead of raising: returns an ended-reason or
    None."""
    try:
        sock.sendall(data)
        return None
    except (BrokenPipeError, ConnectionResetError):
        return "reset_by_server"
    except OSError as e:
        return "error: " + (e.strerror or str(e))


class Attacker:
    def __init__(self, out, wait, seed):
        self.out = out
        self.wait = wait
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.replay = None
        self.replay_ready = threading.Event()
        self.targets = {}  # name -> {"address", "phases": [Record], "trickle": [Record]}
        self.threads = []
        self.floods = []
        self.started = time.monotonic()

    # --- one connection per phase -------------------------------------------------------------

    def one_shot(self, name, address, phase, payload, close_after=None, before=None):
        record = Record(phase=phase, at=round(time.monotonic() - self.started, 2))
        sock, how = connect(address)
        started = time.monotonic()
        received = bytearray()
        if sock is None:
            return record.finish(how, started, received)
        with sock:
            if before is not None:  # the replay: the server's nonce first
                sock.settimeout(5.0)
                try:
                    received += sock.recv(4 + NONCE)
                    while 0 < len(received) < 4 + NONCE:
                        more = sock.recv(4 + NONCE - len(received))
                        if not more:
                            break
                        received += more
                except OSError:
                    pass
                payload = before()
            ended = send(sock, payload)
            if ended is None and close_after is not None:
                ended = drain(sock, time.monotonic() + close_after, received)
                if ended == "still_open":
                    ended = "closed_by_attacker"
            if ended is None:
                ended = drain(sock, started + self.wait, received)
            return record.finish(ended, started, received)

    def phases(self, name, address):
        def garbage():
            return bytes(self.rng.getrandbits(8) for _ in range(2048))

        def replay_bytes():
            self.replay_ready.wait(30)
            return self.replay or b""

        truncated = struct.pack("<I", 100) + b"\xaa" * 10
        plan = [
            ("garbage", garbage(), None, None),
            ("truncated", truncated, 0.5, None),
            ("truncated_hold", truncated, None, None),
            ("huge_ffffffff", struct.pack("<I", 0xFFFFFFFF) + b"\x55" * 1024, None, None),
            ("huge_1gib", struct.pack("<I", 1 << 30) + b"\x55" * 1024, None, None),
            ("replay", b"", None, replay_bytes),
        ]
        for phase, payload, close_after, before in plan:
            t = threading.Thread(target=self.run_phase,
                                 args=(name, address, phase, payload, close_after, before),
                                 daemon=True)
            t.start()
            self.threads.append(t)
        t = threading.Thread(target=self.trickle, args=(name, address), daemon=True)
        t.start()
        self.threads.append(t)

    def run_phase(self, name, address, phase, payload, close_after, before):
        try:
            record = self.one_shot(name, address, phase, payload, close_after, before)
        except Exception as e:  # report, never die silently
            record = Record(phase=phase, ended="attacker_error: %r" % e, server_bytes_ok=True)
        with self.lock:
            self.targets[name]["phases"].append(record)
        log(name, phase, record.get("ended"), record.get("seconds"), record.get("server_bytes"))

    def trickle(self, name, address):
        """One byte a second: a header announcing 4095 bytes (under the handshake limit, so
        the server keeps reading), then filler, until the listener gives up or the job ends."""
        pattern = struct.pack("<I", MAX_HANDSHAKE_FRAME - 1) + b"\x00" * (MAX_HANDSHAKE_FRAME - 1)
        for _ in range(MAX_TRICKLES):
            if self.stopping.is_set():
                return
            record = Record(phase="trickle", at=round(time.monotonic() - self.started, 2))
            sock, how = connect(address)
            started = time.monotonic()
            received = bytearray()
            if sock is None:
                with self.lock:
                    self.targets[name]["trickle"].append(record.finish(how, started, received))
                return  # nothing listens there any more
            ended = None
            sent = 0
            with sock:
                while ended is None:
                    ended = send(sock, pattern[sent % len(pattern):sent % len(pattern) + 1])
                    if ended:
                        break
                    sent += 1
                    # Wait a second for the server's close, or the job's end.
                    until = time.monotonic() + 1.0
                    while ended is None and time.monotonic() < until:
                        if self.stopping.is_set():
                            ended = "still_open"
                            break
                        ended = drain(sock, min(until, time.monotonic() + 0.2), received)
                        if ended == "still_open":
                            ended = None
            record["bytes_sent"] = sent
            with self.lock:
                self.targets[name]["trickle"].append(record.finish(ended, started, received))
            log(name, "trickle", ended, record["seconds"], sent, "bytes")
            if ended == "still_open":
                return

    # --- many at once -------------------------------------------------------------------------

    def flood(self, count, hold, names):
        names = [n for n in names if n in self.targets] or list(self.targets)
        at = round(time.monotonic() - self.started, 2)
        sel = selectors.DefaultSelector()
        conns = []
        per = {n: dict(address="%s:%d" % self.targets[n]["address"], attempted=0, connected=0,
                       refused=0, connect_timeout=0, connect_error=0, closed_by_server=0,
                       reset_by_server=0, still_open_at_release=0, got_nonce=0,
                       server_bytes_violations=0, first_close_s=None, last_close_s=None)
               for n in names}
        started = time.monotonic()
        for i in range(count):
            name = names[i % len(names)]
            per[name]["attempted"] += 1
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            err = s.connect_ex(self.targets[name]["address"])
            if err not in (0, errno.EINPROGRESS):
                per[name]["connect_error"] += 1
                s.close()
                continue
            c = {"sock": s, "name": name, "state": "connecting", "data": bytearray()}
            conns.append(c)
            sel.register(s, selectors.EVENT_WRITE, c)
        connect_deadline = started + 5.0
        release = None
        while True:
            now = time.monotonic()
            connecting = [c for c in conns if c["state"] == "connecting"]
            if release is None and (not connecting or now >= connect_deadline):
                for c in connecting:
                    per[c["name"]]["connect_timeout"] += 1
                    c["state"] = "done"
                    sel.unregister(c["sock"])
                    c["sock"].close()
                release = now + hold
                opened = sum(c["state"] == "open" for c in conns)
                with self.lock:  # tells the harness the connections are up
                    print(f"flood-open {opened}", flush=True)
            if release is not None and now >= release:
                break
            limit = (release if release is not None else connect_deadline) - now
            for key, _ in sel.select(timeout=max(0.0, min(limit, 0.5))):
                c = key.data
                s = c["sock"]
                p = per[c["name"]]
                if c["state"] == "connecting":
                    err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        p["refused" if err == errno.ECONNREFUSED else "connect_error"] += 1
                        c["state"] = "done"
                        sel.unregister(s)
                        s.close()
                    else:
                        p["connected"] += 1
                        c["state"] = "open"
                        sel.modify(s, selectors.EVENT_READ, c)
                    continue
                try:
                    chunk = s.recv(4096)
                    ended = None if chunk else "closed_by_server"
                except ConnectionResetError:
                    chunk, ended = b"", "reset_by_server"
                except BlockingIOError:
                    continue
                c["data"] += chunk[:RECEIVE_CAP]
                if ended:
                    p[ended] += 1
                    t = round(time.monotonic() - started, 2)
                    p["first_close_s"] = t if p["first_close_s"] is None else p["first_close_s"]
                    p["last_close_s"] = t
                    c["state"] = "done"
                    sel.unregister(s)
                    s.close()
        for c in conns:
            p = per[c["name"]]
            if len(c["data"]) >= 4 + NONCE:
                p["got_nonce"] += 1
            if not check_server_bytes(bytes(c["data"]))[0]:
                p["server_bytes_violations"] += 1
            if c["state"] == "open":
                p["still_open_at_release"] += 1
                sel.unregister(c["sock"])
                c["sock"].close()
        sel.close()
        result = dict(at=at, count=count, hold=hold,
                      seconds=round(time.monotonic() - started, 2), targets=per)
        with self.lock:
            self.floods.append(result)
        log("flood", json.dumps(result))

    # --- the harness's commands ---------------------------------------------------------------

    def serve(self, lines):
        for line in lines:
            words = line.split()
            if not words:
                continue
            if words[0] == "replay":
                self.replay = bytes.fromhex(words[1])
                self.replay_ready.set()
            elif words[0] == "target":
                name, (host, port) = words[1], words[2].rsplit(":", 1)
                with self.lock:
                    if name in self.targets:
                        continue
                    self.targets[name] = {"address": (host, int(port)), "phases": [],
                                          "trickle": [],
                                          "at": round(time.monotonic() - self.started, 2)}
                log("target", name, words[2])
                self.phases(name, (host, int(port)))
            elif words[0] == "flood":
                t = threading.Thread(target=self.flood, daemon=True,
                                     args=(int(words[1]), float(words[2]),
                                           words[3].split(",") if len(words) > 3 else []))
                t.start()
                self.threads.append(t)
            elif words[0] == "stop":
                break
        self.stopping.set()
        deadline = time.monotonic() + self.wait + 10
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with self.lock:
            result = {"targets": {n: dict(t, address="%s:%d" % t["address"])
                                  for n, t in self.targets.items()},
                      "floods": self.floods,
                      "unfinished_threads": sum(t.is_alive() for t in self.threads),
                      "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      "cpu_s": round(sum(resource.getrusage(resource.RUSAGE_SELF)[:2]), 2)}
        with open(self.out, "w") as f:
            json.dump(result, f, indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--wait", type=float, default=20.0,
                   help="how long a phase waits for the listener to close its connection")
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    Attacker(args.out, args.wait, args.seed).serve(sys.stdin)


if __name__ == "__main__":
    main()
