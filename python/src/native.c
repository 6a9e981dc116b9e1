/* SPDX-License-Identifier: Apache-2.0 */
/* tensorbroker._native: the CPython extension under the tensorbroker package.
 *
 * It is a thin layer over the public client API (tensorbroker.h) and nothing
 * else: no protocol code lives here. It is written against the stable ABI
 * (Py_LIMITED_API 3.11), so one build imports on CPython 3.11 and later.
 *
 * Objects:
 *  - Client: one tb_client. Calls release the GIL while they wait.
 *  - Buffer: a broker host buffer (tb_buffer_create_host) exposed through the
 *    buffer protocol, writable; empty() in Python views it with NumPy. It
 *    also exports DLPack (dlpack()): a CUDA VMM buffer only that way, a host
 *    buffer that way for dtypes NumPy lacks (bfloat16).
 *  - Lease: one acquired version. It hands out DLPack capsules (versioned or
 *    legacy) and read-only buffer views. The tensor from tb_lease_acquire
 *    lives in a reference-counted core: the Lease holds one reference and
 *    every capsule or buffer view handed out holds one, so the lease ends
 *    when the last of them lets go, whichever order that happens in and on
 *    whatever thread a consumer library runs its deleter.
 */
#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tensorbroker/tensorbroker.h>

#define TBPY_ERRMSG_MAX 512

/* Lease.__dlpack__(stream=s) makes s wait for the producer's ready event
 * with tb_lease_wait (an external wait when s is capturing). */
#define tbpy_lease_wait tb_lease_wait

static PyObject *ErrorType;   /* tensorbroker.Error */
static PyObject *TimeoutType; /* tensorbroker.TimeoutError(Error, TimeoutError) */
static PyObject *PermissionType; /* tensorbroker.PermissionError(Error,
                                    PermissionError): TB_EPERM */
static PyObject *ClientType;
static PyObject *BufferType;
static PyObject *LeaseType;

/* ---- errors ---------------------------------------------------------- */

/* Raise tensorbroker.Error (or its TimeoutError) carrying code, name and
 * message. Returns NULL for convenience. */
static PyObject *raise_tb(int code, const char *message) {
  PyObject *type = code == TB_ETIMEDOUT ? TimeoutType
                   : code == TB_EPERM  ? PermissionType
                                       : ErrorType;
  const char *name = tb_err_name(code);
  if (message == NULL || message[0] == '\0')
    message = tb_strerror(code);
  PyObject *text = PyUnicode_FromFormat("%s: %s", name, message);
  if (text == NULL)
    return NULL;
  PyObject *exc = PyObject_CallFunctionObjArgs(type, text, NULL);
  Py_DECREF(text);
  if (exc == NULL)
    return NULL;
  PyObject *pcode = PyLong_FromLong(code);
  PyObject *pname = PyUnicode_FromString(name);
  PyObject *pmsg = PyUnicode_FromString(message);
  if (pcode && pname && pmsg && PyObject_SetAttrString(exc, "code", pcode) == 0 &&
      PyObject_SetAttrString(exc, "name", pname) == 0 &&
      PyObject_SetAttrString(exc, "message", pmsg) == 0)
    PyErr_SetObject(type, exc);
  Py_XDECREF(pcode);
  Py_XDECREF(pname);
  Py_XDECREF(pmsg);
  Py_DECREF(exc);
  return NULL;
}

/* ---- streams ----------------------------------------------------------- */

/* Convert a Python stream value to the library's void *: None -> NULL (the
 * contract's default), -1 -> TB_STREAM_NO_SYNC, n >= 0 -> (void *)n. */
static int stream_from_py(PyObject *o, void **out) {
  if (o == NULL || o == Py_None) {
    *out = TB_STREAM_DEFAULT;
    return 0;
  }
  if (!PyLong_Check(o)) {
    /* torch.cuda.Stream has .cuda_stream, cupy's Stream .ptr */
    PyObject *attr = NULL;
    if (PyObject_HasAttrString(o, "cuda_stream"))
      attr = PyObject_GetAttrString(o, "cuda_stream");
    else if (PyObject_HasAttrString(o, "ptr"))
      attr = PyObject_GetAttrString(o, "ptr");
    if (attr == NULL || !PyLong_Check(attr)) {
      Py_XDECREF(attr);
      if (!PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError,
                        "stream must be None, an int, or a stream object with "
                        ".cuda_stream or .ptr");
      return -1;
    }
    /* a stream object whose handle is 0 is the legacy stream (torch's
     * default stream); only a bare 0 is ambiguous */
    int overflow = 0;
    long long h = PyLong_AsLongLongAndOverflow(attr, &overflow);
    int rc;
    if (h == -1 && PyErr_Occurred()) {
      rc = -1;
    } else if (h == 0 && overflow == 0) {
      *out = TB_STREAM_LEGACY;
      rc = 0;
    } else {
      rc = stream_from_py(attr, out);
    }
    Py_DECREF(attr);
    return rc;
  }
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (v == -1 && PyErr_Occurred())
    return -1;
  if (overflow > 0) {
    unsigned long long u = PyLong_AsUnsignedLongLong(o);
    if (u == (unsigned long long)-1 && PyErr_Occurred())
      return -1;
    *out = (void *)(uintptr_t)u;
    return 0;
  }
  if (overflow < 0 || v < -1) {
    PyErr_SetString(PyExc_ValueError, "stream must be >= -1");
    return -1;
  }
  if (v == 0) {
    PyErr_SetString(PyExc_ValueError,
                    "stream 0 is ambiguous and disallowed by DLPack; pass 1 (legacy "
                    "default stream), 2 (per-thread), -1 (no sync) or a CUstream");
    return -1;
  }
  *out = (void *)(intptr_t)v;
  return 0;
}

/* ---- dtypes and layouts -------------------------------------------------- */

/* PEP 3118 format for a DLPack dtype; NULL when it has none. */
static const char *format_of(DLDataType dt) {
  if (dt.lanes != 1)
    return NULL;
  switch (dt.code) {
  case TB_DTYPE_BOOL:
    return dt.bits == 8 ? "?" : NULL;
  case TB_DTYPE_INT:
    return dt.bits == 8 ? "b" : dt.bits == 16 ? "h" : dt.bits == 32 ? "i" : dt.bits == 64 ? "q" : NULL;
  case TB_DTYPE_UINT:
    return dt.bits == 8 ? "B" : dt.bits == 16 ? "H" : dt.bits == 32 ? "I" : dt.bits == 64 ? "Q" : NULL;
  case TB_DTYPE_FLOAT:
    return dt.bits == 16 ? "e" : dt.bits == 32 ? "f" : dt.bits == 64 ? "d" : NULL;
  case TB_DTYPE_COMPLEX:
    return dt.bits == 64 ? "Zf" : dt.bits == 128 ? "Zd" : NULL;
  default:
    return NULL;
  }
}

/* DLPack dtype for a PEP 3118 format of one item; -1 when not representable. */
static int dtype_from_format(const char *fmt, Py_ssize_t itemsize, DLDataType *out) {
  if (fmt == NULL)
    fmt = "B";
  if (*fmt == '@' || *fmt == '=' || *fmt == '<')
    fmt++;
  else if ((*fmt == '>' || *fmt == '!') && itemsize != 1)
    return -1; /* big-endian data on a little-endian machine */
  else if (*fmt == '>' || *fmt == '!')
    fmt++;
  int code;
  if (strcmp(fmt, "?") == 0)
    code = TB_DTYPE_BOOL;
  else if (strlen(fmt) == 1 && strchr("bhilq", fmt[0]) != NULL)
    code = TB_DTYPE_INT;
  else if (strlen(fmt) == 1 && strchr("BHILQ", fmt[0]) != NULL)
    code = TB_DTYPE_UINT;
  else if (strlen(fmt) == 1 && strchr("efd", fmt[0]) != NULL)
    code = TB_DTYPE_FLOAT;
  else if (strcmp(fmt, "Zf") == 0 || strcmp(fmt, "Zd") == 0 || strcmp(fmt, "Ze") == 0)
    code = TB_DTYPE_COMPLEX;
  else
    return -1;
  if (itemsize <= 0 || itemsize > 16)
    return -1;
  out->code = (uint8_t)code;
  out->bits = (uint8_t)(itemsize * 8);
  out->lanes = 1;
  return 0;
}

static size_t itemsize_of(DLDataType dt) {
  return ((size_t)dt.bits * dt.lanes + 7) / 8;
}

/* Lowest and one-past-highest byte touched by t, relative to t->data. Returns
 * false for an empty tensor. */
static bool byte_extent(const DLTensor *t, int64_t *lo, int64_t *hi) {
  int64_t low = (int64_t)t->byte_offset, high = low;
  int64_t item = (int64_t)itemsize_of(t->dtype);
  int64_t compact = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    int64_t n = t->shape[i];
    if (n == 0)
      return false;
    int64_t st = t->strides ? t->strides[i] : compact;
    compact *= n;
    int64_t span = (n - 1) * st * item;
    if (span < 0)
      low += span;
    else
      high += span;
  }
  *lo = low;
  *hi = high + item;
  return true;
}

/* ---- session and lease core -------------------------------------------- */

/* The session under a Client. The Client holds one reference and every
 * lease core one, so that a tensor still alive when its Client is closed
 * (or collected) keeps the session, and so its lease: the producer does
 * not rewrite that version under it. The last reference disconnects, on
 * whatever thread drops it (a consumer library's deleter may run on any);
 * by then the Client makes no call. */
struct session_ref {
  tb_client *c;
  atomic_int refs;
};

static struct session_ref *session_get(struct session_ref *s) {
  if (s != NULL)
    atomic_fetch_add(&s->refs, 1);
  return s;
}

static void session_put(struct session_ref *s) {
  if (s == NULL || atomic_fetch_sub(&s->refs, 1) != 1)
    return;
  tb_client_disconnect(s->c);
  free(s);
}

struct lease_core {
  DLManagedTensorVersioned *mt; /* from tb_lease_acquire; ends the lease when freed */
  struct session_ref *sess;     /* the session the lease ends on */
  atomic_int refs;
};

static void core_get(struct lease_core *core) {
  atomic_fetch_add(&core->refs, 1);
}

/* Drop one reference; the last one ends the lease through the tensor's own
 * deleter, which the library makes safe from any thread. No Python here: a
 * consumer library may call this without the GIL. */
static void core_put(struct lease_core *core) {
  if (atomic_fetch_sub(&core->refs, 1) != 1)
    return;
  if (core->mt != NULL)
    core->mt->deleter(core->mt);
  session_put(core->sess);
  free(core);
}

/* A capsule's tensor: a wrapper pointing into the core's tensor, with its own
 * strides when the library gave none (DLPack >= 1.2 wants them filled). */
struct export_v {
  DLManagedTensorVersioned t;
  struct lease_core *core;
  int64_t strides[];
};
struct export_l {
  DLManagedTensor t;
  struct lease_core *core;
  int64_t strides[];
};

static void export_v_deleter(DLManagedTensorVersioned *self) {
  struct export_v *e = self->manager_ctx;
  core_put(e->core);
  free(e);
}

static void export_l_deleter(DLManagedTensor *self) {
  struct export_l *e = self->manager_ctx;
  core_put(e->core);
  free(e);
}

/* Capsule destructors: a capsule nobody consumed still owns its tensor. */
static void capsule_v_destructor(PyObject *cap) {
  if (!PyCapsule_IsValid(cap, "dltensor_versioned"))
    return;
  DLManagedTensorVersioned *t = PyCapsule_GetPointer(cap, "dltensor_versioned");
  if (t && t->deleter)
    t->deleter(t);
}

static void capsule_l_destructor(PyObject *cap) {
  if (!PyCapsule_IsValid(cap, "dltensor"))
    return;
  DLManagedTensor *t = PyCapsule_GetPointer(cap, "dltensor");
  if (t && t->deleter)
    t->deleter(t);
}

/* ---- Lease ----------------------------------------------------------- */

typedef struct {
  PyObject_HEAD
  struct lease_core *core; /* NULL once released */
  DLDevice device;
  uint64_t version, lease_id, buffer_id;
  uint32_t producer_pid;
  int memory_kind;
  PyObject *channel;  /* str */
  PyObject *metadata; /* bytes */
  PyObject *shape;    /* tuple */
  int handed_out;     /* capsules given out (informational) */
  uint64_t owner;     /* serial of the Client it came from */
} LeaseObject;

static int lease_check(LeaseObject *self) {
  if (self->core == NULL) {
    raise_tb(TB_ESTALE, "lease already released");
    return -1;
  }
  return 0;
}

static void lease_dealloc(LeaseObject *self) {
  PyTypeObject *tp = Py_TYPE((PyObject *)self);
  if (self->core != NULL) {
    struct lease_core *core = self->core;
    self->core = NULL;
    Py_BEGIN_ALLOW_THREADS
    core_put(core);
    Py_END_ALLOW_THREADS
  }
  Py_XDECREF(self->channel);
  Py_XDECREF(self->metadata);
  Py_XDECREF(self->shape);
  freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
  tp_free(self);
  Py_DECREF(tp);
}

static PyObject *lease_new_from(DLManagedTensorVersioned *mt,
                                struct session_ref *sess) {
  struct tb_lease_info info;
  int rc = tb_lease_get_info(mt, sizeof(info), &info);
  if (rc < 0) {
    mt->deleter(mt);
    return raise_tb(rc, "tb_lease_get_info");
  }
  struct lease_core *core = malloc(sizeof(*core));
  if (core == NULL) {
    mt->deleter(mt);
    return PyErr_NoMemory();
  }
  core->mt = mt;
  core->sess = session_get(sess);
  atomic_init(&core->refs, 1);
  LeaseObject *self = (LeaseObject *)PyType_GenericAlloc((PyTypeObject *)LeaseType, 0);
  if (self == NULL) {
    core_put(core);
    return NULL;
  }
  self->core = core;
  self->device = mt->dl_tensor.device;
  self->version = info.version;
  self->lease_id = info.lease_id;
  self->buffer_id = info.buffer_id;
  self->producer_pid = info.producer_pid;
  self->memory_kind = info.memory_kind;
  self->channel = PyUnicode_FromString(info.channel ? info.channel : "");
  self->metadata = PyBytes_FromStringAndSize(info.metadata ? info.metadata : "",
                                             (Py_ssize_t)info.metadata_len);
  self->shape = PyTuple_New(mt->dl_tensor.ndim);
  if (self->channel == NULL || self->metadata == NULL || self->shape == NULL) {
    Py_DECREF(self);
    return NULL;
  }
  for (int i = 0; i < mt->dl_tensor.ndim; i++) {
    PyObject *n = PyLong_FromLongLong(mt->dl_tensor.shape[i]);
    if (n == NULL || PyTuple_SetItem(self->shape, i, n) < 0) {
      Py_DECREF(self);
      return NULL;
    }
  }
  return (PyObject *)self;
}

static PyObject *lease_dlpack_device(LeaseObject *self, PyObject *unused) {
  if (lease_check(self) < 0)
    return NULL;
  return Py_BuildValue("(ii)", (int)self->device.device_type, (int)self->device.device_id);
}

/* Fill compact row-major strides (in elements) for t into out. */
static void compact_strides(const DLTensor *t, int64_t *out) {
  int64_t s = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    out[i] = s;
    s *= t->shape[i] > 0 ? t->shape[i] : 1;
  }
}

static PyObject *lease_dlpack(LeaseObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
  PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOO:__dlpack__", kwlist, &stream,
                                   &max_version, &dl_device, &copy))
    return NULL;
  if (lease_check(self) < 0)
    return NULL;
  DLManagedTensorVersioned *mt = self->core->mt;
  struct lease_core *held = NULL; /* a reference taken for the capsule */
  bool is_cuda = self->device.device_type == kDLCUDA;
  bool as_cpu = false; /* a kDLCUDAHost lease handed out as kDLCPU */

  if (dl_device != Py_None) {
    long dt, di;
    if (!PyArg_ParseTuple(dl_device, "ll:dl_device", &dt, &di))
      return NULL;
    /* pinned host memory is host memory: asked for as kDLCPU (a consumer
     * that does not know kDLCUDAHost), the same pages go out so labelled */
    as_cpu = self->device.device_type == kDLCUDAHost && dt == kDLCPU && di == 0;
    if (!as_cpu &&
        (dt != (long)self->device.device_type || di != (long)self->device.device_id)) {
      PyErr_Format(PyExc_BufferError,
                   "the lease lives on device (%d, %d) and tensorbroker does not copy "
                   "across devices; dl_device=(%ld, %ld) cannot be honoured",
                   (int)self->device.device_type, (int)self->device.device_id, dt, di);
      return NULL;
    }
  }
  if (copy != Py_None) {
    int want = PyObject_IsTrue(copy);
    if (want < 0)
      return NULL;
    if (want) {
      PyErr_SetString(PyExc_BufferError,
                      "copy=True is not supported: a lease is a view of the producer's "
                      "memory; copy it in the consumer library instead");
      return NULL;
    }
  }
  bool versioned = false;
  if (max_version != Py_None) {
    long major, minor;
    if (!PyArg_ParseTuple(max_version, "ll:max_version", &major, &minor))
      return NULL;
    versioned = major >= 1;
  }
  /* Pinned host memory (kDLCUDAHost) is read by a GPU on a stream too: the
   * stream a consumer names is remembered, and the lease's end recorded
   * after it (docs/cuda.md, "Pinned host memory"). */
  bool streamed = is_cuda || (self->device.device_type == kDLCUDAHost && !as_cpu);
  if (!streamed && stream != Py_None) {
    PyErr_SetString(PyExc_BufferError,
                    "stream must be None for a host (kDLCPU) lease, as the DLPack "
                    "protocol says");
    return NULL;
  }
  /* a CUDA lease: None is the contract's default stream, which waits */
  if (is_cuda || (streamed && stream != Py_None)) {
    void *s;
    if (PyLong_Check(stream) && PyObject_Not(stream) == 1) {
      PyErr_SetString(PyExc_BufferError,
                      "stream 0 is ambiguous and disallowed by DLPack; pass 1 (legacy), "
                      "2 (per-thread) or a CUstream");
      return NULL;
    }
    if (stream_from_py(stream, &s) < 0)
      return NULL;
    /* Also when acquire(stream=) waited already: this stream waits too,
     * and the lease remembers it, so that its end is recorded after the
     * consumer's work on it (the library does not wait twice for a
     * version whose work had finished). */
    if (s != TB_STREAM_NO_SYNC) {
      /* Another thread may release the lease while this one waits without
       * the GIL: a reference of our own keeps the core and its tensor, and
       * becomes the capsule's. */
      struct lease_core *core = self->core;
      int rc;
      core_get(core);
      Py_BEGIN_ALLOW_THREADS
      rc = tbpy_lease_wait(mt, s);
      Py_END_ALLOW_THREADS
      if (rc < 0) {
        core_put(core);
        return raise_tb(rc, NULL);
      }
      held = core;
    }
  }

  const DLTensor *src = &mt->dl_tensor;
  size_t extra = (src->strides == NULL && src->ndim > 0) ? (size_t)src->ndim * sizeof(int64_t) : 0;
  PyObject *cap;
  if (versioned) {
    struct export_v *e = calloc(1, sizeof(*e) + extra);
    if (e == NULL) {
      if (held != NULL)
        core_put(held);
      return PyErr_NoMemory();
    }
    e->t.version.major = TB_DLPACK_MAJOR_VERSION;
    e->t.version.minor = TB_DLPACK_MINOR_VERSION;
    e->t.manager_ctx = e;
    e->t.deleter = export_v_deleter;
    e->t.flags = mt->flags;
    e->t.dl_tensor = *src;
    if (as_cpu)
      e->t.dl_tensor.device = (DLDevice){kDLCPU, 0};
    if (extra) {
      compact_strides(src, e->strides);
      e->t.dl_tensor.strides = e->strides;
    }
    e->core = held != NULL ? held : self->core;
    if (held == NULL)
      core_get(e->core);
    held = NULL;
    cap = PyCapsule_New(&e->t, "dltensor_versioned", capsule_v_destructor);
    if (cap == NULL)
      export_v_deleter(&e->t);
  } else {
    struct export_l *e = calloc(1, sizeof(*e) + extra);
    if (e == NULL) {
      if (held != NULL)
        core_put(held);
      return PyErr_NoMemory();
    }
    e->t.manager_ctx = e;
    e->t.deleter = export_l_deleter;
    e->t.dl_tensor = *src;
    if (as_cpu)
      e->t.dl_tensor.device = (DLDevice){kDLCPU, 0};
    if (extra) {
      compact_strides(src, e->strides);
      e->t.dl_tensor.strides = e->strides;
    }
    e->core = held != NULL ? held : self->core;
    if (held == NULL)
      core_get(e->core);
    held = NULL;
    cap = PyCapsule_New(&e->t, "dltensor", capsule_l_destructor);
    if (cap == NULL)
      export_l_deleter(&e->t);
  }
  if (cap != NULL)
    self->handed_out++;
  return cap;
}

static PyObject *lease_release(LeaseObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"stream", NULL};
  PyObject *stream = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:release", kwlist, &stream))
    return NULL;
  if (lease_check(self) < 0)
    return NULL;
  void *s = TB_STREAM_DEFAULT;
  if (self->device.device_type != kDLCUDA && self->device.device_type != kDLCUDAHost) {
    if (stream != Py_None) {
      long v = PyLong_Check(stream) ? PyLong_AsLong(stream) : 0;
      if (PyErr_Occurred())
        return NULL;
      if (!PyLong_Check(stream) || v != -1) {
        PyErr_SetString(PyExc_ValueError, "a host lease takes no stream");
        return NULL;
      }
    }
  } else if (stream_from_py(stream, &s) < 0) {
    return NULL;
  }
  struct lease_core *core = self->core;
  self->core = NULL;
  /* Under the GIL nobody else can take a new reference, so refs == 1 means
   * no capsule or view is out: end the lease now, with the done stream. */
  if (atomic_load(&core->refs) == 1) {
    DLManagedTensorVersioned *mt = core->mt;
    struct session_ref *sess = core->sess;
    free(core);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = tb_lease_release(mt, s);
    session_put(sess); /* after the Release, on the session still open */
    Py_END_ALLOW_THREADS
    if (rc < 0)
      return raise_tb(rc, NULL);
    Py_RETURN_NONE;
  }
  /* A consumer library owns a capsule (or a buffer view is open): the lease
   * ends when its deleter runs, and then also on the stream given here. */
  int rc = 0;
  Py_BEGIN_ALLOW_THREADS
  if (s != TB_STREAM_DEFAULT)
    rc = tb_lease_use(core->mt, s);
  core_put(core);
  Py_END_ALLOW_THREADS
  if (rc < 0)
    return raise_tb(rc, NULL);
  Py_RETURN_NONE;
}

static PyObject *lease_enter(LeaseObject *self, PyObject *unused) {
  if (lease_check(self) < 0)
    return NULL;
  return Py_NewRef((PyObject *)self);
}

static PyObject *lease_exit(LeaseObject *self, PyObject *args) {
  if (self->core != NULL) {
    PyObject *empty = PyTuple_New(0);
    if (empty == NULL)
      return NULL;
    PyObject *r = lease_release(self, empty, NULL);
    Py_DECREF(empty);
    if (r == NULL)
      return NULL;
    Py_DECREF(r);
  }
  Py_RETURN_FALSE;
}

/* Buffer protocol: a read-only view of a host lease, for memoryview() and
 * numpy.asarray() (which handles every dtype, bool included, on any NumPy). */
struct view_block {
  struct lease_core *core;
  Py_ssize_t shape[32];
  Py_ssize_t strides[32];
};

static int lease_getbuffer(LeaseObject *self, Py_buffer *view, int flags) {
  if (lease_check(self) < 0)
    return -1;
  const DLTensor *t = &self->core->mt->dl_tensor;
  if (t->device.device_type != kDLCPU && t->device.device_type != kDLCUDAHost) {
    PyErr_SetString(PyExc_BufferError, "only host leases export the buffer protocol; "
                                       "use DLPack (from_dlpack) for device memory");
    return -1;
  }
  if (flags & PyBUF_WRITABLE) {
    PyErr_SetString(PyExc_BufferError, "lease memory is read-only");
    return -1;
  }
  const char *fmt = format_of(t->dtype);
  if (fmt == NULL || t->ndim > 32) {
    PyErr_SetString(PyExc_BufferError, "dtype has no buffer-protocol format; use DLPack");
    return -1;
  }
  struct view_block *vb = calloc(1, sizeof(*vb));
  if (vb == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  Py_ssize_t item = (Py_ssize_t)itemsize_of(t->dtype);
  int64_t cs[32];
  compact_strides(t, cs);
  Py_ssize_t len = item;
  bool contiguous = true;
  for (int i = 0; i < t->ndim; i++) {
    vb->shape[i] = (Py_ssize_t)t->shape[i];
    int64_t st = t->strides ? t->strides[i] : cs[i];
    if (t->shape[i] > 1 && st != cs[i])
      contiguous = false;
    vb->strides[i] = (Py_ssize_t)(st * item);
    len *= vb->shape[i];
  }
  if (!contiguous && (flags & PyBUF_STRIDES) != PyBUF_STRIDES) {
    free(vb);
    PyErr_SetString(PyExc_BufferError, "lease is not C-contiguous");
    return -1;
  }
  vb->core = self->core;
  core_get(vb->core);
  view->obj = Py_NewRef((PyObject *)self);
  view->buf = (char *)t->data + t->byte_offset;
  view->len = len;
  view->readonly = 1;
  view->itemsize = item;
  view->format = (flags & PyBUF_FORMAT) ? (char *)fmt : NULL;
  view->ndim = t->ndim;
  view->shape = (flags & PyBUF_ND) == PyBUF_ND ? vb->shape : NULL;
  view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? vb->strides : NULL;
  view->suboffsets = NULL;
  view->internal = vb;
  return 0;
}

static void lease_releasebuffer(LeaseObject *self, Py_buffer *view) {
  struct view_block *vb = view->internal;
  if (vb == NULL)
    return;
  core_put(vb->core);
  free(vb);
}

#define LEASE_GET_U64(field)                                                   \
  static PyObject *lease_get_##field(LeaseObject *self, void *c) {             \
    return PyLong_FromUnsignedLongLong(self->field);                           \
  }
LEASE_GET_U64(version)
LEASE_GET_U64(lease_id)
LEASE_GET_U64(buffer_id)
LEASE_GET_U64(producer_pid)

static PyObject *lease_get_channel(LeaseObject *self, void *c) { return Py_NewRef(self->channel); }
static PyObject *lease_get_metadata(LeaseObject *self, void *c) { return Py_NewRef(self->metadata); }
static PyObject *lease_get_shape(LeaseObject *self, void *c) { return Py_NewRef(self->shape); }
static PyObject *lease_get_released(LeaseObject *self, void *c) { return PyBool_FromLong(self->core == NULL); }
static PyObject *lease_get_memory_kind(LeaseObject *self, void *c) { return PyLong_FromLong(self->memory_kind); }
static PyObject *lease_get_device(LeaseObject *self, void *c) {
  return Py_BuildValue("(ii)", (int)self->device.device_type, (int)self->device.device_id);
}
static PyObject *lease_get_read_only(LeaseObject *self, void *c) {
  if (lease_check(self) < 0)
    return NULL;
  return PyBool_FromLong((self->core->mt->flags & TB_DLPACK_FLAG_BITMASK_READ_ONLY) != 0);
}
static PyObject *lease_get_dtype(LeaseObject *self, void *c) {
  if (lease_check(self) < 0)
    return NULL;
  DLDataType dt = self->core->mt->dl_tensor.dtype;
  return Py_BuildValue("(iii)", (int)dt.code, (int)dt.bits, (int)dt.lanes);
}
static PyObject *lease_get_strides(LeaseObject *self, void *c) {
  if (lease_check(self) < 0)
    return NULL;
  const DLTensor *t = &self->core->mt->dl_tensor;
  int64_t cs[64];
  if (t->ndim > 64)
    return raise_tb(TB_ELIMIT, "ndim");
  compact_strides(t, cs);
  PyObject *tup = PyTuple_New(t->ndim);
  if (tup == NULL)
    return NULL;
  for (int i = 0; i < t->ndim; i++) {
    PyObject *n = PyLong_FromLongLong(t->strides ? t->strides[i] : cs[i]);
    if (n == NULL || PyTuple_SetItem(tup, i, n) < 0) {
      Py_DECREF(tup);
      return NULL;
    }
  }
  return tup;
}

static PyGetSetDef lease_getset[] = {
    {"version", (getter)lease_get_version, NULL, "version number", NULL},
    {"lease_id", (getter)lease_get_lease_id, NULL, "daemon's lease id", NULL},
    {"buffer_id", (getter)lease_get_buffer_id, NULL, "producer buffer id", NULL},
    {"producer_pid", (getter)lease_get_producer_pid, NULL, "producer's pid", NULL},
    {"memory_kind", (getter)lease_get_memory_kind, NULL, "1 host memfd, 2 CUDA IPC, 3 CUDA VMM, 4 pinned host (enum tb_memory_kind in C)", NULL},
    {"channel", (getter)lease_get_channel, NULL, "channel name", NULL},
    {"metadata", (getter)lease_get_metadata, NULL, "user metadata (bytes)", NULL},
    {"shape", (getter)lease_get_shape, NULL, "tensor shape", NULL},
    {"strides", (getter)lease_get_strides, NULL, "strides in elements", NULL},
    {"dtype", (getter)lease_get_dtype, NULL, "DLPack (code, bits, lanes)", NULL},
    {"device", (getter)lease_get_device, NULL, "DLPack (device_type, device_id)", NULL},
    {"read_only", (getter)lease_get_read_only, NULL, "consumers may not write", NULL},
    {"released", (getter)lease_get_released, NULL, "release() was called", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMethodDef lease_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))lease_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)"},
    {"__dlpack_device__", (PyCFunction)lease_dlpack_device, METH_NOARGS, NULL},
    {"release", (PyCFunction)(void (*)(void))lease_release, METH_VARARGS | METH_KEYWORDS,
     "release(stream=None): end the lease (deferred while a consumer holds a capsule)"},
    {"__enter__", (PyCFunction)lease_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)lease_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyType_Slot lease_slots[] = {
    {Py_tp_dealloc, lease_dealloc},
    {Py_tp_methods, lease_methods},
    {Py_tp_getset, lease_getset},
    {Py_bf_getbuffer, lease_getbuffer},
    {Py_bf_releasebuffer, lease_releasebuffer},
    {Py_tp_doc, "A lease on one version of a channel (from Client.acquire)."},
    {0, NULL}};

static PyType_Spec lease_spec = {"tensorbroker._native.Lease", sizeof(LeaseObject), 0,
                                 Py_TPFLAGS_DEFAULT, lease_slots};

/* ---- Client and Buffer ------------------------------------------------- */

struct BufferObject;

typedef struct {
  PyObject_HEAD
  tb_client *c;
  struct session_ref *sess; /* holds c; NULL once let go */
  int closing; /* close() was called */
  int busy;    /* calls waiting with the GIL released */
  struct BufferObject *buffers; /* live broker buffers (borrowed links) */
  uint64_t serial; /* this connection's number, never reused (Lease.owner) */
} ClientObject;

typedef struct BufferObject {
  PyObject_HEAD
  ClientObject *client; /* strong */
  tb_buffer *b;
  char *data;
  size_t size;   /* requested bytes (the buffer may be larger) */
  int exports;
  int cuda;      /* a CUDA VMM buffer (alloc_cuda): data is a device pointer,
                  * exported by dlpack(), never by the buffer protocol */
  int device;
  struct BufferObject *next, *prev;
} BufferObject;

/* Let go of the session once close() was asked for, no call is in flight
 * and no broker buffer is alive (their memory belongs to the connection);
 * it ends now, or when the last lease still held ends (session_ref). */
static void client_maybe_disconnect(ClientObject *self) {
  if (!self->closing || self->busy > 0 || self->buffers != NULL || self->c == NULL)
    return;
  struct session_ref *sess = self->sess;
  self->c = NULL;
  self->sess = NULL;
  Py_BEGIN_ALLOW_THREADS
  session_put(sess);
  Py_END_ALLOW_THREADS
}

static int client_check(ClientObject *self) {
  if (self->c == NULL || self->closing) {
    raise_tb(TB_ESTALE, "client is closed");
    return -1;
  }
  return 0;
}

/* Run one library call with the GIL released; copies the library's error
 * text before anyone else can use the client. */
#define CLIENT_CALL(self, rc, errbuf, expr)                                    \
  do {                                                                         \
    tb_client *c_ = (self)->c;                                                 \
    (self)->busy++;                                                            \
    Py_BEGIN_ALLOW_THREADS                                                     \
    (rc) = (expr);                                                             \
    if ((rc) < 0)                                                              \
      tb_client_last_error(c_, (errbuf), sizeof(errbuf));                      \
    Py_END_ALLOW_THREADS                                                       \
    (self)->busy--;                                                            \
    client_maybe_disconnect(self);                                             \
  } while (0)

/* Numbers Client connections for Lease.owner (under the GIL). */
static uint64_t client_serial;

static int client_init(ClientObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"socket", "name", "stream_contract", "timeout_ms", "spin_us",
                           "prefetch", "channels", NULL};
  const char *socket_path = NULL, *name = NULL;
  PyObject *contract = NULL, *channels = NULL;
  int timeout_ms = 0, spin_us = 0, prefetch = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|zzOiipO:Client", kwlist, &socket_path, &name,
                                   &contract, &timeout_ms, &spin_us, &prefetch, &channels))
    return -1;
  if (self->c != NULL) {
    PyErr_SetString(PyExc_RuntimeError, "Client already initialised");
    return -1;
  }
  struct tb_connect_options opts;
  tb_connect_options_init(&opts);
  opts.socket_path = socket_path;
  opts.client_name = name;
  opts.timeout_ms = timeout_ms;
  opts.spin_us = spin_us;
  opts.no_prefetch = !prefetch;
  /* a signal ends a wait for the daemon, so that Ctrl-C (or any Python
   * handler) runs (wait_interrupted) */
  opts.interruptible = 1;
  if (contract != NULL && contract != Py_None) {
    if (PyLong_Check(contract)) {
      opts.stream_contract = (int)PyLong_AsLong(contract);
      if (PyErr_Occurred())
        return -1;
      if (tb_contract_name(opts.stream_contract) == NULL) {
        raise_tb(TB_EINVAL, "unknown stream contract");
        return -1;
      }
    } else {
      const char *cs = PyUnicode_AsUTF8AndSize(contract, NULL);
      if (cs == NULL)
        return -1;
      if (tb_contract_parse(cs, &opts.stream_contract) < 0) {
        raise_tb(TB_EINVAL, "unknown stream contract (want spec, no_sync, per_thread "
                            "or explicit)");
        return -1;
      }
    }
  }
  /* channels: a sequence of str (Client refuses one str), held as a tuple
   * while connect reads them */
  const char *names[TB_CONNECT_CHANNELS_MAX + 1];
  PyObject *chseq = NULL;
  if (channels != NULL && channels != Py_None) {
    chseq = PySequence_Tuple(channels);
    if (chseq == NULL)
      return -1;
    Py_ssize_t n = PyTuple_Size(chseq);
    if (n > TB_CONNECT_CHANNELS_MAX) {
      Py_DECREF(chseq);
      raise_tb(TB_ELIMIT, "channels: at most 16 names");
      return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
      names[i] = PyUnicode_AsUTF8AndSize(PyTuple_GetItem(chseq, i), NULL);
      if (names[i] == NULL) {
        Py_DECREF(chseq);
        return -1;
      }
    }
    names[n] = NULL;
    opts.channels = names;
  }
  tb_client *c = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = tb_client_connect(&opts, &c);
  Py_END_ALLOW_THREADS
  Py_XDECREF(chseq);
  if (rc < 0) {
    /* the socket path and why; read on the thread that connected */
    char why[512];
    tb_client_connect_error(why, sizeof(why));
    raise_tb(rc, why);
    return -1;
  }
  struct session_ref *sess = malloc(sizeof(*sess));
  if (sess == NULL) {
    tb_client_disconnect(c);
    PyErr_NoMemory();
    return -1;
  }
  sess->c = c;
  atomic_init(&sess->refs, 1);
  self->c = c;
  self->sess = sess;
  self->serial = ++client_serial;
  return 0;
}

static void client_dealloc(ClientObject *self) {
  PyTypeObject *tp = Py_TYPE((PyObject *)self);
  /* Buffers hold a reference to their client, so none is alive here;
   * leases may be (session_ref). */
  if (self->sess != NULL) {
    session_put(self->sess);
    self->sess = NULL;
    self->c = NULL;
  }
  freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
  tp_free(self);
  Py_DECREF(tp);
}

static PyObject *client_close(ClientObject *self, PyObject *unused) {
  self->closing = 1;
  client_maybe_disconnect(self);
  Py_RETURN_NONE;
}

static PyObject *client_get_closed(ClientObject *self, void *c) {
  return PyBool_FromLong(self->closing || self->c == NULL);
}
static PyObject *client_get_session_id(ClientObject *self, void *c) {
  if (client_check(self) < 0)
    return NULL;
  return PyLong_FromUnsignedLongLong(tb_client_session_id(self->c));
}
static PyObject *client_get_contract(ClientObject *self, void *c) {
  if (client_check(self) < 0)
    return NULL;
  const char *n = tb_contract_name(tb_client_contract(self->c));
  return PyUnicode_FromString(n ? n : "?");
}
static PyObject *client_fileno(ClientObject *self, PyObject *unused) {
  if (client_check(self) < 0)
    return NULL;
  return PyLong_FromLong(tb_client_fd(self->c));
}

/* alloc(nbytes, consumers_may_write=False, pinned=False) -> Buffer */
static PyObject *client_alloc(ClientObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"nbytes", "consumers_may_write", "pinned", NULL};
  Py_ssize_t nbytes;
  int may_write = 0, pinned = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "n|pp:alloc", kwlist, &nbytes, &may_write,
                                   &pinned))
    return NULL;
  if (client_check(self) < 0)
    return NULL;
  if (nbytes < 0) {
    PyErr_SetString(PyExc_ValueError, "nbytes must be >= 0");
    return NULL;
  }
  BufferObject *bo = (BufferObject *)PyType_GenericAlloc((PyTypeObject *)BufferType, 0);
  if (bo == NULL)
    return NULL;
  char err[TBPY_ERRMSG_MAX] = "";
  tb_buffer *b = NULL;
  int rc;
  /* A zero-byte memfd cannot be mapped; an empty array still needs a home. */
  size_t size = nbytes > 0 ? (size_t)nbytes : 1;
  unsigned flags = (may_write ? TB_BUFFER_CONSUMERS_MAY_WRITE : 0) |
                   (pinned ? TB_BUFFER_PINNED : 0);
  CLIENT_CALL(self, rc, err, tb_buffer_create_host(c_, size, flags, &b));
  if (rc < 0) {
    Py_DECREF(bo);
    return raise_tb(rc, err);
  }
  bo->client = (ClientObject *)Py_NewRef((PyObject *)self);
  bo->b = b;
  bo->data = tb_buffer_data(b);
  bo->size = (size_t)nbytes;
  bo->next = self->buffers;
  if (self->buffers)
    self->buffers->prev = bo;
  self->buffers = bo;
  return (PyObject *)bo;
}

/* alloc_cuda(nbytes, device=0, consumers_may_write=False) -> Buffer: a CUDA
 * VMM buffer (tb_buffer_create_cuda), exported to frameworks by
 * Buffer.dlpack(); Client.empty(device="cuda") wraps it. */
static PyObject *client_alloc_cuda(ClientObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"nbytes", "device", "consumers_may_write", NULL};
  Py_ssize_t nbytes;
  int device = 0, may_write = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "n|ip:alloc_cuda", kwlist, &nbytes, &device,
                                   &may_write))
    return NULL;
  if (client_check(self) < 0)
    return NULL;
  if (nbytes < 0 || device < 0) {
    PyErr_SetString(PyExc_ValueError, "nbytes and device must be >= 0");
    return NULL;
  }
  BufferObject *bo = (BufferObject *)PyType_GenericAlloc((PyTypeObject *)BufferType, 0);
  if (bo == NULL)
    return NULL;
  char err[TBPY_ERRMSG_MAX] = "";
  tb_buffer *b = NULL;
  int rc;
  size_t size = nbytes > 0 ? (size_t)nbytes : 1;
  unsigned flags = may_write ? TB_BUFFER_CONSUMERS_MAY_WRITE : 0;
  CLIENT_CALL(self, rc, err, tb_buffer_create_cuda(c_, size, device, flags, &b));
  if (rc < 0) {
    Py_DECREF(bo);
    return raise_tb(rc, err);
  }
  bo->client = (ClientObject *)Py_NewRef((PyObject *)self);
  bo->b = b;
  bo->data = tb_buffer_data(b);
  bo->size = (size_t)nbytes;
  bo->cuda = 1;
  bo->device = device;
  bo->next = self->buffers;
  if (self->buffers)
    self->buffers->prev = bo;
  self->buffers = bo;
  return (PyObject *)bo;
}

static BufferObject *client_find_buffer(ClientObject *self, const DLTensor *t) {
  int64_t lo, hi;
  uintptr_t base = (uintptr_t)t->data;
  if (!byte_extent(t, &lo, &hi)) {
    lo = (int64_t)t->byte_offset;
    hi = lo;
  }
  for (BufferObject *bo = self->buffers; bo; bo = bo->next) {
    if (bo->cuda)
      continue; /* device memory: never the home of a host tensor */
    uintptr_t start = (uintptr_t)bo->data, end = start + tb_buffer_size(bo->b);
    if (base + (uintptr_t)lo >= start && base + (uintptr_t)hi <= end && base + (uintptr_t)lo < end)
      return bo;
  }
  return NULL;
}

/* A CUDA tensor published without a copy stays owned by us until the version
 * is free; the pin capsule's destructor gives it back to its library. */
struct pin {
  void *t;
  int versioned;
};

static void pin_free(struct pin *p) {
  if (p->versioned) {
    DLManagedTensorVersioned *t = p->t;
    if (t->deleter)
      t->deleter(t);
  } else {
    DLManagedTensor *t = p->t;
    if (t->deleter)
      t->deleter(t);
  }
  free(p);
}

static void pin_destructor(PyObject *cap) {
  struct pin *p = PyCapsule_GetPointer(cap, "tensorbroker.pin");
  if (p)
    pin_free(p);
  else
    PyErr_Clear();
}

/* publish(channel, src, stream=None, metadata=None, history_depth=0)
 *   src: a DLPack capsule ("dltensor_versioned" or "dltensor"), which this
 *   call consumes, or any object exporting the buffer protocol (host).
 * Returns (version, pin, zero_copy): pin is None unless a CUDA tensor must be
 * kept alive until its version is free. */
static PyObject *client_publish(ClientObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"channel", "src", "stream", "metadata", "history_depth", NULL};
  const char *channel;
  PyObject *src, *stream = Py_None;
  Py_buffer meta = {0};
  unsigned int history_depth = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "sO|Oz*I:publish", kwlist, &channel, &src, &stream,
                                   &meta, &history_depth))
    return NULL;
  PyObject *result = NULL;
  Py_buffer view = {0};
  bool have_view = false;
  struct pin *p = NULL; /* owns the consumed capsule's tensor */
  DLTensor t;
  int64_t shape[64], strides[64];

  if (client_check(self) < 0)
    goto out_meta;
  void *s;
  if (stream_from_py(stream, &s) < 0)
    goto out_meta;

  if (PyCapsule_CheckExact(src)) {
    const char *name = PyCapsule_GetName(src);
    if (name == NULL)
      goto out_meta;
    p = calloc(1, sizeof(*p));
    if (p == NULL) {
      PyErr_NoMemory();
      goto out_meta;
    }
    if (strcmp(name, "dltensor_versioned") == 0) {
      DLManagedTensorVersioned *mt = PyCapsule_GetPointer(src, name);
      if (mt == NULL || PyCapsule_SetName(src, "used_dltensor_versioned") < 0)
        goto out_pin;
      p->t = mt;
      p->versioned = 1;
      if (mt->version.major != 1) {
        PyErr_Format(PyExc_BufferError, "DLPack major version %u not supported",
                     (unsigned)mt->version.major);
        goto out_pin;
      }
      t = mt->dl_tensor;
    } else if (strcmp(name, "dltensor") == 0) {
      DLManagedTensor *mt = PyCapsule_GetPointer(src, name);
      if (mt == NULL || PyCapsule_SetName(src, "used_dltensor") < 0)
        goto out_pin;
      p->t = mt;
      t = mt->dl_tensor;
    } else {
      free(p);
      p = NULL;
      PyErr_Format(PyExc_ValueError, "not a fresh DLPack capsule (name %s)", name);
      goto out_meta;
    }
  } else {
    if (PyObject_GetBuffer(src, &view, PyBUF_RECORDS_RO) < 0)
      goto out_meta;
    have_view = true;
    if (view.ndim > 64) {
      raise_tb(TB_ELIMIT, "too many dimensions");
      goto out_view;
    }
    memset(&t, 0, sizeof(t));
    t.data = view.buf;
    t.device.device_type = kDLCPU;
    t.ndim = view.ndim;
    if (dtype_from_format(view.format, view.itemsize, &t.dtype) < 0) {
      PyErr_Format(PyExc_TypeError, "buffer format '%s' has no DLPack dtype",
                   view.format ? view.format : "B");
      goto out_view;
    }
    for (int i = 0; i < view.ndim; i++) {
      shape[i] = view.shape ? view.shape[i] : (Py_ssize_t)(view.len / view.itemsize);
      Py_ssize_t st = view.strides ? view.strides[i] : view.itemsize;
      if (st % view.itemsize != 0) {
        PyErr_SetString(PyExc_BufferError, "strides are not a multiple of the item size");
        goto out_view;
      }
      strides[i] = st / view.itemsize;
    }
    if (!view.strides && view.ndim > 1) {
      t.strides = NULL; /* compact */
    } else {
      t.strides = strides;
    }
    t.shape = shape;
  }

  struct tb_publish_options opts;
  tb_publish_options_init(&opts);
  opts.metadata = meta.buf;
  opts.metadata_len = meta.buf ? (size_t)meta.len : 0;
  opts.history_depth = history_depth;

  char err[TBPY_ERRMSG_MAX] = "";
  uint64_t version = 0;
  int rc;
  bool zero_copy = false;
  bool keep_pin = false;
  switch ((int)t.device.device_type) {
  case kDLCPU:
  case kDLCUDAHost: {
    if (s != TB_STREAM_DEFAULT) {
      PyErr_SetString(PyExc_ValueError, "host tensors take no stream");
      goto out_view;
    }
    t.device.device_type = kDLCPU;
    t.device.device_id = 0;
    if (client_find_buffer(self, &t) != NULL) {
      zero_copy = true;
      CLIENT_CALL(self, rc, err, tb_channel_publish(c_, channel, &t, &opts, &version));
    } else {
      CLIENT_CALL(self, rc, err, tb_channel_publish_copy(c_, channel, &t, &opts, &version));
    }
    break;
  }
  case kDLCUDA:
    opts.stream = s;
    zero_copy = true;
    keep_pin = true;
    CLIENT_CALL(self, rc, err, tb_channel_publish(c_, channel, &t, &opts, &version));
    break;
  default:
    raise_tb(TB_EDEVICE, "only host (kDLCPU) and CUDA (kDLCUDA) tensors can be published");
    goto out_view;
  }
  if (rc < 0) {
    raise_tb(rc, err);
    goto out_view;
  }
  PyObject *pin_obj = Py_None;
  if (keep_pin && p != NULL) {
    pin_obj = PyCapsule_New(p, "tensorbroker.pin", pin_destructor);
    if (pin_obj == NULL)
      goto out_view; /* published; the tensor is freed below (best effort) */
    p = NULL;
  } else {
    Py_INCREF(pin_obj);
  }
  result = Py_BuildValue("(KNO)", (unsigned long long)version, pin_obj,
                         zero_copy ? Py_True : Py_False);
out_view:
  if (have_view)
    PyBuffer_Release(&view);
out_pin:
  if (p != NULL) {
    if (p->t != NULL)
      pin_free(p);
    else
      free(p);
  }
out_meta:
  if (meta.obj != NULL)
    PyBuffer_Release(&meta);
  return result;
}

static uint64_t monotonic_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* When a wait of tmo milliseconds (<0: forever) that starts now ends. */
static uint64_t wait_deadline(int tmo) {
  return tmo < 0 ? UINT64_MAX : monotonic_ms() + (uint64_t)tmo;
}

/* After TB_EINTR (the client connects interruptible: a signal ended a wait
 * for the daemon, which forgot the request): run Python's signal handlers.
 * -1 with the exception set when one raised (Ctrl-C: KeyboardInterrupt);
 * else 0, with *tmo what is left of the wait that ends at deadline (at
 * least a millisecond, so that it ends as the whole wait would have). */
static int wait_interrupted(int *tmo, uint64_t deadline) {
  if (PyErr_CheckSignals() < 0)
    return -1;
  if (deadline != UINT64_MAX && *tmo != 0) {
    uint64_t now = monotonic_ms();
    uint64_t left = now < deadline ? deadline - now : 1;
    *tmo = left > INT32_MAX ? INT32_MAX : (int)left;
  }
  return 0;
}

static int timeout_ms_from_py(PyObject *o, int *out) {
  if (o == NULL || o == Py_None) {
    *out = -1;
    return 0;
  }
  double secs = PyFloat_AsDouble(o);
  if (secs == -1.0 && PyErr_Occurred())
    return -1;
  if (secs < 0) {
    *out = -1;
    return 0;
  }
  double ms = secs * 1000.0;
  if (ms > 2147483647.0)
    ms = 2147483647.0;
  int v = (int)ms;
  if ((double)v < ms)
    v++; /* round up: never wait less than asked */
  *out = v;
  return 0;
}

/* Take the tensor of lease (an argument of acquire(release=...)) for
 * tb_acquire_options.release: NULL in *out when a consumer library still
 * holds a capsule or view (the lease then ends when that goes, as with
 * Lease.release()). The Lease reads as released afterwards. */
static int lease_take_for_release(LeaseObject *lease, uint64_t client,
                                  PyObject *stream, void **stream_out,
                                  DLManagedTensorVersioned **out) {
  *out = NULL;
  if (!PyObject_TypeCheck((PyObject *)lease, (PyTypeObject *)LeaseType)) {
    PyErr_SetString(PyExc_TypeError, "release= takes a Lease");
    return -1;
  }
  if (lease_check(lease) < 0)
    return -1;
  if (lease->owner != client) {
    raise_tb(TB_EINVAL, "release=: the lease was acquired on another client");
    return -1;
  }
  *stream_out = TB_STREAM_DEFAULT;
  /* device memory and pinned host memory are read on streams (as for
   * Lease.release) */
  if (lease->device.device_type != kDLCUDA &&
      lease->device.device_type != kDLCUDAHost) {
    if (stream != Py_None) {
      PyErr_SetString(PyExc_ValueError, "a host lease takes no release_stream");
      return -1;
    }
  } else if (stream_from_py(stream, stream_out) < 0) {
    return -1;
  }
  struct lease_core *core = lease->core;
  lease->core = NULL;
  if (atomic_load(&core->refs) == 1) {
    *out = core->mt;
    /* the Client making this call holds the session too */
    session_put(core->sess);
    free(core);
    return 0;
  }
  /* A consumer library holds a capsule or view: the lease ends when that
   * goes, after release_stream too (as Lease.release(stream=) does). */
  int rc = 0;
  void *s = *stream_out;
  Py_BEGIN_ALLOW_THREADS
  if (s != TB_STREAM_DEFAULT)
    rc = tb_lease_use(core->mt, s);
  core_put(core);
  Py_END_ALLOW_THREADS
  if (rc < 0) {
    raise_tb(rc, NULL);
    return -1;
  }
  return 0;
}

/* acquire(channel, after=None, timeout=None, exact=None, *, stream,
 *         release=None, release_stream=None) -> Lease */
static PyObject *client_acquire(ClientObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"channel", "after", "timeout", "exact", "stream",
                           "release", "release_stream", NULL};
  const char *channel;
  PyObject *after = Py_None, *timeout = Py_None, *exact = Py_None, *stream = NULL;
  PyObject *release = Py_None, *release_stream = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "s|OOO$OOO:acquire", kwlist, &channel, &after,
                                   &timeout, &exact, &stream, &release, &release_stream))
    return NULL;
  if (client_check(self) < 0)
    return NULL;
  struct tb_acquire_options opts;
  tb_acquire_options_init(&opts);
  if (after != Py_None && exact != Py_None) {
    PyErr_SetString(PyExc_ValueError, "pass either after= or exact=, not both");
    return NULL;
  }
  if (after != Py_None) {
    opts.mode = TB_ACQUIRE_NEXT;
    opts.version = PyLong_AsUnsignedLongLong(after);
  } else if (exact != Py_None) {
    opts.mode = TB_ACQUIRE_EXACT;
    opts.version = PyLong_AsUnsignedLongLong(exact);
  }
  if (PyErr_Occurred())
    return NULL;
  if (timeout_ms_from_py(timeout, &opts.timeout_ms) < 0)
    return NULL;
  /* By default no wait at acquire time: the consumer library names its
   * stream later, in Lease.__dlpack__(stream=...), and the wait is applied
   * then. stream= given here applies the wait now instead (for a CUDA
   * version; a host one takes no stream). */
  opts.stream = TB_STREAM_NO_SYNC;
  if (stream != NULL && stream_from_py(stream, &opts.stream) < 0)
    return NULL;
  LeaseObject *old = NULL;
  if (release != Py_None) {
    old = (LeaseObject *)release;
    if (lease_take_for_release(old, self->serial, release_stream, &opts.release_stream,
                               &opts.release) < 0)
      return NULL;
  } else if (release_stream != Py_None) {
    PyErr_SetString(PyExc_ValueError, "release_stream= goes with release=");
    return NULL;
  }
  DLManagedTensorVersioned *mt = NULL, *rel = opts.release;
  char err[TBPY_ERRMSG_MAX] = "";
  int rc;
  /* held across the call: a close() meanwhile must not end the session
   * before the new lease holds it */
  struct session_ref *sess = session_get(self->sess);
  uint64_t deadline = wait_deadline(opts.timeout_ms);
  for (;;) {
    CLIENT_CALL(self, rc, err, tb_lease_acquire(c_, channel, &opts, &mt));
    if (rc != TB_EINTR)
      break;
    /* the release went out with the first request */
    opts.release = NULL;
    rel = NULL;
    /* a handler may have closed the client */
    if (wait_interrupted(&opts.timeout_ms, deadline) < 0 || client_check(self) < 0) {
      session_put(sess);
      return NULL;
    }
    err[0] = '\0';
  }
  if (rc == TB_ENAME && rel != NULL) {
    /* refused before anything was released: the Lease stays usable */
    struct lease_core *core = malloc(sizeof(*core));
    if (core == NULL) {
      rel->deleter(rel);
    } else {
      core->mt = rel;
      core->sess = session_get(sess);
      atomic_init(&core->refs, 1);
      old->core = core;
    }
  }
  if (rc < 0) {
    session_put(sess);
    return raise_tb(rc, err);
  }
  PyObject *lease = lease_new_from(mt, sess);
  if (lease != NULL)
    ((LeaseObject *)lease)->owner = self->serial;
  Py_BEGIN_ALLOW_THREADS
  session_put(sess);
  Py_END_ALLOW_THREADS
  return lease;
}

static PyObject *client_wait_free(ClientObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"channel", "version", "timeout", "stream", NULL};
  const char *channel;
  unsigned long long version;
  PyObject *timeout = Py_None, *stream = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "sK|OO:wait_free", kwlist, &channel, &version,
                                   &timeout, &stream))
    return NULL;
  if (client_check(self) < 0)
    return NULL;
  int tmo;
  void *s;
  if (timeout_ms_from_py(timeout, &tmo) < 0 || stream_from_py(stream, &s) < 0)
    return NULL;
  char err[TBPY_ERRMSG_MAX] = "";
  int rc;
  uint64_t deadline = wait_deadline(tmo);
  for (;;) {
    CLIENT_CALL(self, rc, err, tb_channel_wait_free(c_, channel, version, tmo, s));
    if (rc != TB_EINTR)
      break;
    if (wait_interrupted(&tmo, deadline) < 0 || client_check(self) < 0)
      return NULL;
    err[0] = '\0';
  }
  if (rc < 0)
    return raise_tb(rc, err);
  Py_RETURN_NONE;
}

static PyObject *client_subscribe_common(ClientObject *self, PyObject *args, int sub) {
  const char *channel;
  if (!PyArg_ParseTuple(args, "s", &channel))
    return NULL;
  if (client_check(self) < 0)
    return NULL;
  char err[TBPY_ERRMSG_MAX] = "";
  int rc;
  CLIENT_CALL(self, rc, err,
              sub ? tb_channel_subscribe(c_, channel) : tb_channel_unsubscribe(c_, channel));
  if (rc < 0)
    return raise_tb(rc, err);
  Py_RETURN_NONE;
}
static PyObject *client_subscribe(ClientObject *self, PyObject *args) {
  return client_subscribe_common(self, args, 1);
}
static PyObject *client_unsubscribe(ClientObject *self, PyObject *args) {
  return client_subscribe_common(self, args, 0);
}

static const char *notice_type_name(int type) {
  switch (type) {
  case TB_NOTICE_NEW_VERSION: return "new_version";
  case TB_NOTICE_VERSION_FREE: return "version_free";
  case TB_NOTICE_BUFFER_RETIRED: return "buffer_retired";
  case TB_NOTICE_CHANNEL_CLOSED: return "channel_closed";
  case TB_NOTICE_DAEMON_CLOSING: return "daemon_closing";
  default: return "unknown";
  }
}

/* poll_notice(timeout=0) -> dict or None */
static PyObject *client_poll_notice(ClientObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"timeout", NULL};
  PyObject *timeout = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:poll_notice", kwlist, &timeout))
    return NULL;
  if (client_check(self) < 0)
    return NULL;
  int tmo = 0;
  if (timeout != NULL && timeout_ms_from_py(timeout, &tmo) < 0)
    return NULL;
  struct tb_notice n;
  char err[TBPY_ERRMSG_MAX] = "";
  int rc;
  uint64_t deadline = wait_deadline(tmo);
  for (;;) {
    CLIENT_CALL(self, rc, err, tb_notice_poll(c_, sizeof(n), &n, tmo));
    if (rc != TB_EINTR)
      break;
    if (wait_interrupted(&tmo, deadline) < 0 || client_check(self) < 0)
      return NULL;
    err[0] = '\0';
  }
  if (rc == TB_EAGAIN)
    Py_RETURN_NONE;
  if (rc < 0)
    return raise_tb(rc, err);
  return Py_BuildValue("{s:s,s:s,s:K,s:K,s:s}", "type", notice_type_name(n.type), "channel",
                       n.channel, "version", (unsigned long long)n.version, "buffer_id",
                       (unsigned long long)n.buffer_id, "reason", n.reason);
}

/* A Python list with one dict per entry (build) of a list the library
 * made (n entries, size bytes apart), which is freed. */
static PyObject *dict_list(void *entries, size_t n, size_t size,
                           PyObject *(*build)(const void *entry)) {
  PyObject *list = PyList_New(0);
  for (size_t i = 0; list != NULL && i < n; i++) {
    PyObject *d = build((const char *)entries + i * size);
    if (d == NULL || PyList_Append(list, d) < 0)
      Py_CLEAR(list);
    Py_XDECREF(d);
  }
  tb_free(entries);
  return list;
}

static const char *memory_kind_name(int kind) {
  const char *name = tb_memory_kind_name(kind);
  return name != NULL ? name : "?";
}

static const char *wait_what_name(int what) {
  const char *name = tb_wait_what_name(what);
  return name != NULL ? name : "?";
}

static PyObject *channel_dict(const void *entry) {
  const struct tb_channel_info *ci = entry;
  return Py_BuildValue(
      "{s:s,s:K,s:I,s:K,s:I,s:I,s:I,s:O,s:K,s:I,s:O,s:s}", "name", ci->name,
      "latest_version", (unsigned long long)ci->latest_version, "history_depth",
      ci->history_depth, "publisher_session", (unsigned long long)ci->publisher_session,
      "versions_held", ci->versions_held, "leases", ci->leases, "subscribers",
      ci->subscribers, "closed", ci->closed ? Py_True : Py_False, "publishes",
      (unsigned long long)ci->publishes, "waiters", ci->waiters, "waiting",
      ci->waiting ? Py_True : Py_False, "memory_kind",
      ci->memory_kind != 0 ? memory_kind_name(ci->memory_kind) : "");
}

static PyObject *client_channels(ClientObject *self, PyObject *unused) {
  if (client_check(self) < 0)
    return NULL;
  struct tb_channel_info *ci = NULL;
  size_t n = 0;
  char err[TBPY_ERRMSG_MAX] = "";
  int rc;
  CLIENT_CALL(self, rc, err, tb_channel_list(c_, sizeof(*ci), &ci, &n));
  if (rc < 0)
    return raise_tb(rc, err);
  return dict_list(ci, n, sizeof(*ci), channel_dict);
}

static PyObject *session_dict(const void *entry) {
  const struct tb_session_info *si = entry;
  const char *cn = tb_contract_name(si->stream_contract);
  return Py_BuildValue(
      "{s:K,s:I,s:I,s:I,s:s,s:s,s:I,s:I,s:I,s:K,s:K}", "session_id",
      (unsigned long long)si->session_id, "pid", si->pid, "uid", si->uid, "gid", si->gid,
      "name", si->name, "stream_contract", cn ? cn : "?", "leases", si->leases, "buffers",
      si->buffers, "subscriptions", si->subscriptions, "implicit_stream_calls",
      (unsigned long long)si->implicit_stream_calls, "requests",
      (unsigned long long)si->requests);
}

static PyObject *client_sessions(ClientObject *self, PyObject *unused) {
  if (client_check(self) < 0)
    return NULL;
  struct tb_session_info *si = NULL;
  size_t n = 0;
  char err[TBPY_ERRMSG_MAX] = "";
  int rc;
  CLIENT_CALL(self, rc, err, tb_session_list(c_, sizeof(*si), &si, &n));
  if (rc < 0)
    return raise_tb(rc, err);
  return dict_list(si, n, sizeof(*si), session_dict);
}

static PyObject *lease_dict(const void *entry) {
  const struct tb_lease_entry *le = entry;
  return Py_BuildValue(
      "{s:K,s:K,s:I,s:I,s:s,s:s,s:K,s:K,s:s,s:K,s:K,s:O,s:I,s:O}", "lease_id",
      (unsigned long long)le->lease_id, "session_id", (unsigned long long)le->session_id,
      "pid", le->pid, "uid", le->uid, "session_name", le->session_name, "channel",
      le->channel, "version", (unsigned long long)le->version, "bytes",
      (unsigned long long)le->bytes, "memory_kind", memory_kind_name(le->memory_kind),
      "age_ms", (unsigned long long)le->age_ms, "buffer_id", (unsigned long long)le->buffer_id,
      "ready_event", le->ready_event ? Py_True : Py_False, "done_events", le->done_events,
      "died", le->died ? Py_True : Py_False);
}

static PyObject *client_leases(ClientObject *self, PyObject *unused) {
  if (client_check(self) < 0)
    return NULL;
  struct tb_lease_entry *le = NULL;
  size_t n = 0;
  char err[TBPY_ERRMSG_MAX] = "";
  int rc;
  CLIENT_CALL(self, rc, err, tb_lease_list(c_, sizeof(*le), &le, &n));
  if (rc < 0)
    return raise_tb(rc, err);
  return dict_list(le, n, sizeof(*le), lease_dict);
}

static PyObject *wait_dict(const void *entry) {
  const struct tb_wait_entry *we = entry;
  return Py_BuildValue(
      "{s:K,s:I,s:I,s:s,s:s,s:s,s:K,s:K,s:L,s:I,s:O}", "session_id",
      (unsigned long long)we->session_id, "pid", we->pid, "uid", we->uid, "session_name",
      we->session_name, "what", wait_what_name(we->what), "channel", we->channel, "version",
      (unsigned long long)we->version, "age_ms", (unsigned long long)we->age_ms,
      "timeout_ms", (long long)we->timeout_ms, "leases", we->leases, "in_history",
      we->in_history ? Py_True : Py_False);
}

static PyObject *client_waits(ClientObject *self, PyObject *unused) {
  if (client_check(self) < 0)
    return NULL;
  struct tb_wait_entry *we = NULL;
  size_t n = 0;
  char err[TBPY_ERRMSG_MAX] = "";
  int rc;
  CLIENT_CALL(self, rc, err, tb_wait_list(c_, sizeof(*we), &we, &n));
  if (rc < 0)
    return raise_tb(rc, err);
  return dict_list(we, n, sizeof(*we), wait_dict);
}

/* The device as tbctl shows it: "cpu", "cuda:1", "cuda-host", "-" (none
 * given), else "TYPE:ID". */
static void device_name(char *buf, size_t len, int32_t type, int32_t id) {
  if (type == 0)
    snprintf(buf, len, "-");
  else if (type == kDLCPU)
    snprintf(buf, len, "cpu");
  else if (type == kDLCUDA)
    snprintf(buf, len, "cuda:%d", (int)id);
  else if (type == kDLCUDAHost)
    snprintf(buf, len, "cuda-host");
  else
    snprintf(buf, len, "%d:%d", (int)type, (int)id);
}

static PyObject *buffer_dict(const void *entry) {
  const struct tb_buffer_entry *be = entry;
  char dev[32], uuid[2 * sizeof(be->device_uuid) + 1] = "";
  size_t zero = 0;

  device_name(dev, sizeof(dev), be->device_type, be->device_id);
  for (size_t i = 0; i < sizeof(be->device_uuid); i++)
    zero += be->device_uuid[i] == 0;
  /* hex as tbctl --json writes it, "" for host memory's all-zero uuid */
  if (zero < sizeof(be->device_uuid))
    for (size_t i = 0; i < sizeof(be->device_uuid); i++)
      snprintf(uuid + 2 * i, 3, "%02x", be->device_uuid[i]);
  return Py_BuildValue(
      "{s:K,s:s,s:K,s:s,s:i,s:i,s:s,s:K,s:I,s:I,s:s,s:O,s:I,s:I,s:O,s:K,s:O}", "buffer_id",
      (unsigned long long)be->buffer_id, "memory_kind", memory_kind_name(be->memory_kind),
      "size", (unsigned long long)be->size, "device", dev, "device_type", (int)be->device_type,
      "device_id", (int)be->device_id, "device_uuid", uuid, "session_id",
      (unsigned long long)be->session_id, "pid", be->pid, "uid", be->uid, "session_name",
      be->session_name, "retired", be->retired ? Py_True : Py_False, "versions", be->versions,
      "leases", be->leases, "writable", be->writable ? Py_True : Py_False, "signal_offset",
      (unsigned long long)be->signal_offset, "survives_producer",
      be->survives_producer ? Py_True : Py_False);
}

static PyObject *client_buffers(ClientObject *self, PyObject *unused) {
  if (client_check(self) < 0)
    return NULL;
  struct tb_buffer_entry *be = NULL;
  size_t n = 0;
  char err[TBPY_ERRMSG_MAX] = "";
  int rc;
  CLIENT_CALL(self, rc, err, tb_buffer_list(c_, sizeof(*be), &be, &n));
  if (rc < 0)
    return raise_tb(rc, err);
  return dict_list(be, n, sizeof(*be), buffer_dict);
}

static PyObject *client_drop(ClientObject *self, PyObject *args) {
  const char *channel;
  if (!PyArg_ParseTuple(args, "s", &channel))
    return NULL;
  if (client_check(self) < 0)
    return NULL;
  char err[TBPY_ERRMSG_MAX] = "";
  int rc;
  CLIENT_CALL(self, rc, err, tb_channel_drop(c_, channel));
  if (rc < 0)
    return raise_tb(rc, err);
  Py_RETURN_NONE;
}

static PyObject *client_status(ClientObject *self, PyObject *unused) {
  if (client_check(self) < 0)
    return NULL;
  struct tb_status st;
  char err[TBPY_ERRMSG_MAX] = "";
  int rc;
  CLIENT_CALL(self, rc, err, tb_daemon_get_status(c_, sizeof(st), &st));
  if (rc < 0)
    return raise_tb(rc, err);
  return Py_BuildValue("{s:s,s:I,s:K,s:I,s:I,s:I,s:I,s:K,s:K,s:K,s:s}", "daemon_version",
                       st.daemon_version, "pid", st.pid, "uptime_ms",
                       (unsigned long long)st.uptime_ms, "sessions", st.sessions, "channels",
                       st.channels, "buffers", st.buffers, "leases", st.leases, "requests",
                       (unsigned long long)st.requests, "bad_messages",
                       (unsigned long long)st.bad_messages, "sessions_dropped",
                       (unsigned long long)st.sessions_dropped, "socket_path", st.socket_path);
}

static PyObject *client_metrics(ClientObject *self, PyObject *unused) {
  if (client_check(self) < 0)
    return NULL;
  char err[TBPY_ERRMSG_MAX] = "";
  char *text = NULL;
  size_t len = 0;
  int rc;
  CLIENT_CALL(self, rc, err, tb_daemon_get_metrics(c_, &text, &len));
  if (rc < 0)
    return raise_tb(rc, err);
  PyObject *s = PyUnicode_DecodeUTF8(text, (Py_ssize_t)len, "replace");
  tb_free(text);
  return s;
}

static PyMethodDef client_methods[] = {
    {"close", (PyCFunction)client_close, METH_NOARGS, NULL},
    {"fileno", (PyCFunction)client_fileno, METH_NOARGS, NULL},
    {"alloc", (PyCFunction)(void (*)(void))client_alloc, METH_VARARGS | METH_KEYWORDS, NULL},
    {"alloc_cuda", (PyCFunction)(void (*)(void))client_alloc_cuda, METH_VARARGS | METH_KEYWORDS,
     NULL},
    {"publish", (PyCFunction)(void (*)(void))client_publish, METH_VARARGS | METH_KEYWORDS, NULL},
    {"acquire", (PyCFunction)(void (*)(void))client_acquire, METH_VARARGS | METH_KEYWORDS, NULL},
    {"wait_free", (PyCFunction)(void (*)(void))client_wait_free, METH_VARARGS | METH_KEYWORDS, NULL},
    {"subscribe", (PyCFunction)client_subscribe, METH_VARARGS, NULL},
    {"unsubscribe", (PyCFunction)client_unsubscribe, METH_VARARGS, NULL},
    {"poll_notice", (PyCFunction)(void (*)(void))client_poll_notice, METH_VARARGS | METH_KEYWORDS, NULL},
    {"channels", (PyCFunction)client_channels, METH_NOARGS, NULL},
    {"sessions", (PyCFunction)client_sessions, METH_NOARGS, NULL},
    {"leases", (PyCFunction)client_leases, METH_NOARGS, NULL},
    {"waits", (PyCFunction)client_waits, METH_NOARGS, NULL},
    {"buffers", (PyCFunction)client_buffers, METH_NOARGS, NULL},
    {"drop", (PyCFunction)client_drop, METH_VARARGS, NULL},
    {"status", (PyCFunction)client_status, METH_NOARGS, NULL},
    {"metrics", (PyCFunction)client_metrics, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef client_getset[] = {
    {"closed", (getter)client_get_closed, NULL, NULL, NULL},
    {"session_id", (getter)client_get_session_id, NULL, NULL, NULL},
    {"stream_contract", (getter)client_get_contract, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot client_slots[] = {
    {Py_tp_init, client_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, client_dealloc},
    {Py_tp_methods, client_methods},
    {Py_tp_getset, client_getset},
    {Py_tp_doc, "Native connection to tensorbrokerd (use tensorbroker.Client)."},
    {0, NULL}};

static PyType_Spec client_spec = {"tensorbroker._native.Client", sizeof(ClientObject), 0,
                                  Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE, client_slots};

/* ---- Buffer ----------------------------------------------------------- */

static void buffer_dealloc(BufferObject *self) {
  PyTypeObject *tp = Py_TYPE((PyObject *)self);
  ClientObject *co = self->client;
  if (co != NULL) {
    if (self->prev)
      self->prev->next = self->next;
    else
      co->buffers = self->next;
    if (self->next)
      self->next->prev = self->prev;
    /* Versions published from it stay readable: the daemon keeps the memfd
     * until their leases end. Without the GIL: the client's call lock may
     * be held by another thread's acquire or wait, for as long as it
     * waits (busy keeps the client connected meanwhile). */
    if (co->c != NULL) {
      tb_buffer *b = self->b;
      co->busy++;
      Py_BEGIN_ALLOW_THREADS
      tb_buffer_destroy(b);
      Py_END_ALLOW_THREADS
      co->busy--;
    }
    client_maybe_disconnect(co);
    Py_DECREF(co);
  }
  freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
  tp_free(self);
  Py_DECREF(tp);
}

static int buffer_getbuffer(BufferObject *self, Py_buffer *view, int flags) {
  if (self->cuda) {
    PyErr_SetString(PyExc_BufferError, "a CUDA buffer is device memory: use __dlpack__");
    return -1;
  }
  self->exports++;
  return PyBuffer_FillInfo(view, (PyObject *)self, self->data, (Py_ssize_t)self->size, 0, flags);
}

static void buffer_releasebuffer(BufferObject *self, Py_buffer *view) {
  self->exports--;
}

static PyObject *buffer_get_id(BufferObject *self, void *c) {
  return PyLong_FromUnsignedLongLong(tb_buffer_id(self->b));
}
static PyObject *buffer_get_size(BufferObject *self, void *c) {
  return PyLong_FromSize_t(self->size);
}
static PyObject *buffer_get_address(BufferObject *self, void *c) {
  return PyLong_FromVoidPtr(self->data);
}
static PyObject *buffer_get_pinned(BufferObject *self, void *c) {
  return PyBool_FromLong(tb_buffer_pinned(self->b));
}

/* A DLPack export of a buffer (a CUDA VMM buffer's device memory, or a
 * host buffer's mapping): keeps the Buffer (and so the memory and its
 * connection) alive until the framework's tensor dies. */
struct buffer_export {
  union {
    DLManagedTensorVersioned v;
    DLManagedTensor l;
  } t;
  PyObject *owner;
  int64_t shape[];
};

/* A framework may drop its tensor on any thread, without the GIL. */
static void buffer_export_free(struct buffer_export *e) {
  PyGILState_STATE g = PyGILState_Ensure();
  Py_XDECREF(e->owner);
  PyGILState_Release(g);
  free(e);
}

static void buffer_export_v_deleter(DLManagedTensorVersioned *t) {
  buffer_export_free(t->manager_ctx);
}

static void buffer_export_l_deleter(DLManagedTensor *t) {
  buffer_export_free(t->manager_ctx);
}

/* dlpack(shape, code, bits, lanes=1, versioned=True) -> capsule over the
 * whole shape from byte 0 (row-major, no strides), writable: kDLCUDA for a
 * CUDA buffer (Client.empty(device="cuda"): CudaArray), kDLCPU for a host
 * buffer (HostArray: a dtype NumPy lacks, such as bfloat16). A pinned host
 * buffer goes out as kDLCPU too: it is this process's own memory, and a
 * framework that does not know kDLCUDAHost (PyTorch 1.13) still takes it.
 * A new buffer has no pending work: no stream waits. */
static PyObject *buffer_dlpack(BufferObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"shape", "code", "bits", "lanes", "versioned", NULL};
  PyObject *shape;
  int code, bits, lanes = 1, versioned = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "Oii|ip:dlpack", kwlist, &shape, &code, &bits,
                                   &lanes, &versioned))
    return NULL;
  if (self->client == NULL || self->client->c == NULL) {
    PyErr_SetString(PyExc_BufferError, "dlpack(): not a live buffer");
    return NULL;
  }
  Py_ssize_t nd = PyTuple_Check(shape) ? PyTuple_Size(shape) : -1;
  if (nd < 0 || nd > 64 || bits <= 0 || lanes <= 0) {
    PyErr_SetString(PyExc_ValueError, "dlpack(): shape must be a tuple of at most 64 "
                                      "sizes; bits and lanes > 0");
    return NULL;
  }
  struct buffer_export *e = calloc(1, sizeof(*e) + (size_t)nd * sizeof(int64_t));
  if (e == NULL)
    return PyErr_NoMemory();
  uint64_t bytes = ((uint64_t)bits * (uint64_t)lanes + 7) / 8;
  for (Py_ssize_t i = 0; i < nd; i++) {
    long long n = PyLong_AsLongLong(PyTuple_GetItem(shape, i));
    if (n < 0 || (n == -1 && PyErr_Occurred()) ||
        (n > 0 && bytes > UINT64_MAX / (uint64_t)n)) {
      free(e);
      if (!PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "dlpack(): bad shape");
      return NULL;
    }
    e->shape[i] = n;
    bytes *= (uint64_t)n;
  }
  if (bytes > tb_buffer_size(self->b)) {
    free(e);
    PyErr_Format(PyExc_ValueError, "dlpack(): %llu bytes do not fit the %zu-byte buffer",
                 (unsigned long long)bytes, tb_buffer_size(self->b));
    return NULL;
  }
  DLTensor t;
  memset(&t, 0, sizeof(t));
  t.data = self->data;
  t.device.device_type = self->cuda ? kDLCUDA : kDLCPU;
  t.device.device_id = self->cuda ? self->device : 0;
  t.ndim = (int32_t)nd;
  t.dtype.code = (uint8_t)code;
  t.dtype.bits = (uint8_t)bits;
  t.dtype.lanes = (uint16_t)lanes;
  t.shape = e->shape;
  e->owner = Py_NewRef((PyObject *)self);
  PyObject *cap;
  if (versioned) {
    e->t.v.version.major = TB_DLPACK_MAJOR_VERSION;
    e->t.v.version.minor = TB_DLPACK_MINOR_VERSION;
    e->t.v.manager_ctx = e;
    e->t.v.deleter = buffer_export_v_deleter;
    e->t.v.dl_tensor = t;
    cap = PyCapsule_New(&e->t.v, "dltensor_versioned", capsule_v_destructor);
    if (cap == NULL)
      buffer_export_v_deleter(&e->t.v);
  } else {
    e->t.l.manager_ctx = e;
    e->t.l.deleter = buffer_export_l_deleter;
    e->t.l.dl_tensor = t;
    cap = PyCapsule_New(&e->t.l, "dltensor", capsule_l_destructor);
    if (cap == NULL)
      buffer_export_l_deleter(&e->t.l);
  }
  return cap;
}

static PyObject *buffer_get_device(BufferObject *self, void *c) {
  return self->cuda ? PyLong_FromLong(self->device) : Py_NewRef(Py_None);
}

static PyMethodDef buffer_methods[] = {
    {"dlpack", (PyCFunction)(void (*)(void))buffer_dlpack, METH_VARARGS | METH_KEYWORDS,
     "dlpack(shape, code, bits, lanes=1, versioned=True): the buffer's DLPack capsule "
     "(kDLCUDA for a CUDA buffer, kDLCPU for a host one)"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef buffer_getset[] = {
    {"cuda_device", (getter)buffer_get_device, NULL, "CUDA ordinal of a CUDA buffer, else None",
     NULL},
    {"id", (getter)buffer_get_id, NULL, "daemon's buffer id", NULL},
    {"nbytes", (getter)buffer_get_size, NULL, "size in bytes", NULL},
    {"address", (getter)buffer_get_address, NULL, "address of the mapping", NULL},
    {"pinned", (getter)buffer_get_pinned, NULL,
     "this process's mapping is registered with CUDA (pinned=True and a driver)", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot buffer_slots[] = {
    {Py_tp_dealloc, buffer_dealloc},
    {Py_tp_getset, buffer_getset},
    {Py_tp_methods, buffer_methods},
    {Py_bf_getbuffer, buffer_getbuffer},
    {Py_bf_releasebuffer, buffer_releasebuffer},
    {Py_tp_doc, "A broker host buffer (writable, shared with consumers)."},
    {0, NULL}};

static PyType_Spec buffer_spec = {"tensorbroker._native.Buffer", sizeof(BufferObject), 0,
                                  Py_TPFLAGS_DEFAULT, buffer_slots};

/* ---- module ------------------------------------------------------------ */

static PyObject *mod_strerror(PyObject *m, PyObject *arg) {
  long code = PyLong_AsLong(arg);
  if (code == -1 && PyErr_Occurred())
    return NULL;
  return Py_BuildValue("(ss)", tb_err_name((int)code), tb_strerror((int)code));
}

static PyObject *mod_error(PyObject *m, PyObject *args) {
  int code;
  const char *msg = NULL;
  if (!PyArg_ParseTuple(args, "i|z", &code, &msg))
    return NULL;
  return raise_tb(code, msg);
}

static PyObject *mod_cuda_available(PyObject *m, PyObject *unused) {
  return PyBool_FromLong(tb_cuda_available() == 0);
}

static PyObject *mod_default_socket(PyObject *m, PyObject *unused) {
  char buf[4096];
  int rc = tb_client_default_socket_path(buf, sizeof(buf));
  if (rc < 0)
    return raise_tb(rc, NULL);
  return PyUnicode_FromString(buf);
}

static PyMethodDef mod_methods[] = {
    {"strerror", mod_strerror, METH_O, "strerror(code) -> (name, text)"},
    {"raise_error", mod_error, METH_VARARGS, "raise_error(code, message=None): raise Error"},
    {"cuda_available", mod_cuda_available, METH_NOARGS, NULL},
    {"default_socket_path", mod_default_socket, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "tensorbroker._native",
                                    "CPython binding of libtensorbroker (stable ABI).", -1,
                                    mod_methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
  PyObject *m = PyModule_Create(&moddef);
  if (m == NULL)
    return NULL;
  ErrorType = PyErr_NewExceptionWithDoc(
      "tensorbroker.Error", "A libtensorbroker call failed; .code, .name, .message.",
      NULL, NULL);
  if (ErrorType == NULL)
    goto fail;
  PyObject *bases = PyTuple_Pack(2, ErrorType, PyExc_TimeoutError);
  if (bases == NULL)
    goto fail;
  TimeoutType = PyErr_NewExceptionWithDoc("tensorbroker.TimeoutError",
                                          "TB_ETIMEDOUT: also a builtin TimeoutError.", bases,
                                          NULL);
  Py_DECREF(bases);
  bases = PyTuple_Pack(2, ErrorType, PyExc_PermissionError);
  if (bases == NULL)
    goto fail;
  PermissionType = PyErr_NewExceptionWithDoc(
      "tensorbroker.PermissionError",
      "TB_EPERM (the daemon's access rules refused): also a builtin "
      "PermissionError.",
      bases, NULL);
  Py_DECREF(bases);
  ClientType = PyType_FromSpec(&client_spec);
  BufferType = PyType_FromSpec(&buffer_spec);
  LeaseType = PyType_FromSpec(&lease_spec);
  if (TimeoutType == NULL || PermissionType == NULL || ClientType == NULL || BufferType == NULL || LeaseType == NULL)
    goto fail;
  if (PyModule_AddObjectRef(m, "Error", ErrorType) < 0 ||
      PyModule_AddObjectRef(m, "TimeoutError", TimeoutType) < 0 ||
      PyModule_AddObjectRef(m, "PermissionError", PermissionType) < 0 ||
      PyModule_AddObjectRef(m, "Client", ClientType) < 0 ||
      PyModule_AddObjectRef(m, "Buffer", BufferType) < 0 ||
      PyModule_AddObjectRef(m, "Lease", LeaseType) < 0 ||
      PyModule_AddStringConstant(m, "library_version", tb_version()) < 0)
    goto fail;
#define ADD_ERR(name, value, text)                                             \
  if (PyModule_AddIntConstant(m, "TB_" #name, value) < 0)                      \
    goto fail;
  TB_ERRNO_MAP(ADD_ERR)
#undef ADD_ERR
  return m;
fail:
  Py_DECREF(m);
  return NULL;
}
