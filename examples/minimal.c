/* SPDX-License-Identifier: Apache-2.0 */
/* The smallest complete exchange: publish a tensor, acquire it, read it. */
#include <stdio.h>
#include <tensorbroker/tensorbroker.h>

int main(void) {
  tb_client *c;  tb_buffer *b;  DLManagedTensorVersioned *m;
  int rc = tb_client_connect(NULL, &c);  /* $TENSORBROKER_SOCKET etc. */
  if (rc < 0) { fprintf(stderr, "connect: %s\n", tb_strerror(rc)); return 1; }
  tb_buffer_create_host(c, 4 * sizeof(float), 0, &b);
  float *px = tb_buffer_data(b);
  for (int i = 0; i < 4; i++) px[i] = (float)i;
  int64_t shape[1] = {4};
  DLTensor t = {.data = px, .device = {kDLCPU, 0}, .ndim = 1,
                .dtype = {kDLFloat, 32, 1}, .shape = shape};
  tb_channel_publish(c, "demo/minimal", &t, NULL, NULL);  /* zero copy */
  rc = tb_lease_acquire(c, "demo/minimal", NULL, &m);  /* in a consumer */
  if (rc < 0) { fprintf(stderr, "acquire: %s\n", tb_strerror(rc)); return 1; }
  printf("got %g %g %g %g\n", ((float *)m->dl_tensor.data)[0],
         ((float *)m->dl_tensor.data)[1], ((float *)m->dl_tensor.data)[2],
         ((float *)m->dl_tensor.data)[3]);
  m->deleter(m);                                       /* ends the lease */
  tb_buffer_destroy(b);
  tb_client_disconnect(c);
  return 0;
}
