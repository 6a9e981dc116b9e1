# SPDX-License-Identifier: Apache-2.0
"""The daemon's metrics as an operator scrapes them: `tbctl metrics`,
Client.metrics() and --metrics-listen (unix: and tcp:), parsed with
prometheus_client's own parser and checked against what the test did.
Run by ctest as python_metrics (tests/python/CMakeLists.txt)."""
import contextlib
import gc
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading

import tbtest

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:  # Debian: python3-prometheus-client (tests/run.sh)
    raise tbtest.Skip("prometheus_client is not installed")

import tensorbroker

TBCTL = os.environ.get("TB_TBCTL")
TIMEOUT = 30.0  # seconds; every wait below is for an event, bounded by this

# ---- the daemon, with its log ------------------------------------------------


@contextlib.contextmanager
def daemon(*extra):
    """tensorbrokerd on a fresh socket with --log-level info; yields
    (socket path, temp dir, log lines). The log is read by a thread, so
    that the daemon never blocks on it."""
    tmp = tempfile.mkdtemp(prefix="tbmetrics-")
    sock = os.path.join(tmp, "tb.sock")
    r, w = os.pipe()
    proc = subprocess.Popen(
        [tbtest.daemon_path(), "--socket", sock, "--ready-fd", str(w),
         "--log-level", "info", *[a.replace("@TMP@", tmp) for a in extra]],
        pass_fds=(w,), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    os.close(w)
    lines = Log()
    reader = threading.Thread(target=lines.read, args=(proc.stderr,), daemon=True)
    reader.start()
    try:
        with os.fdopen(r, "rb") as ready:
            if ready.readline() != b"READY\n":
                raise RuntimeError("tensorbrokerd did not become ready (exit %r)" % proc.wait())
        yield sock, tmp, lines
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=TIMEOUT)
        reader.join(timeout=TIMEOUT)
        shutil.rmtree(tmp, ignore_errors=True)
        if rc != 0:
            raise RuntimeError("tensorbrokerd exited with %d:\n%s" % (rc, "".join(lines)))


class Log(list):
    """The daemon's log lines, as a thread reads them."""

    def __init__(self):
        super().__init__()
        self.cond = threading.Condition()

    def read(self, f):
        for line in f:
            with self.cond:
                self.append(line)
                self.cond.notify_all()

    def wait_for(self, text):
        with self.cond:
            assert self.cond.wait_for(lambda: any(text in ln for ln in self), TIMEOUT), \
                "no '%s' in the log:\n%s" % (text, "".join(self))
            return next(ln for ln in self if text in ln)


def tcp_port(log):
    """The port --metrics-listen tcp:127.0.0.1:0 got, from the log."""
    line = log.wait_for("metrics: serving GET /metrics on tcp:127.0.0.1:")
    return int(line.rsplit(":", 1)[1])


# ---- scraping -------------------------------------------------------------------


def http_exchange(connect, request):
    """Send request bytes, read to the end; returns (status, headers, body)."""
    s = connect()
    s.settimeout(TIMEOUT)
    with s:
        s.sendall(request)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("ascii").split("\r\n")
    status = int(lines[0].split()[1])
    assert lines[0].startswith("HTTP/1.1 "), lines[0]
    headers = dict(h.split(": ", 1) for h in lines[1:])
    assert int(headers["Content-Length"]) == len(body), (headers, len(body))
    assert headers["Connection"] == "close"
    return status, headers, body.decode("utf-8")


def tcp(port):
    return lambda: socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)


def unix(path):
    def connect():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(TIMEOUT)
        s.connect(path)
        return s
    return connect


def scrape(connect, path="/metrics"):
    status, headers, body = http_exchange(
        connect, ("GET %s HTTP/1.1\r\nHost: localhost\r\nAccept: text/plain\r\n\r\n"
                  % path).encode())
    assert status == 200, (status, body)
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    return body


def tbctl_metrics(sock):
    p = subprocess.run([TBCTL, "--socket", sock, "metrics"], capture_output=True,
                       text=True, timeout=TIMEOUT)
    assert p.returncode == 0, p.stderr
    return p.stdout


def parse(text):
    """{(sample name, ((label, value), ...)): value}, after checking the
    exposition's structure: every family has HELP and TYPE, names are
    tensorbroker_*, counters end in _total, histograms are cumulative."""
    assert text.endswith("\n")
    out = {}
    fams = list(text_string_to_metric_families(text))
    names = [f.name for f in fams]
    assert len(names) == len(set(names)), "a family twice: %r" % names
    for f in fams:
        assert f.name.startswith("tensorbroker_"), f.name
        assert f.documentation, f.name
        assert f.type in ("counter", "gauge", "histogram"), (f.name, f.type)
        for s in f.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, key
            out[key] = s.value
            if f.type == "counter":
                assert s.name == f.name + "_total", s.name
        if f.type == "histogram":
            buckets = [s for s in f.samples if s.name.endswith("_bucket")]
            counts = [s.value for s in buckets]
            assert counts == sorted(counts), counts
            assert buckets[-1].labels["le"] == "+Inf"
            assert counts[-1] == out[(f.name + "_count", ())]
    # the raw text: one HELP and one TYPE line per family
    for n in names:
        typ = dict((f.name, f.type) for f in fams)[n]
        shown = n + "_total" if typ == "counter" else n
        assert text.count("# TYPE %s %s\n" % (shown, typ)) == 1, n
    return out


def value(m, name, /, **labels):
    return m[(name, tuple(sorted(labels.items())))]


def channel_values(m, name):
    return {dict(k[1])["channel"]: v for k, v in m.items() if k[0] == name}


# ---- the wire, for what the binding does not do ---------------------------------


def varint(n):
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def fv(no, v):
    return varint(no << 3) + varint(v)


def fb(no, b):
    return varint(no << 3 | 2) + varint(len(b)) + b


def fields(data):
    """Top-level fields of a protobuf message: {number: [value, ...]}."""
    out, i = {}, 0
    while i < len(data):
        key, i = read_varint(data, i)
        no, wt = key >> 3, key & 7
        if wt == 0:
            v, i = read_varint(data, i)
        elif wt == 2:
            n, i = read_varint(data, i)
            v, i = data[i:i + n], i + n
        else:
            raise AssertionError("wire type %d" % wt)
        out.setdefault(no, []).append(v)
    return out


def read_varint(data, i):
    v = shift = 0
    while True:
        b = data[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def zigzag_status(v):  # Reply.status is int32: negative values are 10-byte varints
    return v - (1 << 64) if v >= 1 << 63 else v


class Raw:
    """A session speaking the wire by hand (SOCK_SEQPACKET)."""

    def __init__(self, sock, name):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.s.settimeout(TIMEOUT)
        self.s.connect(sock)
        self.next_id = 1
        reply = self.call(10, fv(1, 1) + fb(2, name.encode()))
        assert reply.get(2, [0])[0] == 0, reply

    def send(self, body_no, body, request_id):
        self.s.send(fv(1, request_id) + fb(body_no, body))

    def call(self, body_no, body):
        rid = self.next_id
        self.next_id += 1
        self.send(body_no, body, rid)
        while True:
            msg = fields(self.s.recv(1 << 20))
            if 1 in msg:  # ServerMessage.reply; notices are skipped
                reply = fields(msg[1][0])
                assert reply[1][0] == rid, reply
                return reply

    def status_of(self, reply):
        return zigzag_status(reply.get(2, [0])[0])

    def close(self):
        self.s.close()


def acquire_implicit(raw, channel):
    """An Acquire that relied on the default stream (Acquire.implicit_stream),
    as a CUDA consumer without a stream sends it; timeout 0."""
    return raw.call(16, fb(1, channel.encode()) + fv(5, 1))


TB_ENOTFOUND, TB_ESTALE, TB_EPROTO, TB_ENOTSUP = -8, -24, -5, -25


def eof(s, data_ok=False):
    """Wait (bounded) for the peer to close s; True when it did (and sent
    nothing before, unless data_ok)."""
    s.settimeout(TIMEOUT)
    try:
        while True:
            data = s.recv(65536)
            if data == b"":
                return True
            if not data_ok:
                return False
    except ConnectionResetError:
        return True


# ---- the tests ------------------------------------------------------------------


def test_scrapes_agree_with_what_clients_did():
    with daemon("--metrics-listen", "unix:@TMP@/metrics.sock") as (sock, tmp, _log):
        mpath = os.path.join(tmp, "metrics.sock")
        assert oct(os.stat(mpath).st_mode & 0o777) == "0o660"
        with tensorbroker.Client(socket=sock, name="producer") as prod, \
                tensorbroker.Client(socket=sock, name="consumer") as cons:
            a = prod.empty((16,), "float32")  # 64 bytes
            b = prod.empty((1000,), "uint8")
            prod.publish("m/a", a, history_depth=2)
            prod.publish("m/a", a)            # the same buffer: counted once
            prod.publish("m/b", b)
            kept = cons.acquire("m/a")        # version 2, held
            with cons.acquire("m/b"):         # released on leaving
                pass
            raw = Raw(sock, "implicit-app")
            assert raw.status_of(acquire_implicit(raw, "m/none")) == TB_ENOTFOUND
            assert raw.status_of(acquire_implicit(raw, "m/none")) == TB_ENOTFOUND
            raw.close()
            raw = Raw(sock, "implicit-app")   # a second session of that name
            assert raw.status_of(acquire_implicit(raw, "m/none")) == TB_ENOTFOUND
            bad = Raw(sock, "bad")
            bad.s.send(b"\xff\xff\xff\xff")   # does not decode
            assert eof(bad.s, data_ok=True)   # a TB_EPROTO reply, then the end
            bad.close()
            assert len(cons.leases()) == 1     # the operator's views, each
            assert len(cons.waits()) == 0      # counted by its own type
            assert len(cons.buffers()) == 2

            via_unix = parse(scrape(unix(mpath)))
            via_tbctl = parse(tbctl_metrics(sock))
            via_client = parse(cons.metrics())

            m = via_unix
            assert value(m, "tensorbroker_publishes_total") == 3
            assert value(m, "tensorbroker_acquires_total") == 2
            assert value(m, "tensorbroker_releases_total") == 1
            assert value(m, "tensorbroker_leases") == 1
            assert value(m, "tensorbroker_channels") == 2
            assert value(m, "tensorbroker_versions") == 3
            assert value(m, "tensorbroker_sessions") == 3  # prod, cons, raw
            assert value(m, "tensorbroker_denials_total") == 0
            assert value(m, "tensorbroker_bad_messages_total") == 1
            assert value(m, "tensorbroker_sessions_dropped_total") == 1
            assert value(m, "tensorbroker_requests_total", type="publish") == 3
            assert value(m, "tensorbroker_requests_total", type="unknown") == 0
            for view in ("list_leases", "list_waits", "list_buffers"):
                assert value(m, "tensorbroker_requests_total", type=view) == 1, view
            assert value(m, "tensorbroker_requests_total", type="hello") == 5
            assert channel_values(m, "tensorbroker_channel_versions") == {"m/a": 2, "m/b": 1}
            assert channel_values(m, "tensorbroker_channel_leases") == {"m/a": 1, "m/b": 0}
            assert channel_values(m, "tensorbroker_channel_bytes") == {"m/a": 64, "m/b": 1000}
            # the two buffers by kind, named as tbctl and the library name kinds
            assert value(m, "tensorbroker_buffers_by_kind", kind="host") == 2
            assert value(m, "tensorbroker_buffers_by_kind", kind="cuda-vmm") == 0
            assert value(m, "tensorbroker_buffer_bytes_by_kind", kind="host") == \
                64 + 1000  # as registered: the bytes asked for
            assert channel_values(m, "tensorbroker_channel_publishes_total") == \
                {"m/a": 2, "m/b": 1}
            assert channel_values(m, "tensorbroker_channel_publisher_connected") == \
                {"m/a": 1, "m/b": 1}
            # summed over the sessions of that name, the ended one included
            assert value(m, "tensorbroker_implicit_stream_calls_total",
                         name="implicit-app") == 3
            assert value(m, "tensorbroker_implicit_stream_calls_unlisted_total") == 0
            # every request of an HTTP scrape was timed; a protocol scrape
            # renders while its own request is being timed
            hist = value(m, "tensorbroker_request_duration_seconds_count")
            total = sum(v for k, v in m.items() if k[0] == "tensorbroker_requests_total")
            assert hist == total and total > 10, (hist, total)
            assert value(m, "tensorbroker_request_duration_seconds_sum") > 0
            ct = via_tbctl
            assert value(ct, "tensorbroker_request_duration_seconds_count") == \
                sum(v for k, v in ct.items() if k[0] == "tensorbroker_requests_total") - 1
            assert value(ct, "tensorbroker_sessions") == 4  # and tbctl
            # what did not change between the scrapes is the same in each
            for other in (via_tbctl, via_client):
                for k, v in m.items():
                    if k[0].startswith(("tensorbroker_channel", "tensorbroker_implicit",
                                        "tensorbroker_publishes", "tensorbroker_acquires",
                                        "tensorbroker_leases", "tensorbroker_build",
                                        "tensorbroker_start")):
                        assert other[k] == v, (k, other[k], v)
            build = [k for k in m if k[0] == "tensorbroker_build_info"]
            tbctl_version = subprocess.run([TBCTL, "--version"], capture_output=True,
                                           text=True, check=True).stdout.split()[1]
            assert dict(build[0][1]) == {"version": tbctl_version, "protocol": "1"}
            raw.close()
            kept.release()
            del kept, a, b  # the connection closes with the last array
            gc.collect()
        # both sessions ended: their channels closed, their calls kept
        after = parse(scrape(unix(mpath)))
        assert value(after, "tensorbroker_sessions") == 0
        assert value(after, "tensorbroker_leases") == 0
        assert value(after, "tensorbroker_releases_total") == 2
        assert channel_values(after, "tensorbroker_channel_publisher_connected") == \
            {"m/a": 0, "m/b": 0}
        assert value(after, "tensorbroker_implicit_stream_calls_total",
                     name="implicit-app") == 3
    assert not os.path.exists(mpath), "the metrics socket outlived the daemon"


def test_tcp_listener_serves_the_same():
    with daemon("--metrics-listen", "tcp:127.0.0.1:0") as (sock, _, log):
        port = tcp_port(log)
        with tensorbroker.Client(socket=sock, name="p") as c:
            c.publish("t/x", c.empty((4,), "uint8"))
            for path in ("/metrics", "/", "/metrics?name[]=x"):
                m = parse(scrape(tcp(port), path))
                assert channel_values(m, "tensorbroker_channel_bytes") == {"t/x": 4}
                assert value(m, "tensorbroker_sessions") == 1


def test_paging_many_channels():
    """A text many datagrams long comes whole through the protocol, in
    pages of one snapshot."""
    n = 120
    with daemon("--max-message", "8192", "--max-metadata", "1024",
                "--metrics-listen", "tcp:127.0.0.1:0") as (sock, _, log):
        port = tcp_port(log)
        with tensorbroker.Client(socket=sock, name="many") as c:
            buf = c.empty((8,), "uint8")
            names = ["page/channel-%03d" % i for i in range(n)]
            for name in names:
                c.publish(name, buf)
            text = c.metrics()
            assert len(text) > 4 * 8192, len(text)
            m = parse(text)
            for fam in ("tensorbroker_channel_versions", "tensorbroker_channel_bytes",
                        "tensorbroker_channel_publishes_total"):
                assert sorted(channel_values(m, fam)) == names, fam
            assert set(channel_values(m, "tensorbroker_channel_bytes").values()) == {8}
            # the last family is there: nothing cut at the end
            assert value(m, "tensorbroker_implicit_stream_calls_unlisted_total") == 0
            # the same lines as an HTTP scrape, but for the counters that
            # the scrapes themselves move (an HTTP connection holds a
            # descriptor, counted as a client's; on 4 or more CPUs the
            # daemon busy-polls after each of metrics()'s page requests)
            moving = ("tensorbroker_requests_total", "tensorbroker_request_duration",
                      "tensorbroker_descriptors", "tensorbroker_busy_poll")
            over_http = [ln for ln in scrape(tcp(port)).splitlines()
                         if not ln.startswith(moving)]
            ours = [ln for ln in text.splitlines() if not ln.startswith(moving)]
            assert ours == over_http, [(a, b) for a, b in zip(ours, over_http) if a != b]
            tb_text = tbctl_metrics(sock)
            assert sorted(channel_values(parse(tb_text), "tensorbroker_channel_leases")) == names


def test_metrics_pages_on_the_wire():
    """Metrics{offset}: offset 0 takes a snapshot; pages continue it; a
    continuation without one is refused TB_ESTALE and the session goes on."""
    with daemon("--max-message", "8192", "--max-metadata", "1024") as (sock, _, _log):
        with tensorbroker.Client(socket=sock, name="p") as c:
            buf = c.empty((8,), "uint8")
            for i in range(60):
                c.publish("wire/%02d" % i, buf)
        raw = Raw(sock, "pager")
        assert raw.status_of(raw.call(26, fv(1, 5))) == TB_ESTALE
        pages, offset = [], 0
        while True:
            rep = raw.call(26, fv(1, offset) if offset else b"")
            assert raw.status_of(rep) == 0, rep
            page = fields(rep[19][0])
            assert page.get(2, [0])[0] == offset
            text = page.get(1, [b""])[0]
            pages.append(text)
            offset += len(text)
            total = page[3][0]
            if not page.get(4, [0])[0]:
                break
            assert len(text) > 0
        assert len(pages) >= 3 and offset == total
        whole = b"".join(pages).decode()
        assert sorted(channel_values(parse(whole), "tensorbroker_channel_bytes")) == \
            ["wire/%02d" % i for i in range(60)]
        # sent whole: the snapshot is gone
        assert raw.status_of(raw.call(26, fv(1, 10))) == TB_ESTALE
        assert raw.status_of(raw.call(22, b"")) == 0  # Status: still served
        raw.close()


def test_non_loopback_addresses_are_refused():
    for addr, why in (("tcp:192.0.2.1:9100", "not a loopback address"),
                      ("tcp:0.0.0.0:9100", "not a loopback address"),
                      ("tcp:[::]:9100", "not a loopback address"),
                      ("tcp:[2001:db8::1]:9100", "not a loopback address"),
                      ("tcp:localhost:9100", "numeric loopback address"),
                      ("tcp:127.0.0.1:65536", "numeric loopback address"),
                      ("tcp:127.0.0.1", "numeric loopback address"),
                      ("http://127.0.0.1:9100", "neither unix:PATH"),
                      ("unix:", "must be 1..")):
        tmp = tempfile.mkdtemp(prefix="tbmetrics-")
        sock = os.path.join(tmp, "tb.sock")
        try:
            p = subprocess.run([tbtest.daemon_path(), "--socket", sock,
                                "--metrics-listen", addr],
                               capture_output=True, text=True, timeout=TIMEOUT)
            assert p.returncode == 2, (addr, p.returncode, p.stderr)
            assert "--metrics-listen" in p.stderr and why in p.stderr, (addr, p.stderr)
            assert os.listdir(tmp) == [], "the daemon started anyway"
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def test_bad_http_requests():
    with daemon("--metrics-listen", "tcp:127.0.0.1:0") as (sock, _, log):
        connect = tcp(tcp_port(log))
        for request, want in (
                (b"garbage\r\n\r\n", 400),
                (b"GET /metrics\r\n\r\n", 400),                 # HTTP/0.9
                (b"GET /metrics HTTP/2.0\r\n\r\n", 400),
                (b"GET  /metrics HTTP/1.1\r\n\r\n", 400),
                (b"GET metrics HTTP/1.1\r\n\r\n", 400),
                (b"GET /metrics HTTP/1.1 x\r\n\r\n", 400),
                (b"GET /met\x00rics HTTP/1.1\r\n\r\n", 400),
                (b"GET /m\x01 HTTP/1.1\r\n\r\n", 400),
                (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405),
                (b"HEAD /metrics HTTP/1.1\r\n\r\n", 405),
                (b"GET /metrics/x HTTP/1.1\r\n\r\n", 404),
                (b"GET /favicon.ico HTTP/1.0\r\n\r\n", 404),
                (b"GET /metrics HTTP/1.0\n\n", 200),            # bare LFs
                (b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nextra bytes", 200)):
            status, headers, body = http_exchange(connect, request)
            assert status == want, (request, status, body)
            if want == 405:
                assert headers["Allow"] == "GET"
            if want != 200:
                assert "tensorbroker_" not in body
        # a request line longer than the daemon reads: refused, not read on
        status, _, body = http_exchange(connect, b"GET /" + b"a" * 20000)
        assert status == 400 and "longer than 8192" in body, (status, body)
        status, _, body = http_exchange(
            connect, b"GET /metrics HTTP/1.1\r\n" + b"X-Pad: y\r\n" * 1000 + b"\r\n")
        assert status == 400, status
        # and it still serves, the protocol too
        parse(scrape(connect))
        parse(tbctl_metrics(sock))


def test_silent_scrapers_do_not_stall_the_daemon():
    """Connections that never send hold only themselves: past 16 at once a
    scraper is answered 503 at once, clients are served meanwhile, and the
    silent ones are closed after 5 seconds."""
    with daemon("--metrics-listen", "tcp:127.0.0.1:0") as (sock, _, log):
        connect = tcp(tcp_port(log))
        silent = [connect() for _ in range(16)]
        try:
            status, _, _ = http_exchange(connect, b"GET /metrics HTTP/1.1\r\n\r\n")
            assert status == 503, status
            with tensorbroker.Client(socket=sock, name="busy") as c:
                c.publish("s/x", c.empty((2,), "uint8"))
                with c.acquire("s/x"):
                    pass
                assert value(parse(c.metrics()), "tensorbroker_acquires_total") == 1
            parse(tbctl_metrics(sock))
            for s in silent:
                assert eof(s), "a silent connection was never closed"
        finally:
            for s in silent:
                s.close()
        m = parse(scrape(connect))
        assert value(m, "tensorbroker_acquires_total") == 1


def fake_old_daemon(path, received, ready):
    """A daemon of before metrics: HelloReply without FEATURE_METRICS
    (ACQUIRE_RELEASE | GOODBYE); records every request it gets."""
    ls = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ls.bind(path)
    ls.listen(4)
    ready.set()
    ls.settimeout(TIMEOUT)
    with ls:
        conn, _ = ls.accept()
        with conn:
            conn.settimeout(TIMEOUT)
            while True:
                data = conn.recv(1 << 16)
                if not data:
                    return
                req = fields(data)
                received.append(sorted(k for k in req if k != 1))
                if 10 in req:  # Hello
                    hello_reply = (fv(1, 1) + fv(2, 7) + fb(3, b"0.0.9") + fv(4, 65536)
                                   + fv(5, 16) + fv(6, 4096) + fv(7, 255) + fv(8, 3))
                    reply = fv(1, req[1][0]) + fb(10, hello_reply)
                    conn.send(fb(1, reply))
                elif 22 in req:  # Status: a minimal StatusReply
                    reply = fv(1, req[1][0]) + fb(17, fb(1, b"0.0.9"))
                    conn.send(fb(1, reply))


def test_old_daemon_is_told_not_supported():
    tmp = tempfile.mkdtemp(prefix="tbmetrics-")
    path = os.path.join(tmp, "old.sock")
    received, ready = [], threading.Event()
    t = threading.Thread(target=fake_old_daemon, args=(path, received, ready), daemon=True)
    t.start()
    try:
        assert ready.wait(TIMEOUT)
        with tensorbroker.Client(socket=path, name="new") as c:
            try:
                c.metrics()
            except tensorbroker.Error as e:
                assert "TB_ENOTSUP" in str(e) or "not supported" in str(e), str(e)
                assert "does not serve metrics" in str(e), str(e)
            else:
                raise AssertionError("metrics() from an old daemon did not fail")
            # nothing was sent for it, and the session goes on
            assert c.status()["daemon_version"] == "0.0.9"
        t.join(TIMEOUT)
        assert [26] not in received, received
        assert received[:2] == [[10], [22]], received
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_tbctl_metrics_from_old_daemon():
    tmp = tempfile.mkdtemp(prefix="tbmetrics-")
    path = os.path.join(tmp, "old.sock")
    received, ready = [], threading.Event()
    t = threading.Thread(target=fake_old_daemon, args=(path, received, ready), daemon=True)
    t.start()
    try:
        assert ready.wait(TIMEOUT)
        p = subprocess.run([TBCTL, "--socket", path, "metrics"], capture_output=True,
                           text=True, timeout=TIMEOUT)
        assert p.returncode == 1 and p.stdout == "", (p.returncode, p.stdout)
        assert "TB_ENOTSUP" in p.stderr and "does not serve metrics" in p.stderr, p.stderr
        t.join(TIMEOUT)
        assert [26] not in received, received
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_unknown_request_type_is_a_protocol_error_as_before():
    """What a daemon does with a request body it does not know (an old one
    with Metrics): TB_EPROTO, then the connection closes. Hence the client
    checks FEATURE_METRICS first."""
    with daemon() as (sock, _, _log):
        raw = Raw(sock, "future")
        raw.send(99, b"", 42)
        reply = fields(fields(raw.s.recv(1 << 16))[1][0])
        # (a body it does not know leaves the Request without one: undecodable)
        assert raw.status_of(reply) == TB_EPROTO, reply
        assert reply[3] == [b"protocol error: undecodable datagram"], reply
        assert eof(raw.s, data_ok=True)
        raw.close()
        # the same daemon answers Metrics, and says it does in its Hello
        raw = Raw(sock, "now")
        assert raw.status_of(raw.call(26, b"")) == 0
        raw.close()
