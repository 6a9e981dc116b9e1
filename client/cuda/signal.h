/* SPDX-License-Identifier: Apache-2.0 */
/* Internal: signals, the ordering of CUDA VMM buffers where interprocess
 * events do not reach (another PID namespace, another /dev/shm: docs/
 * cuda.md, "Signals"). A signal is a 64-bit word in the buffer's signal
 * area (its last bytes, BufferRegister.signal_offset): a stream writes a
 * value there after the work it orders (cuStreamWriteValue64), and
 * another process's stream waits until the word holds at least that value
 * (cuStreamWaitValue64, GEQ). The memory lives as long as the buffer, in
 * the daemon too, so a word also says, after its writer died, whether the
 * work before it finished. Word 0 is the producer's ready counter; word N
 * the done counter of the consumer given done slot N. */
#ifndef TB_CUDA_SIGNAL_H
#define TB_CUDA_SIGNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda.h"

struct tb__conn;

/* The bytes of a VMM buffer's signal area: word 0 and 511 done slots (more
 * when the allocation's rounding leaves more room). */
#define TB__SIGNAL_AREA 4096u

/* The writer's side of one word. Values grow by one per write, and a
 * wait for value v passes once the word holds v or more, so a value must
 * never land before a smaller one: writes on one stream run in order, and
 * a write from another stream goes through the device's join stream after
 * a wait for the previous value. */
struct tb__signal {
  uint64_t value;              /* the last value written; 0: none yet */
  struct tb__cuda_stream last; /* the stream it was written on (its ctx set) */
  uint64_t thread;             /* per-thread default stream: whose
                                * (tb__thread_id) */
};

/* 1 when device ordinal can write and wait on 64-bit words from streams
 * (CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS), else 0. */
int tb__signal_supported(int device);

/* Write value to word on s (resolved, not no_sync), after its work. */
int tb__signal_write(const struct tb__cuda_stream *s, tb_cu_deviceptr word,
                     uint64_t value, char *why, size_t whylen);

/* Write the next value of sg to word (device memory of device ordinal)
 * after the work queued on t (resolved, not no_sync, not capturing);
 * *value is that value. In ipc_lease.c, which has the join streams; the
 * caller holds k->lock. */
int tb__signal_write_locked(struct tb__conn *k, struct tb__signal *sg,
                            tb_cu_deviceptr word, int device,
                            const struct tb__cuda_stream *t, uint64_t *value,
                            char *why, size_t whylen);

/* Make s wait until word holds value or more. A no-sync s: nothing; a
 * capturing s: TB_ENOTSUP (a graph would wait for this value at every
 * launch, never for a later one). */
int tb__signal_wait(const struct tb__cuda_stream *s, tb_cu_deviceptr word,
                    uint64_t value, char *why, size_t whylen);

/* Read word now (a synchronous copy; the memory's context current). */
int tb__signal_read(tb_cu_deviceptr word, uint64_t *value, char *why,
                    size_t whylen);

#endif /* TB_CUDA_SIGNAL_H */
