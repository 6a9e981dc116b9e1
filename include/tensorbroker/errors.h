/* SPDX-License-Identifier: Apache-2.0 */
/* tensorbroker error codes.
 *
 * Every public call returns 0 or one of these negative codes. The list is the
 * one source of the enum, tb_strerror() and tb_err_name(). Codes are only
 * ever added at the end; none is renumbered or removed, so a number seen in a
 * log or on the wire keeps its meaning. */
#ifndef TENSORBROKER_ERRORS_H
#define TENSORBROKER_ERRORS_H

#define TB_ERRNO_MAP(XX)                                                     \
  XX(EINVAL, -1, "invalid argument")                                         \
  XX(ENOMEM, -2, "out of memory")                                            \
  XX(ECONNECT, -3, "cannot connect to the tensorbroker daemon")              \
  XX(EDISCONNECTED, -4, "connection to the daemon lost")                     \
  XX(EPROTO, -5, "malformed or unexpected protocol message")                 \
  XX(EVERSION, -6, "protocol version not supported by the peer")             \
  XX(ETIMEDOUT, -7, "timed out")                                             \
  XX(ENOTFOUND, -8, "no such channel, version, buffer, event or lease")      \
  XX(EEXIST, -9, "already exists")                                           \
  XX(EBUSY, -10, "busy: held by another session or still leased")            \
  XX(ELIMIT, -11, "a configured limit was exceeded")                         \
  XX(ELAYOUT, -12, "tensor layout invalid or outside its buffer")            \
  XX(EDTYPE, -13, "unsupported data type")                                   \
  XX(ENAME, -14, "invalid channel or client name")                           \
  XX(EPERM, -15, "operation not permitted")                                  \
  XX(ESTREAM, -16, "stream argument not acceptable under the contract")      \
  XX(ECAPTURE, -17, "operation would invalidate a CUDA stream capture")      \
  XX(ENOCUDA, -18, "CUDA driver not available")                              \
  XX(ECUDA, -19, "CUDA driver call failed")                                  \
  XX(EDEVICE, -20, "device not supported or not accessible")                 \
  XX(ECLOSED, -21, "channel closed: its producer is gone")                   \
  XX(ESYS, -22, "system call failed")                                        \
  XX(EAGAIN, -23, "nothing available yet")                                   \
  XX(ESTALE, -24, "object no longer valid (released or retired)")            \
  XX(ENOTSUP, -25, "operation not supported")                                \
  XX(ESHUTDOWN, -26, "daemon is shutting down")                              \
  XX(EFORKED, -27, "client inherited across fork(): connect a new one")    \
  XX(EINTR, -28, "a signal interrupted the wait")

enum tb_errno {
#define TB__ERR_ENUM(name, value, text) TB_##name = (value),
  TB_ERRNO_MAP(TB__ERR_ENUM)
#undef TB__ERR_ENUM
  TB__ERR_LAST = -29 /* one below the lowest code; not an error */
};

#endif /* TENSORBROKER_ERRORS_H */
