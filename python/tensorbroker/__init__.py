# SPDX-License-Identifier: Apache-2.0
"""tensorbroker: exchange DLPack tensors between processes without copying.

    import numpy as np, tensorbroker as tb

    with tb.Client(name="producer") as c:          # producer
        a = c.empty((480, 640, 3), np.uint8)        # broker memory: no copy
        a[...] = frame
        v = c.publish("camera0/frames", a, metadata=b"frame 17")

    with tb.Client(name="consumer") as c:          # consumer
        with c.acquire("camera0/frames", timeout=1.0) as lease:
            x = np.from_dlpack(lease)               # read-only view, zero copy

The native part, ``tensorbroker._native``, is a C extension over the public
libtensorbroker API, built for CPython's stable ABI (3.11 and later).
See docs/python.md.
"""

from collections import deque
import math

from . import _native
from ._native import Error, TimeoutError, PermissionError, Lease  # noqa: F401  (re-exported)

__all__ = ["Client", "Lease", "Ring", "HostArray", "CudaArray", "Error", "TimeoutError",
           "PermissionError", "cuda_available", "default_socket_path", "DEVICE_CPU", "DEVICE_CUDA",
           "DEVICE_CUDA_HOST"]
__version__ = _native.library_version

DEVICE_CPU = 1
DEVICE_CUDA = 2
DEVICE_CUDA_HOST = 3

# What stream=None means under each contract (docs/python.md, "Stream
# semantics"), as the integer the DLPack Python protocol uses.
_CONTRACT_STREAM = {"spec": 1, "no_sync": -1, "per_thread": 2}

# Every TB_E* code as a module constant (TB_ETIMEDOUT == -7, ...).
for _name in dir(_native):
    if _name.startswith("TB_E"):
        globals()[_name] = getattr(_native, _name)
del _name


_DEFER = object()  # acquire(stream=...) not given

def _keep_forever(obj):
    """Keep obj alive for the life of the process, and past it: a published
    CUDA tensor whose consumers' reads could not be ordered before its reuse
    when its client let it go (Client._unpin). Its reference is leaked, so
    that it is not destroyed while the interpreter shuts down either (its
    library's deleter may be gone by then)."""
    import ctypes
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


def cuda_available():
    """True when libcuda.so.1 loads and has a device."""
    return _native.cuda_available()


def default_socket_path():
    """$TENSORBROKER_SOCKET, else $XDG_RUNTIME_DIR/tensorbroker.sock, else
    /run/tensorbroker/tensorbroker.sock."""
    return _native.default_socket_path()


def _stream_int(stream):
    """None, an int, or a stream object (torch .cuda_stream, CuPy .ptr)."""
    if stream is None or isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr"):
        value = getattr(stream, attr, None)
        if isinstance(value, int):
            return value if value != 0 else 1  # handle 0 is the legacy stream
    raise TypeError("stream must be None, an int or a CUDA stream object")


def _device_of(obj):
    dev = getattr(obj, "__dlpack_device__", None)
    if dev is None:
        return (DEVICE_CPU, 0)
    t, i = dev()
    return (int(t), int(i))


def _export(obj, stream, host):
    """Take a DLPack capsule from obj, asking for a versioned one first.

    Here tensorbroker is the *consumer* of the caller's array, so for CUDA it
    passes the stream it will record the ready event on; the producer library
    (torch, CuPy, JAX) makes its pending work visible on that stream. Host
    arrays that cannot export DLPack go through the buffer protocol instead,
    or through NumPy's array protocol: bool on NumPy < 2 (BufferError) and
    on PyTorch < 2 (RuntimeError "Bool type is not supported by dlpack").
    """
    dlpack = getattr(obj, "__dlpack__", None)
    if dlpack is None:
        return obj  # buffer protocol (memoryview, bytes, array.array, ...)
    kwargs = {} if host else {"stream": stream}
    try:
        try:
            return dlpack(max_version=(1, 0), **kwargs)
        except TypeError:  # a producer from before DLPack 1.0
            return dlpack(**kwargs)
    except (BufferError, RuntimeError):
        if host:
            view = _host_view(obj)
            if view is not None:
                return view
        raise


def _host_view(obj):
    """obj itself when it exports the buffer protocol, else the NumPy array
    over its memory that its __array__ gives (a CPU torch.Tensor's is a
    view, no copy), else None."""
    try:
        memoryview(obj).release()
        return obj
    except TypeError:
        pass
    np = _numpy()
    if np is None or getattr(obj, "__array__", None) is None:
        return None
    try:
        return np.asarray(obj)
    except Exception:  # the library's own refusal (a tensor that requires grad)
        return None


def _numpy():
    try:
        import numpy
        return numpy
    except ImportError:  # pragma: no cover - numpy is optional
        return None


class Client:
    """A session with tensorbrokerd.

    socket: path of the daemon's socket (None: default_socket_path()).
    name: shown by ``tbctl sessions``.
    stream_contract: what stream=None means on this connection: "spec"
        (legacy default stream, as DLPack says), "no_sync" (-1, the caller
        orders its work, PyTorch's default), "per_thread", or "explicit"
        (stream=None is an error).
    timeout: longest wait for any reply, in seconds (None: 30 s); acquire's
        own timeout is added.
    spin_us: busy polling: poll the socket this many microseconds before
        sleeping in a wait. 0 (default): $TENSORBROKER_SPIN_US if set, else
        50 while the process may run on 4 or more CPUs and none on fewer;
        -1: never. Spends CPU for latency; see docs/benchmarks.md "Busy
        polling".
    prefetch: opening ahead (default True): on a subscribed channel, a
        version in a CUDA buffer this session has not seen arrives with the
        buffer's handle in its new-version notice, and the library opens the
        buffer (and the version's ready event) as it reads that notice, when
        a CUDA context is current on the reading thread; and when a CUDA
        context is current at connect (once the program has used CUDA on
        that thread), the client's done event is made and registered then,
        not by the first
        acquire. False: acquires open what they need, connect prepares
        nothing. See docs/cuda.md "Opening ahead" and "Ready at connect".
    channels: the channels this client means to acquire CUDA tensors from
        (at most 16 names; None: none). The daemon answers the connect with
        the newest CUDA buffer of each, and the first acquire on such a
        channel opens it while the daemon answers that acquire, so that a
        new client's first acquire costs its opens and little more. Ignored
        with prefetch=False. See docs/cuda.md "Channels named at connect".
    """

    def __init__(self, socket=None, name=None, stream_contract="spec", timeout=None,
                 spin_us=0, prefetch=True, channels=None):
        timeout_ms = 0 if timeout is None else max(1, int(math.ceil(timeout * 1000)))
        if isinstance(channels, (str, bytes)):
            raise TypeError("channels: a sequence of channel names, not one name")
        self._c = _native.Client(socket, name, stream_contract, timeout_ms, int(spin_us),
                                 bool(prefetch), None if channels is None else list(channels))
        self._pins = {}          # (channel, version) -> (CUDA tensor, stream)
        self._notices = deque()  # notices read while collecting pins
        self._subscribed = set()
        self.last_publish_zero_copy = None

    # -- lifetime ------------------------------------------------------------
    def close(self):
        """End the session. Arrays from empty() stay valid, and so do tensors
        taken from leases (from_dlpack) and leases not yet released: while
        any is alive the connection stays open underneath and closes with
        the last one, so a version still read is never rewritten under its
        reader. Subscriptions end now. CUDA tensors published from a
        framework's own memory are let go once their consumers' reads are
        ordered before the reuse (see publish()); those of versions still
        read are kept until the process exits."""
        if not self._c.closed:
            for channel, version in list(self._pins):
                self._unpin(channel, version)
            # no notice is read any more: none may pile up for a session
            # that stays open for its leases
            for channel in list(self._subscribed):
                try:
                    self._c.unsubscribe(channel)
                except Error:
                    break           # the daemon is gone: nothing to end
            self._subscribed.clear()
        self._c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    @property
    def closed(self):
        return self._c.closed

    @property
    def session_id(self):
        return self._c.session_id

    @property
    def stream_contract(self):
        """The contract negotiated at connect time ("spec", "no_sync", ...)."""
        return self._c.stream_contract

    def fileno(self):
        """The socket; readable when a notice arrives (see poll_notice)."""
        return self._c.fileno()

    # -- producing -----------------------------------------------------------
    def empty(self, shape, dtype, device="cpu", consumers_may_write=False,
              pinned=False):
        """A writable array in broker memory; publishing it costs no copy.

        dtype: a name ("float32", "bfloat16", ...), a NumPy dtype or a
        framework dtype (torch.float16); TypeError for any other.

        device="cpu": host memory; returns a NumPy array when NumPy is
        importable, else a memoryview, and a HostArray for a dtype that
        has neither (bfloat16 always; float16 and the complex types without
        NumPy), which frameworks take with from_dlpack (torch.from_dlpack(a))
        without a copy. device="cuda" (or "cuda:N", (2, N)):
        a CUDA VMM buffer, which outlives this process once published
        (docs/cuda.md, "VMM buffers"); returns a CudaArray, which every
        framework takes with from_dlpack (torch.from_dlpack(a),
        cupy.from_dlpack(a), jax.dlpack.from_dlpack(a)) without a copy.
        Do not rewrite it while a published version of it is still being
        read (see wait_free()).

        pinned=True (host memory only): pinned host memory (memory kind
        "cuda-host"), registered with CUDA in this process and in each
        consumer that maps it, so that copies to a GPU run at DMA speed;
        consumers get kDLCUDAHost tensors (kDLCPU, the same memory, where no
        CUDA driver loads). A driver that refuses (the memlock limit) raises
        TB_ECUDA naming the kind.
        """
        if isinstance(shape, int):
            shape = (shape,)
        shape = tuple(int(n) for n in shape)
        if any(n < 0 for n in shape):
            raise ValueError("negative dimension in shape")
        cuda = _cuda_ordinal(device)
        code, bits, itemsize = _dl_dtype(dtype)
        name = _DL_NAME_OF[(code, bits)]
        nbytes = math.prod(shape) * itemsize
        if cuda is not None:
            if pinned:
                raise ValueError("pinned=True is host memory; device='cuda' is a "
                                 "CUDA VMM buffer: ask for one or the other")
            buf = self._c.alloc_cuda(nbytes, cuda, consumers_may_write)
            return CudaArray(buf, shape, code, bits, name)
        if device not in ("cpu", DEVICE_CPU, (DEVICE_CPU, 0)):
            _native.raise_error(_native.TB_ENOTSUP,
                                "empty(): device must be 'cpu' or 'cuda', not %r" % (device,))
        np = _numpy()
        buf = self._c.alloc(nbytes, consumers_may_write, pinned)
        if np is not None and name in _NUMPY_NAMES:
            raw = np.frombuffer(buf, dtype=np.uint8, count=nbytes)
            return raw.view(np.dtype(name)).reshape(shape)
        if np is None and (code, bits) in _DL_FORMAT:
            return memoryview(buf).cast("B").cast(_DL_FORMAT[(code, bits)], shape)
        return HostArray(buf, shape, code, bits, name)

    def publish(self, channel, obj, stream=None, metadata=None, history_depth=0):
        """Publish obj (anything with __dlpack__, or a host buffer) as the next
        version of channel; returns the version number.

        - CUDA memory is published without a copy. tensorbroker asks obj for
          its DLPack capsule on the stream it will record the ready event on
          (stream, or under stream=None the contract's stream), and keeps the
          tensor alive until the version is free; then that stream waits
          for the consumers' done events before the tensor is let go, so a
          caching allocator's next allocation on it (publish on the stream
          the tensor was made on) cannot overwrite what they still read.
        - Host memory from empty() goes without a copy. Any other host memory
          is COPIED into a new broker buffer first (one memcpy), so it may be
          reused as soon as publish() returns.
        metadata: bytes (or str, sent as UTF-8) delivered with the version.
        history_depth: versions the channel keeps (0: leave as it is).
        """
        s = _stream_int(stream)
        dev = _device_of(obj)
        if dev[0] == DEVICE_CUDA:
            if s is None:
                contract = self._c.stream_contract
                if contract not in _CONTRACT_STREAM:
                    _native.raise_error(_native.TB_ESTREAM,
                                        "the 'explicit' contract needs publish(stream=...)")
                dl_stream = _CONTRACT_STREAM[contract]
            else:
                dl_stream = s
            src = _export(obj, dl_stream, host=False)
        elif dev[0] in (DEVICE_CPU, DEVICE_CUDA_HOST):
            if s is not None:
                raise ValueError("host tensors take no stream")
            src = _export(obj, None, host=True)
        else:
            _native.raise_error(_native.TB_EDEVICE,
                                "device type %d cannot be published" % dev[0])
        version, pin, zero_copy = self._c.publish(channel, src, s, metadata, history_depth)
        self.last_publish_zero_copy = zero_copy
        if pin is not None:
            self._pins[(channel, version)] = (pin, dl_stream)
            self._collect_pins()
        return version

    def wait_free(self, channel, version, timeout=None, stream=None):
        """Wait until no consumer reads version any more (so its memory may be
        rewritten). Device memory: stream is made to wait for the consumers'
        done events; the host does not block on the GPU. Pinned host memory
        with stream=None: the host blocks until the consumers' GPU reads of
        it are done. Raises TimeoutError when the wait runs out, and
        tensorbroker.Error TB_EBUSY at once for timeout=0 on a version
        still read."""
        self._c.wait_free(channel, version, timeout, _stream_int(stream))
        self._pins.pop((channel, version), None)

    def ring(self, channel, shape, dtype, slots=3, device="cpu", pinned=False,
             consumers_may_write=False, history_depth=1):
        """A producer's ring of `slots` arrays from empty() (same shape, dtype,
        device and pinned) for the versions of channel: write each frame
        into the array ring.next() returns and publish it with
        ring.publish(). next() waits until the version last published from
        that array is free (wait_free), so a frame is never rewritten while
        a consumer still reads it. history_depth (below slots) is the
        channel's; 2 to 1024 slots. See Ring."""
        return Ring(self, channel, shape, dtype, slots, device, pinned,
                    consumers_may_write, history_depth)

    # -- consuming -----------------------------------------------------------
    def acquire(self, channel, after=None, timeout=None, exact=None, stream=_DEFER,
                release=None, release_stream=None):
        """Lease a version of channel: the newest (default), the first newer
        than after=, or exactly exact=. timeout in seconds (None: forever,
        0: do not wait); a signal ends the wait as Python's handler says
        (Ctrl-C: KeyboardInterrupt, the daemon forgetting the wait). Returns
        a Lease: pass it to numpy/torch/cupy/jax
        from_dlpack, and release it (or use it as a context manager).

        By default no stream wait happens here: the wait is applied when the
        consumer library calls lease.__dlpack__(stream=...). Passing stream=
        (None: the contract's stream, -1, an int or a stream object) applies
        the wait for a CUDA version now instead, and __dlpack__ then adds
        none.

        release=: a Lease from this client to release in the same request,
        as lease.release(stream=release_stream) would (CUDA: its done event
        on release_stream, None meaning the contract's stream): a loop of
        "release the last frame, take the next" costs one round trip to the
        daemon instead of two messages. The lease ends whatever becomes of
        the acquire (a timeout included); if a consumer library still holds
        its tensor, it ends when that tensor goes, as with release()."""
        kw = {}
        if stream is not _DEFER:
            kw["stream"] = _stream_int(stream)
        if release is not None:
            kw["release"] = release
            kw["release_stream"] = _stream_int(release_stream)
        elif release_stream is not None:
            raise ValueError("release_stream= goes with release=")
        return self._c.acquire(channel, after, timeout, exact, **kw)

    # -- notices -------------------------------------------------------------
    def subscribe(self, channel):
        self._c.subscribe(channel)
        self._subscribed.add(channel)

    def unsubscribe(self, channel):
        self._c.unsubscribe(channel)
        self._subscribed.discard(channel)

    def poll_notice(self, timeout=0):
        """The oldest notice as a dict, or None when none came within timeout
        seconds (None: wait forever)."""
        if self._notices:
            return self._notices.popleft()
        n = self._c.poll_notice(timeout)
        if n is not None and n["type"] == "version_free":
            self._unpin(n["channel"], n["version"])
        return n

    def _collect_pins(self):
        # Let go of CUDA tensors whose versions are free; keep the other
        # notices for poll_notice().
        while True:
            n = self._c.poll_notice(0)
            if n is None:
                return
            if n["type"] == "version_free":
                self._unpin(n["channel"], n["version"])
            self._notices.append(n)

    def _unpin(self, channel, version):
        # A framework's caching allocator hands the memory of a tensor let
        # go to the next allocation on its stream at once: that stream (the
        # one it was published on) first waits for the consumers' done
        # events (the application's own wait_free later waits again). A
        # version that cannot be waited for (still read, or its readers out
        # of reach) keeps its tensor until the process exits.
        entry = self._pins.pop((channel, version), None)
        if entry is None:
            return
        pin, stream = entry
        try:
            self._c.wait_free(channel, version, 0, stream)
        except Error:
            _keep_forever(pin)

    # -- introspection -------------------------------------------------------
    def channels(self):
        return self._c.channels()

    def sessions(self):
        return self._c.sessions()

    def leases(self):
        """Every lease the daemon holds, as dicts (``tbctl leases --json``):
        lease_id, session_id, pid, uid, session_name, channel, version, bytes,
        memory_kind, age_ms, buffer_id, ready_event, done_events, died."""
        return self._c.leases()

    def waits(self):
        """Every parked request (a session may have several), as dicts
        (``tbctl waits --json``): session_id, pid, uid, session_name, what ("acquire-latest",
        "acquire-next", "acquire-exact", "wait-free"), channel, version,
        age_ms, timeout_ms (-1: none), leases and in_history (for
        "wait-free")."""
        return self._c.waits()

    def buffers(self):
        """Every buffer the daemon holds, as dicts (``tbctl buffers
        --json``): buffer_id, memory_kind, size, device ("cpu", "cuda:N",
        "cuda-host"), device_type, device_id, device_uuid (hex, "" for
        host memory), session_id, pid, uid, session_name (0 and "" once
        that session ended), retired, versions, leases, writable, signal_offset,
        survives_producer. Retired buffers are listed while versions of
        them are held. Raises tensorbroker.Error TB_ENOTSUP from a daemon
        older than the buffers view."""
        return self._c.buffers()

    def drop(self, channel):
        """Free closed channel ``channel`` and its versions now
        (``tbctl drop``); raises tensorbroker.Error when it is open, leased,
        unknown, or the daemon's access rules do not let the caller publish
        onto it (tensorbroker.PermissionError)."""
        self._c.drop(channel)

    def status(self):
        return self._c.status()

    def metrics(self):
        """The daemon's metrics as Prometheus text (exposition format
        0.0.4; docs/deploy.md lists them). Raises tensorbroker.Error
        (TB_ENOTSUP) for a daemon that predates metrics."""
        return self._c.metrics()


def _cuda_ordinal(device):
    """The CUDA ordinal device names, or None for a host device."""
    if isinstance(device, str):
        if device == "cuda":
            return 0
        if device.startswith("cuda:"):
            return int(device[5:])
        return None
    if isinstance(device, tuple) and len(device) == 2 and device[0] == DEVICE_CUDA:
        return int(device[1])
    return None


# (DLPack type code, bits, bytes) by name; the codes: kDLInt 0, kDLUInt 1,
# kDLFloat 2, kDLBfloat 4, kDLComplex 5, kDLBool 6
_DL_NAMES = {"bfloat16": (4, 16, 2), "float16": (2, 16, 2), "float32": (2, 32, 4),
             "float64": (2, 64, 8), "int8": (0, 8, 1), "int16": (0, 16, 2),
             "int32": (0, 32, 4), "int64": (0, 64, 8), "uint8": (1, 8, 1),
             "uint16": (1, 16, 2), "uint32": (1, 32, 4), "uint64": (1, 64, 8),
             "bool": (6, 8, 1), "complex64": (5, 64, 8), "complex128": (5, 128, 16)}


# the canonical name of each (code, bits)
_DL_NAME_OF = {(code, bits): name for name, (code, bits, _) in _DL_NAMES.items()}
# the names NumPy has a dtype for: all but bfloat16
_NUMPY_NAMES = frozenset(_DL_NAMES) - {"bfloat16"}
# struct formats of one native item (the buffer protocol's, memoryview's),
# taken as dtypes with or without NumPy
_FORMAT_DL = {"?": _DL_NAMES["bool"], "b": _DL_NAMES["int8"], "B": _DL_NAMES["uint8"],
              "h": _DL_NAMES["int16"], "H": _DL_NAMES["uint16"],
              "i": _DL_NAMES["int32"], "I": _DL_NAMES["uint32"],
              "q": _DL_NAMES["int64"], "Q": _DL_NAMES["uint64"],
              "e": _DL_NAMES["float16"], "f": _DL_NAMES["float32"], "d": _DL_NAMES["float64"]}
# the formats memoryview.cast takes ("e" is not one), by (code, bits): the
# host arrays empty() makes without NumPy
_DL_FORMAT = {(code, bits): fmt for fmt, (code, bits, _) in _FORMAT_DL.items() if fmt != "e"}


def _dl_dtype(dtype):
    """(DLPack code, bits, bytes per element) of dtype: a name such as
    "float32" or "bfloat16", a struct format ("f", "B"), a NumPy dtype, or a
    framework dtype whose str ends in such a name (torch.float16,
    torch.bfloat16). TypeError for anything else."""
    if isinstance(dtype, str) and dtype in _FORMAT_DL:
        return _FORMAT_DL[dtype]
    name = str(dtype).rsplit(".", 1)[-1]
    if name in _DL_NAMES:
        return _DL_NAMES[name]
    np = _numpy()
    if np is not None:
        try:
            dt = np.dtype(dtype)
        except TypeError:
            dt = None
        if dt is not None and dt.name in _NUMPY_NAMES:
            if not dt.isnative:
                raise TypeError("unsupported dtype %r: tensors are exchanged in native "
                                "byte order, not %s" % (dtype, dt.str))
            return _DL_NAMES[dt.name]
    raise TypeError("unsupported dtype %r: tensorbroker takes %s, their NumPy dtypes "
                    "and framework dtypes of those names"
                    % (dtype, ", ".join(sorted(_DL_NAMES))))


class _BrokerArray:
    """An array in a broker buffer, exported by DLPack only."""

    def __init__(self, buf, shape, code, bits, dtype_name):
        self._buf = buf
        self.shape = shape
        self.dtype = dtype_name
        self._code = code
        self._bits = bits

    @property
    def data_ptr(self):
        """The address of element 0."""
        return self._buf.address

    @property
    def nbytes(self):
        return math.prod(self.shape) * self._bits // 8

    @property
    def buffer_id(self):
        return self._buf.id

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if dl_device is not None and tuple(dl_device) != self.device:
            raise BufferError("a %s lives on %r; tensorbroker does not copy it to %r"
                              % (type(self).__name__, self.device, tuple(dl_device)))
        if copy:
            raise BufferError("copy=True is not supported: copy in the consumer library")
        # A new buffer has no pending work: no stream needs to wait.
        versioned = max_version is not None and tuple(max_version)[0] >= 1
        return self._buf.dlpack(self.shape, self._code, self._bits, 1, versioned)

    def __repr__(self):
        return "%s(shape=%r, dtype=%r, buffer_id=%d)" % (
            type(self).__name__, self.shape, self.dtype, self.buffer_id)


class CudaArray(_BrokerArray):
    """An array in a CUDA VMM buffer (Client.empty(device="cuda")): device
    memory that frameworks import with from_dlpack, without a copy, and
    that tensorbroker publishes without a copy. The memory stays while this
    object or any tensor imported from it lives."""

    @property
    def device(self):
        return (DEVICE_CUDA, self._buf.cuda_device)

    @property
    def data_ptr(self):
        """The device pointer (CUdeviceptr) of element 0."""
        return self._buf.address


class HostArray(_BrokerArray):
    """An array in a broker host buffer (Client.empty() of a dtype NumPy
    lacks, such as bfloat16): kDLCPU memory that frameworks import with
    from_dlpack (torch.from_dlpack(a)) without a copy, and write through;
    tensorbroker publishes it, and any tensor imported from it, without a
    copy. A pinned one (pinned=True) goes out as kDLCPU too: consumers get
    kDLCUDAHost. The memory stays while this object or any tensor imported
    from it lives."""

    @property
    def device(self):
        return (DEVICE_CPU, 0)

    @property
    def pinned(self):
        """This process's mapping is registered with CUDA."""
        return self._buf.pinned

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if stream is not None:
            raise BufferError("stream must be None for host (kDLCPU) memory, as the "
                              "DLPack protocol says")
        return super().__dlpack__(max_version=max_version, dl_device=dl_device, copy=copy)


def _address(obj):
    """The address of obj's first element, or None when obj does not say."""
    ai = getattr(obj, "__array_interface__", None)
    if ai is not None:
        return ai["data"][0]
    dp = getattr(obj, "data_ptr", None)
    if dp is not None:
        return dp() if callable(dp) else dp
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return cai["data"][0]
    return None


class Ring:
    """A producer's ring of arrays in broker memory for one channel
    (Client.ring()). Not thread-safe: one thread drives a ring.

        ring = client.ring("frames", (1080, 1920, 3), "uint8", slots=3, pinned=True)
        while True:
            frame = ring.next()        # waits until no consumer reads it
            decode_into(frame)
            ring.publish()             # or ring.publish(view_of_frame)
    """

    def __init__(self, client, channel, shape, dtype, slots, device, pinned,
                 consumers_may_write, history_depth):
        slots = int(slots)
        history_depth = int(history_depth)
        if not 2 <= slots <= 1024:
            raise ValueError("a ring has 2 to 1024 slots, not %d" % slots)
        if not 1 <= history_depth < slots:
            raise ValueError("history_depth must be 1 to slots - 1 (%d): a slot is "
                             "rewritten only once its version has left the channel's "
                             "history" % (slots - 1))
        self._client = client
        self.channel = channel
        self.history_depth = history_depth
        self.slots = [client.empty(shape, dtype, device=device,
                                   consumers_may_write=consumers_may_write,
                                   pinned=pinned) for _ in range(slots)]
        self._versions = [0] * slots
        self._next = 0
        self._cur = None
        self._cuda = _device_of(self.slots[0])[0] == DEVICE_CUDA
        self._stream = None

    def next(self, timeout=None, stream=None):
        """The next slot's array, once the version last published from it is
        free: wait_free(timeout, stream), so for device memory stream waits
        on the GPU and for pinned host memory (stream None) the host waits.
        Raises TimeoutError when the wait runs out (TB_EBUSY for
        timeout=0); the same slot comes next time. For device memory,
        write the slot on that stream and publish with the same one
        (ValueError otherwise): the reuse is ordered on it alone."""
        if self._cur is not None:
            # handed out and not published: ordered on that call's stream
            # alone (its readers were waited for once, there)
            if self._cuda and self._stream_of(stream) != self._stream:
                raise ValueError("ring.next(stream=%r): the slot handed out for "
                                 "stream %r is not published; ask for it on that "
                                 "stream" % (stream, self._stream))
            return self.slots[self._cur]
        i = self._next
        if self._versions[i] != 0:
            self._client.wait_free(self.channel, self._versions[i], timeout=timeout,
                                   stream=stream)
            self._versions[i] = 0
        self._cur = i
        self._stream = self._stream_of(stream)
        return self.slots[i]

    def _stream_of(self, stream):
        """stream as the connection's contract reads it (None, 0: its own)."""
        s = _stream_int(stream)
        if s is None or s == 0:
            return _CONTRACT_STREAM.get(self._client.stream_contract)
        return s

    def publish(self, obj=None, stream=None, metadata=None):
        """Publish the array next() returned (obj None), or a view of part of
        it, or a framework tensor over it, as the channel's next version;
        returns the version. stream: as for Client.publish (device memory)."""
        if self._cur is None:
            raise RuntimeError("ring.publish() without ring.next(): take a slot first")
        if self._cuda and self._stream_of(stream) != self._stream:
            # the slot's reuse was ordered on next()'s stream only: writes on
            # another may overtake the consumers' reads (a side stream does
            # not wait for the legacy one)
            raise ValueError("ring.publish(stream=%r) after ring.next(stream=%r): "
                             "the slot came back ordered on next()'s stream only; "
                             "pass the stream that writes the slot to both"
                             % (stream, self._stream))
        slot = self.slots[self._cur]
        if obj is None:
            obj = slot
        else:
            start, at = _address(slot), _address(obj)
            size = getattr(slot, "nbytes", None)
            if start is None or at is None or size is None:
                raise TypeError("ring.publish(obj): obj's address is unknown here; "
                                "publish the slot itself (obj=None)")
            if not start <= at < start + max(size, 1):
                raise ValueError("ring.publish(obj): obj does not lie in the slot "
                                 "ring.next() returned")
        version = self._client.publish(self.channel, obj, stream=stream,
                                       metadata=metadata,
                                       history_depth=self.history_depth)
        self._versions[self._cur] = version
        self._next = (self._cur + 1) % len(self.slots)
        self._cur = None
        return version

