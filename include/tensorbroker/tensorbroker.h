/* SPDX-License-Identifier: Apache-2.0 */
/* libtensorbroker: zero-copy exchange of DLPack tensors between processes on
 * one node, brokered by tensorbrokerd.
 *
 * Conventions that hold for every function below unless its comment says
 * otherwise:
 *  - It returns 0 on success or a negative TB_E* code (errors.h); tb_strerror()
 *    and tb_err_name() turn a code into text, and tb_client_last_error() gives
 *    the daemon's own explanation of the last failed call.
 *  - Out-parameters are written only on success.
 *  - Calls are synchronous: each sends one request and waits for its reply.
 *    There are no hidden threads. All calls on one tb_client may be made from
 *    any thread. A call that waits for the daemon (tb_lease_acquire for a
 *    version to come, tb_channel_wait_free, tb_notice_poll, each with a
 *    timeout other than 0) does not hold up the other threads' calls on
 *    that client: one thread may wait for frames while another publishes
 *    results on the same client. Acquires and wait-frees of several
 *    threads wait at once, each for its own answer, in whatever order the
 *    answers come; the daemon holds up to --max-waits (64) such requests
 *    per session, and one more fails with TB_ELIMIT. With a daemon older
 *    than FEATURE_MULTI_WAIT, which holds one, they wait for one another
 *    instead: another thread's tb_lease_acquire with a timeout other than
 *    0, or tb_channel_wait_free that must ask the daemon, waits until the
 *    first has its answer. A second tb_notice_poll with a timeout waits
 *    until the first returns. Other calls are serialised by a lock inside
 *    the client only while they exchange a request and its reply (and
 *    while a waiting call busy-polls, spin_us). tb_client_last_error()
 *    says what the calling thread's last call on that client said,
 *    whatever other threads' calls said meanwhile (a thread that made
 *    none reads the client's last, from any thread). Ending a lease
 *    (tb_lease_release, a DLPack deleter) never waits for that lock.
 *  - The library never prints, never exits and never aborts on runtime
 *    errors.
 *  - A client belongs to the process that connected it. A child made by
 *    fork() inherits a copy that it cannot use: the library closes the
 *    child's copy of the socket at the fork, and every call on the
 *    inherited client (or ring, buffer or lease) returns TB_EFORKED
 *    without sending or waiting for anything; tb_client_last_error() says
 *    so. Releasing an inherited tensor returns 0 and ends nothing of the
 *    parent's: the parent's lease holds, and the child's copy of the
 *    mapping stays until it exits; tb_client_disconnect() of an inherited
 *    client frees the child's copy of it. A child connects a client of
 *    its own.
 *  - Strings passed in are copied; nothing passed in is kept after return
 *    unless stated.
 *  - Names are tb_<object>_<verb> (tb_lease_acquire, tb_channel_publish) or
 *    tb_<object>_<property> (tb_buffer_size); library-wide functions
 *    (tb_version, tb_strerror, tb_err_name, tb_free) have no object. The
 *    names of 0.1.0 stay as aliases, declared at the end of this file
 *    ("older names"); docs/c-api.md maps each to its new name.
 *  - Structs the caller fills and passes in (tb_*_options) start with a
 *    size_t struct_size member that their _init function sets. Structs the
 *    library fills for the caller are sized by a size_t struct_size
 *    argument, placed just before the pointer it sizes: pass sizeof the
 *    struct as your headers have it. The library writes exactly
 *    struct_size bytes per struct (per entry of a list, whose entries lie
 *    struct_size bytes apart): the fields it knows that fit, zero for the
 *    rest, nothing past them. A struct_size smaller than the struct's
 *    first version, not a multiple of its alignment, or above
 *    TB_STRUCT_SIZE_MAX is TB_EINVAL, and then nothing is written. So a
 *    program built against older headers keeps working with a newer
 *    library, and a newer program with an older one sees zero in the
 *    fields that library does not know (docs/c-api.md, "struct_size").
 *
 * Streams follow DLPack's integers: NULL (no stream given) takes the
 * connection's contract default, TB_STREAM_NO_SYNC (-1) means "do not
 * synchronise", TB_STREAM_LEGACY (1) the legacy default stream,
 * TB_STREAM_PER_THREAD (2) the per-thread default stream, and anything else is
 * a CUstream. Host (kDLCPU) tensors take no stream.
 */
#ifndef TENSORBROKER_TENSORBROKER_H
#define TENSORBROKER_TENSORBROKER_H

#include <stddef.h>
#include <stdint.h>

#include <tensorbroker/dlpack.h>
#include <tensorbroker/errors.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(TB_BUILDING_LIBRARY)
#define TB_EXPORT __attribute__((visibility("default")))
#else
#define TB_EXPORT
#endif

/* TB_VERSION_MAJOR, TB_VERSION_MINOR, TB_VERSION_PATCH and
 * TB_VERSION_STRING ("MAJOR.MINOR.PATCH"): the version of these headers,
 * generated at build time from the source tree's VERSION file. */
#include <tensorbroker/version.h>
/* Wire protocol version spoken by this library (Hello.protocol_version). */
#define TB_PROTOCOL_VERSION 1

/* Longest channel name accepted, in bytes, without the terminating NUL. */
#define TB_NAME_MAX 255

/* Channels one connect may name (tb_connect_options.channels). */
#define TB_CONNECT_CHANNELS_MAX 16

/* Largest struct_size a function accepts (see above). */
#define TB_STRUCT_SIZE_MAX 65536

/* ---- versions and errors ------------------------------------------------ */

/* The library's version, "MAJOR.MINOR.PATCH". Static storage; any thread. */
TB_EXPORT const char *tb_version(void);

/* Text for an error code ("timed out"); "unknown error" for a code not in
 * errors.h. Static storage; any thread. */
TB_EXPORT const char *tb_strerror(int err);

/* Name of an error code ("TB_ETIMEDOUT"); "TB_E?" for an unknown code. */
TB_EXPORT const char *tb_err_name(int err);

/* ---- streams and contracts ---------------------------------------------- */

#define TB_STREAM_DEFAULT ((void *)0)
#define TB_STREAM_NO_SYNC ((void *)(intptr_t)-1)
#define TB_STREAM_LEGACY ((void *)(intptr_t)1)
#define TB_STREAM_PER_THREAD ((void *)(intptr_t)2)

/* What a NULL stream means on a connection (docs/cuda.md, "The stream
 * contract"). */
enum tb_stream_contract {
  TB_CONTRACT_SPEC = 0,       /* legacy default stream, as DLPack says */
  TB_CONTRACT_NO_SYNC = 1,    /* -1: the caller orders its own work */
  TB_CONTRACT_PER_THREAD = 2, /* the per-thread default stream */
  TB_CONTRACT_EXPLICIT = 3    /* TB_ESTREAM: a stream must be passed */
};

/* "spec", "no_sync", "per_thread", "explicit"; NULL for an unknown value. */
TB_EXPORT const char *tb_contract_name(int contract);

/* Parse a contract name (as above; '-' may stand for '_'). Writes *out and
 * returns 0, or TB_EINVAL. */
TB_EXPORT int tb_contract_parse(const char *name, int *out);

/* ---- memory kinds ------------------------------------------------------- */

/* What memory a buffer is (the memory_kind fields of struct tb_lease_info,
 * struct tb_lease_entry and struct tb_buffer_entry, which are int so that
 * their size is fixed); the values are the protocol's MemoryKind. */
enum tb_memory_kind {
  TB_MEMORY_NONE = 0,
  TB_MEMORY_HOST = 1,     /* a sealed memfd every process maps */
  TB_MEMORY_CUDA_IPC = 2, /* legacy CUDA IPC: dies with its producer */
  TB_MEMORY_CUDA_VMM = 3, /* CUDA VMM memory shared by a file descriptor the
                           * daemon keeps: outlives its producer */
  /* a sealed memfd as TB_MEMORY_HOST, registered with cuMemHostRegister
   * (pinned) by each process that maps it: tensors are kDLCUDAHost, or
   * kDLCPU in a process without a CUDA driver (TB_BUFFER_PINNED) */
  TB_MEMORY_CUDA_HOST = 4,
};

/* "host", "cuda-ipc", "cuda-vmm", "cuda-host" (as tbctl and the Python
 * binding show them); NULL for
 * TB_MEMORY_NONE and any value this library does not know (a newer daemon
 * may report kinds it does not). Static storage; any thread. */
TB_EXPORT const char *tb_memory_kind_name(int kind);

/* ---- connections ------------------------------------------------------- */

typedef struct tb_client tb_client;

struct tb_connect_options {
  /* sizeof(struct tb_connect_options); lets later versions add fields. */
  size_t struct_size;
  /* Socket path; NULL: tb_client_default_socket_path(). */
  const char *socket_path;
  /* Shown by `tbctl sessions`; NULL: the program name. At most 63 bytes. */
  const char *client_name;
  /* enum tb_stream_contract; default TB_CONTRACT_SPEC. */
  int stream_contract;
  /* Longest wait for any reply, in milliseconds, not counting the waits a
   * call asks for itself (acquire's timeout is added). <=0: 30000. */
  int timeout_ms;
  /* Before sleeping in a wait for the daemon (a reply, a parked NEXT
   * acquire, a notice), keep polling the socket for up to this many
   * microseconds: a datagram that arrives within the window costs no
   * process wake-up (docs/benchmarks.md, "Busy polling"). 0 (default): the
   * value of $TENSORBROKER_SPIN_US if set (a plain decimal number; "0"
   * turns polling off), else 50 microseconds while the process may run on
   * 4 or more CPUs and none on fewer (where polling would only take the CPU
   * from the daemon it waits for; the CPU count is read again at most once
   * a second). -1: never poll. 1..1000000: poll that long in every wait,
   * whatever the CPUs. Other values, here or in that variable, make
   * tb_client_connect() give TB_EINVAL. */
  int spin_us;
  /* 0 (default): opening ahead. When a subscribed channel gets a version
   * in a CUDA buffer this session has not seen, the daemon sends the
   * buffer's handle with the new-version notice, and the library opens it
   * (and the version's ready event) as it reads that notice, on the thread
   * reading it if a CUDA context is current there: the acquire that
   * follows finds them open (docs/cuda.md, "Opening ahead"). Also, when
   * the connecting thread has a CUDA context current, connect makes and
   * registers the client's done event, which the first CUDA acquire would
   * otherwise register ("Ready at connect"). Non-zero: the notices carry
   * no buffers, acquires open what they need, and connect prepares
   * nothing. */
  int no_prefetch;
  /* The channels this client means to acquire CUDA tensors from, as a
   * NULL-terminated array of at most TB_CONNECT_CHANNELS_MAX names (NULL:
   * none). The daemon answers the connect with the newest version's CUDA
   * buffer of each that has one, and the client's first acquire on such a
   * channel opens it (and its ready event) while the daemon answers that
   * acquire, as a subscribed consumer opens ahead: a new client's first
   * acquire then costs its opens and little more, not its opens plus a
   * round trip (docs/cuda.md, "Channels named at connect"). Nothing is
   * opened before that acquire, and only when a CUDA context is current
   * on its thread; a channel that does not exist yet, or holds host
   * memory, is just not prepared. Ignored with no_prefetch. More names
   * give TB_ELIMIT, an invalid name TB_ENAME. */
  const char *const *channels;
  /* 0 (default): a signal that arrives while a call waits for the daemon
   * does not end the wait (the library goes on waiting). Non-zero: the
   * waits that can last (tb_lease_acquire for a version to come,
   * tb_channel_wait_free, tb_notice_poll, each with a timeout other than
   * 0) end with TB_EINTR when a signal handler interrupts them (a handler
   * installed without SA_RESTART), so that the program can look at what
   * its handler noted: nothing is acquired, the daemon forgets the parked
   * request (a lease it granted meanwhile is given back before the call
   * returns), and the same call may be made again. A signal that arrives
   * just before the wait starts, or while it busy-polls (spin_us, then at
   * most a millisecond), is not seen by it.
   * The Python binding sets it, and runs Python's signal handlers then
   * (Ctrl-C raises KeyboardInterrupt). With a daemon older than Cancel
   * (FEATURE_CANCEL) only tb_notice_poll ends early. */
  int interruptible;
};

/* Fill *opts with the defaults. */
TB_EXPORT void tb_connect_options_init(struct tb_connect_options *opts);

/* The socket path used when none is given: $TENSORBROKER_SOCKET, else
 * $XDG_RUNTIME_DIR/tensorbroker.sock, else
 * /run/tensorbroker/tensorbroker.sock. Writes a NUL-terminated path into buf.
 * Returns 0, or TB_ELIMIT when it does not fit in len bytes. */
TB_EXPORT int tb_client_default_socket_path(char *buf, size_t len);

/* Connect to the daemon and open a session. opts may be NULL for defaults.
 * On success *out owns the connection; free it with tb_client_disconnect().
 * Fails with TB_ECONNECT when no daemon listens, TB_EVERSION when it speaks
 * another protocol, TB_ELIMIT when it refuses the session (one of its
 * limits, e.g. --max-sessions, is reached), TB_ETIMEDOUT when it does not
 * answer. On failure nothing is allocated, and tb_client_connect_error() tells
 * why.
 *
 * Reconnecting: when the daemon goes away (it stopped, was killed or
 * restarted), every call on the client fails with TB_EDISCONNECTED and
 * tb_client_last_error() says so ("the daemon closed the connection", and
 * "restarted" when a new daemon's socket is now at the same path). The
 * session is over and cannot be resumed: call tb_client_disconnect() and
 * tb_client_connect() again, then subscribe again, re-create buffers and
 * publish again. Tensors acquired through the old client stay mapped and
 * readable until their deleters run, but nothing protects their versions
 * any more: the producer that wrote them may write that memory again. */
TB_EXPORT int tb_client_connect(const struct tb_connect_options *opts,
                                tb_client **out);

/* Why the calling thread's last tb_client_connect() failed: the socket path
 * and the reason, e.g. "cannot connect to /run/tensorbroker/tensorbroker.sock:
 * no such file (is tensorbrokerd running? ...)", "... connection refused (a
 * stale socket: the daemon is not running)", "... permission denied (the
 * socket is mode 0660, group tensorbroker: is this user in it?)", or the
 * daemon's own reason for refusing the session. Copies it into buf (may be
 * NULL when len is 0), NUL-terminated and truncated to len, and returns the
 * length of the full text; an empty string after a successful connect or
 * before any. The text is thread-local: each thread reads its own last
 * connect, and other calls never change it. Any thread. */
TB_EXPORT size_t tb_client_connect_error(char *buf, size_t len);

/* Close the session. The daemon then ends every lease, buffer registration
 * and subscription the session held. Tensors acquired through this client
 * stay mapped until their deleters run, which is safe after this call, but
 * their leases end here: each gets its done event after the work queued on
 * its streams so far, and the producer may then write the version again,
 * so reads issued after this call may see newer data. Release the tensors
 * you still read first (the Python binding keeps the session open for
 * them). NULL is accepted. No other thread may use the client
 * during or after this call. The session ends with a Goodbye, so the
 * channels it published close with the reason "publisher disconnected"; a
 * process that ends without calling this is reported to their consumers as
 * "publisher ended without closing its session" (docs/protocol.md,
 * "Goodbye"). Called in a child that inherited the client through fork(),
 * it says no Goodbye: the session stays the parent's. */
TB_EXPORT void tb_client_disconnect(tb_client *c);

/* The connection's socket. It becomes readable when a notice (or a reply)
 * arrives; poll it, then call tb_notice_poll(). Do not read from it or
 * close it. */
TB_EXPORT int tb_client_fd(const tb_client *c);

/* The session id the daemon gave this connection. */
TB_EXPORT uint64_t tb_client_session_id(const tb_client *c);

/* The stream contract negotiated at connect time. */
TB_EXPORT int tb_client_contract(const tb_client *c);

/* Copy the explanation of the calling thread's last failed call on this
 * client (the daemon's message, or the library's) into buf, NUL-terminated
 * and truncated to len; a thread that has made no call on it gets the
 * client's last, whichever thread made it. Returns the length of the full
 * message. An empty string when the last call succeeded. */
TB_EXPORT size_t tb_client_last_error(tb_client *c, char *buf, size_t len);

/* ---- host buffers ------------------------------------------------------ */

typedef struct tb_buffer tb_buffer;

/* Consumers may map the buffer writable (default: read-only). */
#define TB_BUFFER_CONSUMERS_MAY_WRITE 0x1u
/* Pinned host memory (memory kind TB_MEMORY_CUDA_HOST): the same sealed
 * memfd, registered with cuMemHostRegister (page-locked, so that copies to
 * and from a GPU run at DMA speed) by this process and by each consumer
 * that maps it; its tensors are published and acquired as kDLCUDAHost.
 * A process without a CUDA driver maps it unpinned: the same memory as
 * kDLCPU, never a copy (tb_buffer_pinned() here, the tensor's device in a
 * consumer). A driver that refuses the registration (the memlock limit,
 * for one) is TB_ECUDA naming the kind, and nothing is created; a daemon
 * without FEATURE_CUDA_HOST is TB_ENOTSUP (docs/cuda.md, "Pinned host
 * memory"). */
#define TB_BUFFER_PINNED 0x2u

/* Create a shareable host buffer of size bytes (a memfd, sealed against
 * shrinking and growing), map it read-write in this process and register it
 * with the daemon. The application writes tensors into tb_buffer_data() and
 * publishes them with tb_channel_publish(). Unless flags has
 * TB_BUFFER_CONSUMERS_MAY_WRITE, the memfd is also sealed with
 * F_SEAL_FUTURE_WRITE once mapped here, so that the kernel gives consumers
 * no writable route to it while this mapping stays writable; that needs
 * Linux 5.1 or newer (older kernels: TB_ENOTSUP, naming the kernel;
 * docs/memory-access.md). On success *out owns the buffer; free it
 * with tb_buffer_destroy(). The buffer belongs to c and must be destroyed
 * before c is disconnected, or is destroyed with it. */
TB_EXPORT int tb_buffer_create_host(tb_client *c, size_t size, unsigned flags,
                                    tb_buffer **out);

/* Create a CUDA VMM buffer of at least size bytes on CUDA device ordinal
 * device (docs/cuda.md, "VMM buffers"): device memory made with cuMemCreate
 * so that it can be shared as a file descriptor, rounded up to the device's
 * allocation granularity (2 MiB on an H200; tb_buffer_size says how much
 * tensors may use: on a device with 64-bit stream memory operations the
 * allocation's last 4 KiB or more are its signals, which order the
 * exchange with processes that interprocess events do not reach, docs/
 * cuda.md, "Signals"), mapped read-write in this process and registered
 * with the daemon, which
 * keeps the descriptor: versions published from it stay readable after
 * this process ends, even if it is killed. tb_buffer_data() is a device
 * pointer (CUdeviceptr) usable like any other: publish kDLCUDA tensors
 * that lie in it with tb_channel_publish(). flags: 0 or
 * TB_BUFFER_CONSUMERS_MAY_WRITE (consumers map it read-write; otherwise
 * read-only, which their library sets, not the daemon). TB_ENOCUDA without
 * a CUDA driver, TB_ENOTSUP when the device cannot share memory as file
 * descriptors or the daemon does not accept VMM buffers (older than
 * FEATURE_CUDA_VMM), naming which. Free with tb_buffer_destroy(). */
TB_EXPORT int tb_buffer_create_cuda(tb_client *c, size_t size, int device,
                                    unsigned flags, tb_buffer **out);

/* Start of the buffer's mapping in this process (page-aligned; a device
 * pointer for a buffer from tb_buffer_create_cuda()). */
TB_EXPORT void *tb_buffer_data(const tb_buffer *b);

/* Size in bytes that tensors may use, as created (a CUDA VMM buffer's
 * signal area, if any, is not counted). */
TB_EXPORT size_t tb_buffer_size(const tb_buffer *b);

/* The daemon's id for the buffer. */
TB_EXPORT uint64_t tb_buffer_id(const tb_buffer *b);

/* 1 when this process's mapping of b is pinned (a TB_BUFFER_PINNED buffer
 * registered with cuMemHostRegister), 0 otherwise (a plain host buffer, or
 * a pinned one in a process where no CUDA driver loads). */
TB_EXPORT int tb_buffer_pinned(const tb_buffer *b);

/* Unregister and unmap the buffer. Versions already published from it stay
 * readable by consumers: the daemon keeps the memory until their leases end,
 * then tells consumers to drop it. NULL is accepted. Returns 0, or an error
 * from the daemon (the local mapping is freed in either case). */
TB_EXPORT int tb_buffer_destroy(tb_buffer *b);

/* ---- publishing ---------------------------------------------------------- */

struct tb_publish_options {
  size_t struct_size;   /* sizeof(struct tb_publish_options) */
  const void *metadata; /* user bytes delivered with the version (copied) */
  size_t metadata_len;  /* at most the daemon's limit (default 4096) */
  /* Versions the channel keeps after newer ones arrive (>=1); 0: leave the
   * channel's depth as it is (1 for a new channel). */
  uint32_t history_depth;
  /* CUDA tensors: the stream whose work produces the data. NULL follows the
   * contract. Host tensors: must be NULL. */
  void *stream;
  /* DLPACK_FLAG_BITMASK_READ_ONLY etc., carried to consumers. */
  uint64_t flags;
};

TB_EXPORT void tb_publish_options_init(struct tb_publish_options *opts);

/* Publish t as the next version of channel. t's data must lie inside a buffer
 * created with tb_buffer_create_host() on this client (kDLCPU; a
 * TB_BUFFER_PINNED buffer's tensors may say kDLCPU or kDLCUDAHost and are
 * published as kDLCUDAHost), or inside CUDA device memory (kDLCUDA;
 * docs/cuda.md). t is borrowed: its shape and
 * strides are copied, and its data must not be rewritten until the daemon
 * says the version is free (tb_channel_wait_free()).
 * NULL strides mean compact row-major. Only one session may publish to a
 * channel at a time (TB_EBUSY otherwise); the channel is created on first
 * publish. opts may be NULL. Writes the new version number to *out_version
 * when out_version is not NULL. */
TB_EXPORT int tb_channel_publish(tb_client *c, const char *channel,
                                 const DLTensor *t,
                                 const struct tb_publish_options *opts,
                                 uint64_t *out_version);

/* Publish a copy of t, which may live in any host memory: the bytes are
 * copied into a new broker buffer (compact row-major) that the daemon frees
 * once the version is. Slower than tb_channel_publish() by one copy and one
 * buffer registration; meant for data not produced in a broker buffer. */
TB_EXPORT int tb_channel_publish_copy(tb_client *c, const char *channel,
                                      const DLTensor *t,
                                      const struct tb_publish_options *opts,
                                      uint64_t *out_version);

/* Wait until nobody reads version of channel any more, so that its buffer may
 * be rewritten. For CUDA versions, stream (NULL follows the contract) is made
 * to wait on every consumer's done event; the host does not block on the GPU.
 * timeout_ms: <0 waits forever, 0 only asks (TB_EBUSY if still leased or kept
 * in history). TB_ETIMEDOUT when the wait runs out, TB_ENOTFOUND for a version
 * never published. A version leaves the channel's history when history_depth
 * newer versions exist. TB_ELIMIT when more consumers released it with done
 * events than the daemon keeps (--max-done-events): their reads cannot be
 * waited for, so the buffer must not be rewritten (every later call on that
 * version says the same while the client remembers it; docs/limits.md), and
 * for a wait past the session's --max-waits waiting requests. */
TB_EXPORT int tb_channel_wait_free(tb_client *c, const char *channel,
                                   uint64_t version, int timeout_ms,
                                   void *stream);

/* ---- producer rings ------------------------------------------------------ */

/* A producer's ring of nslots slots (2 to 1024) of slot_bytes each (rounded
 * up to 256 bytes), in one CUDA VMM buffer on device
 * (tb_buffer_create_cuda's flags), for the versions of channel: write each
 * frame into the slot tb_ring_next() gives and publish it with
 * tb_ring_publish(). Not thread-safe: one thread drives a ring. */
typedef struct tb_ring tb_ring;
TB_EXPORT int tb_ring_create_cuda(tb_client *c, const char *channel,
                                  size_t slot_bytes, unsigned nslots,
                                  int device, unsigned flags, tb_ring **out);
/* The same ring in one host buffer (tb_buffer_create_host's flags:
 * TB_BUFFER_PINNED for pinned host memory, a CPU stage's frames for GPU
 * consumers). */
TB_EXPORT int tb_ring_create_host(tb_client *c, const char *channel,
                                  size_t slot_bytes, unsigned nslots,
                                  unsigned flags, tb_ring **out);
/* The next slot's pointer (a device pointer for a CUDA ring), once the
 * version last published from it is free: tb_channel_wait_free(timeout_ms,
 * stream), which makes stream wait for the consumers' done events (a
 * pinned host ring with stream NULL: the host waits for them; TB_EBUSY
 * with timeout_ms 0 while it is read or kept, TB_ETIMEDOUT when the wait
 * runs out). Called again before tb_ring_publish(), it gives the same slot,
 * for a CUDA ring only on the same stream (TB_ESTREAM otherwise). */
TB_EXPORT int tb_ring_next(tb_ring *r, int timeout_ms, void *stream,
                           void **data);
/* Publish t, which must lie inside the slot tb_ring_next() gave (TB_EINVAL
 * otherwise, nothing published), as channel's next version. opts as for
 * tb_channel_publish(); its history_depth (1 when 0) must be below nslots.
 * A CUDA ring's opts->stream must be the stream tb_ring_next() was given
 * (NULL standing for the contract's, as there): the slot's reuse was
 * ordered on that stream only, and writes on another may overtake the
 * consumers' reads (TB_ESTREAM otherwise, nothing published). The next
 * tb_ring_next() moves on to the following slot. */
TB_EXPORT int tb_ring_publish(tb_ring *r, const DLTensor *t,
                              const struct tb_publish_options *opts,
                              uint64_t *out_version);
/* The ring's buffer (its tb_buffer_id, tb_buffer_data). */
TB_EXPORT tb_buffer *tb_ring_buffer(const tb_ring *r);
/* Destroy the buffer (versions already published stay readable) and the
 * ring. NULL is accepted. */
TB_EXPORT int tb_ring_destroy(tb_ring *r);

/* ---- acquiring ----------------------------------------------------------- */

enum tb_acquire_mode {
  TB_ACQUIRE_LATEST = 0, /* the newest version (waits if there is none yet) */
  TB_ACQUIRE_NEXT = 1,   /* the first version newer than opts->version */
  TB_ACQUIRE_EXACT = 2   /* exactly opts->version, if still held */
};

struct tb_acquire_options {
  size_t struct_size; /* sizeof(struct tb_acquire_options) */
  int mode;           /* enum tb_acquire_mode; default TB_ACQUIRE_LATEST */
  uint64_t version;   /* for NEXT and EXACT */
  /* How long to wait for a version to exist: <0 forever, 0 not at all
   * (TB_EAGAIN then). Default -1. */
  int timeout_ms;
  /* CUDA tensors: the stream that will read the data; it is made to wait on
   * the producer's ready event. NULL follows the contract. Host: NULL. */
  void *stream;
  /* Fields below were added after 0.1.0; they are read only when
   * struct_size covers them, so callers built against the older struct get
   * the defaults. */
  /* CUDA tensors: the consumer's device, as an ordinal of THIS process's
   * visible devices. -1 (default): the device holding the memory (matched by
   * UUID), as before. Another device: the memory is mapped for that device
   * through peer access (TB_EDEVICE when the two devices cannot reach each
   * other), or copied onto it with TB_ACQUIRE_COPY_TO_DEVICE. Host tensors
   * ignore it. */
  int device;
  /* TB_ACQUIRE_* flags below; unknown bits are TB_EINVAL. Default 0. */
  unsigned flags;
  /* A tensor that tb_lease_acquire() on this client returned, to release in the
   * same message as this acquire: a consumer's loop of "release the last
   * version, acquire the next" then costs one round trip to the daemon
   * instead of a one-way Release plus a round trip. The lease ends as
   * tb_lease_release(release, release_stream) would end it, before the acquire
   * is looked at and whatever becomes of the acquire (timeout, error), and the
   * tensor is freed: do not use it afterwards. If the call's own arguments
   * are refused (TB_EINVAL, TB_ENAME; also TB_EINVAL for a tensor not
   * acquired on this client) nothing is released. If the CUDA done event
   * cannot be recorded (TB_ECAPTURE, TB_ESTREAM, TB_ECUDA) the lease ends
   * without one, as with tb_lease_release(), and that error is returned without
   * acquiring. A daemon older than this field gets the Release as its own
   * message first. Default NULL: nothing released. */
  DLManagedTensorVersioned *release;
  /* CUDA: the stream the released tensor was read on, for its done event;
   * NULL follows the contract (tb_lease_release()'s rules). Default NULL. */
  void *release_stream;
};

/* With opts->device naming another GPU than the one holding the tensor:
 * instead of mapping the producer's memory through peer access, copy the
 * bytes the tensor spans device-to-device into a new allocation on
 * opts->device (same shape and strides, DLPACK_FLAG_BITMASK_IS_COPIED,
 * writable) and end the lease as soon as the copy is enqueued (with a done
 * event recorded after it). Ignored when the tensor already lives on
 * opts->device (or device is -1), and for host tensors: the flag asks for a
 * copy only across devices. docs/cuda.md, "Cross-GPU exchange". */
#define TB_ACQUIRE_COPY_TO_DEVICE 0x1u

TB_EXPORT void tb_acquire_options_init(struct tb_acquire_options *opts);

/* Take a lease on a version of channel and return it as a DLPack tensor that
 * points into the producer's memory (no copy). On success *out is owned by
 * the caller; calling (*out)->deleter(*out), or tb_lease_release(), ends the
 * lease. The deleter may be called from any thread, also while another thread
 * waits in tb_lease_acquire() on the same client, and after
 * tb_client_disconnect() (then it only unmaps). The tensor is read-only (flag
 * DLPACK_FLAG_BITMASK_READ_ONLY, memory mapped PROT_READ) unless the producer
 * allowed writes.
 *
 * The returned DLTensor: data already includes the layout's byte offset
 * (byte_offset is always 0, since not every DLPack consumer honours it);
 * strides are always filled (compact row-major ones computed when the
 * producer sent none) except for 0-d tensors; device is kDLCPU, or kDLCUDA
 * with this process's ordinal of the producer's device (matched by UUID);
 * the managed tensor's version is {1, 1}. Buffers are mapped once per
 * client and shared by all leases on them.
 *
 * CUDA: opts->stream (NULL follows the contract) is made to wait on the
 * producer's ready event, and remembered for the lease's end (see "When a
 * CUDA lease ends" below); TB_ECAPTURE when that wait would invalidate a
 * graph capture, TB_ESTREAM for NULL under TB_CONTRACT_EXPLICIT,
 * TB_ENOCUDA without a driver. Host tensors ignore the stream.
 *
 * Another GPU (opts->device >= 0 and not the memory's device): the memory
 * is mapped for opts->device by peer access and the DLTensor keeps the
 * memory's ordinal (where the data lives, as this process numbers it);
 * TB_EDEVICE when opts->device cannot reach it by peer access (never a
 * silent copy). With TB_ACQUIRE_COPY_TO_DEVICE the tensor is copied onto
 * opts->device instead. With opts->device set, the stream must run on that
 * device (TB_ESTREAM otherwise), and the legacy and per-thread default
 * streams mean that device's. TB_EDEVICE for a device this process does not
 * see, TB_EINVAL for unknown flags. See docs/cuda.md, "Cross-GPU exchange".
 *
 * opts may be NULL. Errors: TB_ETIMEDOUT, TB_EAGAIN (timeout
 * 0 and nothing there), TB_ENOTFOUND (EXACT version gone, or no such channel
 * with timeout 0), TB_ECLOSED (the channel's producer is gone and no version
 * that may still be granted matches: at once with timeout 0, else when the
 * timeout runs out, since a new producer may take the channel over and carry
 * on its numbering meanwhile; or EXACT of a version whose CUDA IPC memory
 * died with its producer), TB_ELIMIT (too many leases, or a wait past the
 * session's --max-waits waiting requests: the file's top comment). */
TB_EXPORT int tb_lease_acquire(tb_client *c, const char *channel,
                               const struct tb_acquire_options *opts,
                               DLManagedTensorVersioned **out);

/* When a CUDA lease ends, and on which streams (docs/cuda.md, "When a lease
 * ends"). A lease remembers every stream the consumer declared for it: the
 * stream given to tb_lease_acquire() (opts->stream), to tb_lease_wait(), to
 * tb_lease_use() and to tb_lease_release(); NULL counts as the contract's
 * default stream it stands for, TB_STREAM_NO_SYNC (-1) declares nothing.
 * However the lease ends - tb_lease_release(), the tensor's deleter on any
 * thread, the release riding on an acquire, tb_client_disconnect() - the done
 * event the producer waits for is recorded after the work queued on ALL of them
 * at that moment (one stream: recorded on it; several: on a stream of the
 * library's that waits for each), never on a stream the consumer did not
 * declare. Then:
 *  - No stream declared at all (only -1): the producer gets no done event
 *    and may rewrite the memory as soon as the lease has ended; a -1
 *    consumer promises that its reads are finished (or ordered by itself)
 *    when it ends the lease.
 *  - A remembered stream is capturing a graph when the lease ends: nothing
 *    can be recorded after the real work queued on it before the capture
 *    (a record inside the capture would mark the graph's future launches
 *    instead). The lease is kept, and ended with its done event by the
 *    first call on the same client (tb_lease_acquire, tb_lease_release or
 *    a deleter of another tensor, tb_notice_poll, tb_channel_wait_free,
 *    tb_client_disconnect) that finds no remembered stream capturing. The
 *    capture is never touched. A graph that reads the tensor must be
 *    launched before the lease ends, on a stream the lease remembers.
 *  - The streams a lease remembers must outlive it: the library records on
 *    them when the lease ends, and CUDA cannot tell a destroyed stream's
 *    handle from a live one (on the H200 the driver crashed on one).
 *    Destroy a stream only after the leases it read have ended.
 *  - tb_client_disconnect(): every lease still held ends as above, and the
 *    tensors stay mapped, but the producer may then rewrite them.
 */

/* End a lease early: t's done event is recorded on stream (CUDA; NULL: the
 * streams the lease remembers, or the contract's default when it
 * remembers none) and on every stream the lease remembers, and handed to
 * the producer. Host tensors take NULL. t is freed whether or not the call
 * succeeds; do not use it afterwards. If the done event cannot be recorded
 * (TB_ECAPTURE, TB_ESTREAM, TB_ECUDA) the lease still ends, without a done
 * event, and that error is returned. TB_EINVAL for a tensor that
 * tb_lease_acquire() did not return (it is then left alone). Any thread.
 *
 * The tensor's plain deleter, t->deleter(t), ends the lease as
 * tb_lease_release(t, NULL) does: on the streams the lease remembers. */
TB_EXPORT int tb_lease_release(DLManagedTensorVersioned *t, void *stream);

/* Make stream wait (again) for the producer's ready event of a tensor
 * returned by tb_lease_acquire(), and remember stream as one that reads it (its
 * done event will be recorded there): for consumers that acquire with
 * TB_STREAM_NO_SYNC and learn their stream later, as DLPack's __dlpack__
 * (stream=...) does. The stream rules are tb_lease_acquire()'s: NULL follows
 * the contract, TB_STREAM_NO_SYNC does nothing, a capturing stream gets an
 * external wait (replays wait for the producer's newest record on the same
 * stream), the legacy stream while this thread captures is TB_ECAPTURE.
 * TB_ELIMIT when the lease already remembers 8 streams. Host tensors: 0,
 * nothing to wait for. Any thread, also after tb_client_disconnect();
 * TB_EINVAL for a tensor not from tb_lease_acquire(). */
TB_EXPORT int tb_lease_wait(const DLManagedTensorVersioned *t, void *stream);

/* Remember stream as one that reads t, without waiting: its done event
 * will be recorded there when the lease ends, whoever ends it (for
 * example a release(stream=s) while a consumer library still holds the
 * tensor, which ends the lease later through the deleter). Same stream
 * rules and errors as tb_lease_wait(); host tensors: 0. Any thread. */
TB_EXPORT int tb_lease_use(const DLManagedTensorVersioned *t, void *stream);

struct tb_lease_info {
  uint64_t version;
  uint64_t lease_id;
  const void *metadata; /* valid as long as the tensor */
  size_t metadata_len;
  const char *channel;  /* valid as long as the tensor */
  uint64_t buffer_id;
  int memory_kind;      /* enum tb_memory_kind */
  uint32_t producer_pid;
};

/* Describe a tensor returned by tb_lease_acquire(): fill the first
 * struct_size bytes of *out (sizeof(struct tb_lease_info); the struct_size
 * rules at the top of this file). No call to the daemon; any thread, also
 * after tb_client_disconnect(). TB_EINVAL for any other tensor, or a bad
 * struct_size, and then *out is not written. */
TB_EXPORT int tb_lease_get_info(const DLManagedTensorVersioned *t,
                                size_t struct_size, struct tb_lease_info *out);

/* ---- notices --------------------------------------------------------------- */

enum tb_notice_type {
  TB_NOTICE_NEW_VERSION = 1,    /* channel, version (subscribers only) */
  TB_NOTICE_VERSION_FREE = 2,   /* channel, version, buffer_id (producer) */
  TB_NOTICE_BUFFER_RETIRED = 3, /* buffer_id */
  TB_NOTICE_CHANNEL_CLOSED = 4, /* channel, reason: "publisher
                                   disconnected", or "publisher ended
                                   without closing its session" and maybe
                                   "; GPU work of version N may never
                                   finish", with N in version (else 0;
                                   docs/cuda.md, "What happens on a
                                   crash") */
  TB_NOTICE_DAEMON_CLOSING = 5  /* reason */
};

struct tb_notice {
  int type;
  char channel[TB_NAME_MAX + 1];
  uint64_t version;
  uint64_t buffer_id;
  char reason[128];
};

/* Receive new-version notices for channel (which need not exist yet). */
TB_EXPORT int tb_channel_subscribe(tb_client *c, const char *channel);
TB_EXPORT int tb_channel_unsubscribe(tb_client *c, const char *channel);

/* Take the oldest queued notice into the first struct_size bytes of *out
 * (sizeof(struct tb_notice); the struct_size rules at the top of this
 * file). Waits up to timeout_ms for one (<0 forever, 0 not at all);
 * TB_EAGAIN when none came. The client keeps at most 4096 notices; older
 * ones are dropped first. Notices that only concern the library (buffer
 * retired) are also handled internally. TB_EINVAL for a bad struct_size,
 * and then no notice is taken. */
TB_EXPORT int tb_notice_poll(tb_client *c, size_t struct_size,
                             struct tb_notice *out, int timeout_ms);

/* ---- introspection -------------------------------------------------------- */

struct tb_channel_info {
  char name[TB_NAME_MAX + 1];
  uint64_t latest_version;
  uint32_t history_depth;
  uint64_t publisher_session; /* 0: none connected */
  uint32_t versions_held;
  uint32_t leases;
  uint32_t subscribers;
  int closed;
  uint64_t publishes;
  /* Added after 0.1.0: filled when struct_size covers them (never by the
   * 0.1.0 symbol tb_list_channels, see "older names"). */
  uint32_t waiters;           /* acquires parked on the name */
  /* No such channel: listed only because acquires wait on the name (it was
   * never published, or was dropped); the fields above but name and
   * waiters are zero. */
  int waiting;
  /* enum tb_memory_kind of the newest version held (TB_MEMORY_NONE: none,
   * or a daemon older than this field) */
  int memory_kind;
};

struct tb_session_info {
  uint64_t session_id;
  uint32_t pid, uid, gid;
  char name[64];
  int stream_contract;
  uint32_t leases;
  uint32_t buffers;
  uint32_t subscriptions;
  uint64_t implicit_stream_calls; /* calls that relied on the NULL default */
  uint64_t requests;
};

struct tb_status {
  char daemon_version[32];
  uint32_t pid;
  uint64_t uptime_ms;
  uint32_t sessions, channels, buffers, leases;
  uint64_t requests;
  uint64_t bad_messages;
  uint64_t sessions_dropped;
  char socket_path[108];
};

/* One lease held in the daemon (tb_lease_list). */
struct tb_lease_entry {
  uint64_t lease_id;
  uint64_t session_id;       /* the session holding it */
  uint32_t pid, uid;         /* that session's process and user */
  char session_name[64];
  char channel[TB_NAME_MAX + 1];
  uint64_t version;
  uint64_t bytes;            /* the size of the version's buffer */
  int memory_kind;           /* enum tb_memory_kind */
  uint64_t age_ms;           /* since the lease was granted */
  uint64_t buffer_id;
  int ready_event;           /* the version has a ready event */
  /* Done events of consumers that released this version already: its
   * producer hears of them (VersionFree) once the last lease ends. */
  uint32_t done_events;
  /* The version's memory died with its producer: never granted again, it
   * goes with its last lease. */
  int died;
};

/* What a parked request waits for (tb_wait_entry.what). */
enum tb_wait_what {
  TB_WAIT_ACQUIRE_LATEST = 0, /* an acquire: the channel's first version */
  TB_WAIT_ACQUIRE_NEXT = 1,   /* an acquire: a version after .version */
  TB_WAIT_ACQUIRE_EXACT = 2,  /* not parked by today's daemon */
  TB_WAIT_FREE = 3            /* tb_channel_wait_free(): .version freed */
};

/* "acquire-latest", "acquire-next", "acquire-exact", "wait-free" (as tbctl
 * and the Python binding show them); NULL for any value this library does
 * not know (a newer daemon may report waits it does not). Static storage;
 * any thread. */
TB_EXPORT const char *tb_wait_what_name(int what);

/* One parked request in the daemon (tb_wait_list); a session may have
 * several (up to the daemon's --max-waits). */
struct tb_wait_entry {
  uint64_t session_id;
  uint32_t pid, uid;
  char session_name[64];
  int what;                  /* enum tb_wait_what */
  char channel[TB_NAME_MAX + 1];
  uint64_t version;          /* NEXT: after this one; FREE: this one; else 0 */
  uint64_t age_ms;           /* since it was parked */
  int64_t timeout_ms;        /* left before it times out; -1: never */
  /* TB_WAIT_FREE: the version's leases (tb_lease_list names them), and
   * whether it is still in the channel's history (then it is freed only
   * once newer versions push it out, whatever the leases). */
  uint32_t leases;
  int in_history;
};

/* One buffer held in the daemon (tb_buffer_list): registered, or retired
 * (its producer destroyed it, or ended) while versions of it are held. */
struct tb_buffer_entry {
  uint64_t buffer_id;
  int memory_kind;           /* enum tb_memory_kind */
  uint64_t size;             /* bytes */
  int32_t device_type;       /* DLDeviceType, as registered */
  int32_t device_id;
  uint8_t device_uuid[16];   /* a CUDA device's UUID; zero for host memory */
  /* The session that registered it: 0 and "" once that session ended.
   * pid and uid stay: its producer's. */
  uint64_t session_id;
  uint32_t pid, uid;
  char session_name[64];
  int retired;               /* no new publish: it goes with its last
                              * version */
  uint32_t versions;         /* versions of it held: in a channel's
                              * history, or leased */
  uint32_t leases;           /* leases of those versions (tb_lease_list
                              * names them) */
  int writable;              /* consumers may write it */
  uint64_t signal_offset;    /* where its signal area starts (0: none) */
  /* Its versions may still be granted once its producer ended (host and
   * VMM memory; not CUDA IPC memory, which dies with its producer). */
  int survives_producer;
};

/* Lists: *out is an array of *count entries allocated by the library,
 * struct_size bytes apart (the struct_size rules at the top of this file);
 * free it with tb_free(). It is never NULL on success, also when *count is
 * 0. The daemon answers in pages that fit one message; the library asks
 * for every page, so the list is whole. On failure *out and *count are not
 * written. Any thread (calls on one client are serialised). */

/* Every channel, ascending by name, and the names that exist only because
 * acquires wait on them (waiting set). */
TB_EXPORT int tb_channel_list(tb_client *c, size_t struct_size,
                              struct tb_channel_info **out, size_t *count);

/* Every session, ascending by session id (this one included). */
TB_EXPORT int tb_session_list(tb_client *c, size_t struct_size,
                              struct tb_session_info **out, size_t *count);

/* Every lease the daemon holds, ascending by lease id. TB_ENOTSUP from a
 * daemon older than the operator's view (no FEATURE_OPERATOR_VIEW). */
TB_EXPORT int tb_lease_list(tb_client *c, size_t struct_size,
                            struct tb_lease_entry **out, size_t *count);

/* Every parked request (acquires waiting for a version,
 * tb_channel_wait_free() calls), ascending by session id. TB_ENOTSUP as
 * tb_lease_list(). */
TB_EXPORT int tb_wait_list(tb_client *c, size_t struct_size,
                           struct tb_wait_entry **out, size_t *count);

/* Every buffer the daemon holds, ascending by buffer id: its kind, size,
 * device and producer, and the versions and leases that hold it; retired
 * ones too while versions of them are held. Unless the daemon's access
 * rules say `default = open`, a caller that is not root, the daemon's uid
 * or an operator is shown its own uid's buffers only. TB_ENOTSUP from a
 * daemon older than the buffers view (no FEATURE_BUFFER_LIST). */
TB_EXPORT int tb_buffer_list(tb_client *c, size_t struct_size,
                             struct tb_buffer_entry **out, size_t *count);

/* The daemon's version and counters into the first struct_size bytes of
 * *out (sizeof(struct tb_status)); *out is written only on success. */
TB_EXPORT int tb_daemon_get_status(tb_client *c, size_t struct_size,
                                   struct tb_status *out);

/* Free closed channel `channel` and its versions now, rather than when its
 * retention ends or room is needed (docs/limits.md): it starts again at
 * version 1 if published again; acquires waiting on the name keep waiting.
 * Refused, changing nothing: TB_ENOTFOUND for no such channel, TB_EBUSY
 * while it has a publisher or any of its versions is leased (the message
 * names the leases), TB_EPERM unless the caller's uid published it last
 * or is root or the daemon's; TB_ENOTSUP from an older daemon. */
TB_EXPORT int tb_channel_drop(tb_client *c, const char *channel);
/* The daemon's metrics in the Prometheus text exposition format 0.0.4
 * (the metrics are listed in docs/deploy.md, "Metrics"): *text is a
 * NUL-terminated copy allocated by the library, freed with tb_free(), and
 * *len (when len is not NULL) its length. The daemon sends the text in
 * pages of one snapshot; this call gathers them, so the text is whole and
 * consistent. On failure *text and *len are not written: TB_ENOTSUP from
 * a daemon that predates metrics (nothing is sent, the session goes on),
 * TB_ENOMEM, or the errors of any call. Any thread (calls on one client
 * are serialised). */
TB_EXPORT int tb_daemon_get_metrics(tb_client *c, char **text, size_t *len);

/* Free memory returned by the library. NULL is accepted. */
TB_EXPORT void tb_free(void *p);

/* ---- CUDA ---------------------------------------------------------------- */

/* 0 when the CUDA driver (libcuda.so.1) could be loaded and initialised and
 * has at least one device; TB_ENOCUDA otherwise. Any thread. */
TB_EXPORT int tb_cuda_available(void);

/* ---- older names ----------------------------------------------------------
 * The names of 0.1.0, kept so that programs written or built against them
 * keep working: each is a documented alias of its new name, with the same
 * behaviour, errors and threading, and stays exported for as long as the
 * library's major version does not change. New code uses the new names
 * (docs/c-api.md has the table). Those that fill a struct take no
 * struct_size: they fill the struct's first version, as 0.1.0 laid it out
 * (today the whole struct but for struct tb_channel_info's waiters and
 * waiting), whatever later headers add to it. */

/* = tb_client_default_socket_path() */
TB_EXPORT int tb_default_socket_path(char *buf, size_t len);
/* = tb_client_connect_error() */
TB_EXPORT size_t tb_connect_error(char *buf, size_t len);
/* = tb_buffer_create_host() */
TB_EXPORT int tb_host_buffer_create(tb_client *c, size_t size, unsigned flags,
                                    tb_buffer **out);
/* = tb_buffer_create_cuda() (not of 0.1.0: the name the VMM design gave
 * it, kept beside the one that matches tb_buffer_create_host) */
TB_EXPORT int tb_cuda_buffer_create(tb_client *c, size_t size, int device,
                                    unsigned flags, tb_buffer **out);
/* = tb_channel_publish() */
TB_EXPORT int tb_publish(tb_client *c, const char *channel, const DLTensor *t,
                         const struct tb_publish_options *opts,
                         uint64_t *out_version);
/* = tb_channel_publish_copy() */
TB_EXPORT int tb_publish_copy(tb_client *c, const char *channel,
                              const DLTensor *t,
                              const struct tb_publish_options *opts,
                              uint64_t *out_version);
/* = tb_channel_wait_free() */
TB_EXPORT int tb_wait_free(tb_client *c, const char *channel, uint64_t version,
                           int timeout_ms, void *stream);
/* = tb_lease_acquire() */
TB_EXPORT int tb_acquire(tb_client *c, const char *channel,
                         const struct tb_acquire_options *opts,
                         DLManagedTensorVersioned **out);
/* = tb_lease_release() */
TB_EXPORT int tb_release(DLManagedTensorVersioned *t, void *stream);
/* = tb_lease_get_info(t, sizeof(struct tb_lease_info) of 0.1.0, out) */
TB_EXPORT int tb_lease_info(const DLManagedTensorVersioned *t,
                            struct tb_lease_info *out);
/* = tb_channel_subscribe(), tb_channel_unsubscribe() */
TB_EXPORT int tb_subscribe(tb_client *c, const char *channel);
TB_EXPORT int tb_unsubscribe(tb_client *c, const char *channel);
/* = tb_notice_poll(c, sizeof(struct tb_notice) of 0.1.0, out, timeout_ms) */
TB_EXPORT int tb_client_poll_notice(tb_client *c, struct tb_notice *out,
                                    int timeout_ms);
/* = tb_channel_list() */
TB_EXPORT int tb_list_channels_sized(tb_client *c, size_t struct_size,
                                     struct tb_channel_info **out,
                                     size_t *count);
/* Programs built against 0.1.0 call this symbol and get 0.1.0's entries (up
 * to publishes; no waiting names). Source that calls tb_list_channels() with
 * these headers reaches tb_list_channels_sized() through the macro. */
TB_EXPORT int tb_list_channels(tb_client *c, struct tb_channel_info **out,
                               size_t *count);
#define tb_list_channels(c, o, n) tb_list_channels_sized(c, sizeof(**(o)), o, n)
/* = tb_session_list(c, sizeof(struct tb_session_info) of 0.1.0, out, count) */
TB_EXPORT int tb_list_sessions(tb_client *c, struct tb_session_info **out,
                               size_t *count);
/* = tb_daemon_get_status(c, sizeof(struct tb_status) of 0.1.0, out) */
TB_EXPORT int tb_daemon_status(tb_client *c, struct tb_status *out);
/* = tb_lease_list(), tb_wait_list() */
TB_EXPORT int tb_list_leases(tb_client *c, size_t struct_size,
                             struct tb_lease_entry **out, size_t *count);
TB_EXPORT int tb_list_waits(tb_client *c, size_t struct_size,
                            struct tb_wait_entry **out, size_t *count);
/* = tb_daemon_get_metrics() */
TB_EXPORT int tb_daemon_metrics(tb_client *c, char **text, size_t *len);

#ifdef __cplusplus
}
#endif

#endif /* TENSORBROKER_TENSORBROKER_H */
