/* SPDX-License-Identifier: Apache-2.0 */
/* A producer process that publishes one small host tensor on each of n
 * channels ("<prefix>/<i>") from one buffer, then idles until released. */
#include "producer.h"

#include <stdio.h>
#include <unistd.h>

struct prod_arg {
  const char *sock;
  const char *prefix;
  long n;
  int ready_wr;
  struct tbb_gate *gate;
};

static int producer_main(void *p) {
  struct prod_arg *a = p;
  tb_client *c;
  tb_buffer *b;
  int rc = tbb_connect(a->sock, "bench-producer", TB_CONTRACT_SPEC, &c);
  if (rc < 0) {
    fprintf(stderr, "producer: connect: %s\n", tb_strerror(rc));
    return 2;
  }
  rc = tb_buffer_create_host(c, 4096, 0, &b);
  if (rc < 0) {
    fprintf(stderr, "producer: buffer: %s\n", tb_strerror(rc));
    return 3;
  }
  float *x = tb_buffer_data(b);
  for (int i = 0; i < TBB_SMALL_ELEMS; i++)
    x[i] = (float)i;
  int64_t shape[1] = {TBB_SMALL_ELEMS};
  DLTensor t = {.data = x, .device = {kDLCPU, 0}, .ndim = 1,
                .dtype = {kDLFloat, 32, 1}, .shape = shape};
  for (long i = 0; i < a->n; i++) {
    char name[128];
    snprintf(name, sizeof(name), "%s/%ld", a->prefix, i);
    rc = tb_channel_publish(c, name, &t, NULL, NULL);
    if (rc < 0) {
      fprintf(stderr, "producer: publish %s: %s\n", name, tb_strerror(rc));
      return 4;
    }
  }
  tbb_write_byte(a->ready_wr, 'p');
  tbb_gate_wait(a->gate);
  tb_buffer_destroy(b);
  tb_client_disconnect(c);
  return 0;
}

int tbb_producer_start(struct tbb_producer *p, const char *sock,
                       const char *prefix, long n) {
  int ready[2];
  if (tbb_gate_init(&p->gate) < 0)
    return -1;
  if (tbb_pipe(ready) < 0) {
    tbb_gate_close(&p->gate);
    return -1;
  }
  struct prod_arg a = {.sock = sock, .prefix = prefix, .n = n,
                       .ready_wr = ready[1], .gate = &p->gate};
  p->pid = tbb_spawn(producer_main, &a);
  close(ready[1]);
  char b;
  int rc = tbb_read_byte(ready[0], &b);
  close(ready[0]);
  if (rc < 0) {
    tbb_producer_stop(p);
    return -1;
  }
  return 0;
}

void tbb_producer_stop(struct tbb_producer *p) {
  tbb_gate_open(&p->gate);
  if (p->pid > 0)
    tbb_reap(p->pid);
  p->pid = 0;
  tbb_gate_close(&p->gate);
}
