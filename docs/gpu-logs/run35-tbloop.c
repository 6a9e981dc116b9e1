#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <tensorbroker/tensorbroker.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 20000;
  tb_client *c, *p; tb_buffer *b; DLManagedTensorVersioned *m = NULL, *prev = NULL;
  cpu_set_t cs; CPU_ZERO(&cs); CPU_SET(0,&cs); sched_setaffinity(0,sizeof cs,&cs);
  if (tb_client_connect(NULL, &p) < 0 || tb_client_connect(NULL, &c) < 0) return 1;
  tb_host_buffer_create(p, 64 * sizeof(float), 0, &b);
  int64_t shape[1] = {64};
  DLTensor t = {.data = tb_buffer_data(b), .device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLFloat, 32, 1}, .shape = shape};
  tb_publish(p, "bench/x", &t, NULL, NULL);
  double *ts = malloc(n * sizeof *ts);
  struct tb_acquire_options o; tb_acquire_options_init(&o);
  for (int i = 0; i < n + 2000; i++) {
    double a = now();
    o.release = prev;
    if (tb_acquire(c, "bench/x", &o, &m) < 0) return 2;
    prev = m;
    if (i >= 2000) ts[i-2000] = now() - a;
  }
  qsort(ts, n, sizeof *ts, cmp);
  printf("tb releasing-last p50 %.2f us\n", ts[n/2]);
  tb_release(prev, NULL);
  return 0;
}
