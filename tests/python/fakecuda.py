# SPDX-License-Identifier: Apache-2.0
"""The fake CUDA driver (tests/fakecuda) from Python, for the
fakecuda_test_*.py files: the libcuda.so.1 handle with its call log, a
current context and streams, and the DLPack structures a framework reads
from a capsule. Importing it raises tbtest.Skip where libcuda.so.1 is not
the fake (the real driver, or none)."""
import ctypes

import tbtest

try:
    cu = ctypes.CDLL("libcuda.so.1")
    cu.fakecuda_hooks  # only the fake has it
except (OSError, AttributeError):
    raise tbtest.Skip("libcuda.so.1 is not the fake CUDA driver here")

cu.fakecuda_stream_name.restype = ctypes.c_char_p
cu.fakecuda_stream_name.argtypes = [ctypes.c_void_p]
cu.fakecuda_log_count.restype = ctypes.c_size_t
cu.fakecuda_log_count.argtypes = [ctypes.c_char_p]
cu.fakecuda_log_read.restype = ctypes.c_size_t
cu.fakecuda_log_read.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
cu.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
cu.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]


def check(r, what):
    if r != 0:
        raise AssertionError("%s failed: CUresult %d" % (what, r))


def make_context_current():
    """Device 0's primary context, current on this thread."""
    check(cu.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def new_stream():
    """A non-blocking stream of the current context, as an int."""
    s = ctypes.c_void_p()
    check(cu.cuStreamCreate(ctypes.byref(s), 1), "cuStreamCreate")
    return s.value


def settle():
    """The host waits for all work of the current context
    (cuCtxSynchronize): in busy mode the fake then says every event's
    latest record has completed (streams stay busy), so a consumer's next
    done event record may go straight on its stream."""
    check(cu.cuCtxSynchronize(), "cuCtxSynchronize")


def stream_name(s):
    """The stream as the log names it (sN, legacy, ...)."""
    return cu.fakecuda_stream_name(s).decode()


def log_text():
    """This process's call log: lines "<pid> <body>"."""
    n = cu.fakecuda_log_read(None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    cu.fakecuda_log_read(buf, n + 1)
    return buf.value.decode()


def log_bodies():
    """The log's lines without their pid."""
    return [line.split(" ", 1)[1] for line in log_text().splitlines()]


def log_count(body):
    """How many log lines have exactly this body."""
    return cu.fakecuda_log_count(body.encode())


def recorded_on(stream_name):
    """The event the log shows recorded on the stream (its first such
    line), as the log names it; AssertionError when there is none."""
    for b in log_bodies():
        if b.startswith("record ") and b.endswith(" on " + stream_name):
            return b[len("record "):-len(" on " + stream_name)]
    raise AssertionError("no event recorded on %s: %s" % (stream_name, log_bodies()))


# ---- DLPack by hand, as a C consumer or producer library reads it ----

class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [
    ("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]

capi = ctypes.pythonapi
capi.PyCapsule_New.restype = ctypes.py_object
capi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
capi.PyCapsule_GetPointer.restype = ctypes.c_void_p
capi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
capi.PyCapsule_SetName.restype = ctypes.c_int
capi.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
