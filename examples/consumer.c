/* Example consumer: acquires every version of a channel it can see, checks
 * each frame's checksum against the one the producer sent as metadata, and
 * reports counts and publish-to-acquire latency.
 *
 *   consumer [--socket PATH] [--channel NAME] [--timeout MS] [--ready-fd N]
 *
 * It stops after the producer's last frame, when the channel closes, or
 * when no frame came for --timeout milliseconds. Exit status 0 when every
 * received frame verified and at least one came, 1 otherwise. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tensorbroker/tensorbroker.h>

#include "frame.h"

static void usage(FILE *f) {
  fprintf(f,
          "Usage: consumer [OPTION]...\n"
          "Read frames from a tensorbroker channel and verify them.\n"
          "\n"
          "  -s, --socket PATH    daemon socket (default: the library's)\n"
          "  -c, --channel NAME   channel (default demo/frames)\n"
          "  -t, --timeout MS     give up after MS without a frame\n"
          "                       (default 10000)\n"
          "      --ready-fd N     write \"READY\\n\" to fd N once connected\n"
          "  -h, --help           this text\n");
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  static const struct option longopts[] = {
      {"socket", required_argument, NULL, 's'},
      {"channel", required_argument, NULL, 'c'},
      {"timeout", required_argument, NULL, 't'},
      {"ready-fd", required_argument, NULL, 'R'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  const char *channel = "demo/frames";
  struct tb_connect_options co;
  tb_client *c = NULL;
  long timeout_ms = 10000;
  int ready_fd = -1, opt, rc;
  uint64_t received = 0, bad = 0, skipped = 0, last = 0, expected = 0;
  uint64_t *lat = NULL;
  size_t nlat = 0, caplat = 0;
  char *end;

  tb_connect_options_init(&co);
  co.client_name = "example-consumer";
  while ((opt = getopt_long(argc, argv, "s:c:t:h", longopts, NULL)) != -1) {
    switch (opt) {
    case 's': co.socket_path = optarg; break;
    case 'c': channel = optarg; break;
    case 't':
      timeout_ms = strtol(optarg, &end, 10);
      if (*end != '\0' || timeout_ms < 0) {
        usage(stderr);
        return 2;
      }
      break;
    case 'R':
      ready_fd = (int)strtol(optarg, &end, 10);
      if (*end != '\0' || ready_fd < 0) {
        usage(stderr);
        return 2;
      }
      break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (optind != argc) {
    usage(stderr);
    return 2;
  }

  rc = tb_client_connect(&co, &c);
  if (rc < 0) {
    fprintf(stderr, "consumer: connect: %s\n", tb_strerror(rc));
    return 1;
  }
  if (ready_fd >= 0) { /* tell a launcher we are connected */
    if (write(ready_fd, "READY\n", 6) != 6)
      fprintf(stderr, "consumer: ready-fd: %s\n", strerror(errno));
    close(ready_fd);
  }

  for (;;) {
    /* NEXT after the last version seen: the oldest one the channel still
     * holds, so a consumer that falls behind by less than the history
     * depth misses nothing. The first call (version 0) waits for the
     * channel to exist. */
    struct tb_acquire_options ao;
    DLManagedTensorVersioned *m;
    struct tb_lease_info info;

    tb_acquire_options_init(&ao);
    ao.mode = TB_ACQUIRE_NEXT;
    ao.version = last;
    ao.timeout_ms = (int)timeout_ms;
    rc = tb_acquire(c, channel, &ao, &m);
    if (rc == TB_ECLOSED)
      break; /* the producer left and we have seen everything it kept */
    if (rc < 0) {
      char msg[256] = "";
      tb_client_last_error(c, msg, sizeof(msg));
      fprintf(stderr, "consumer: acquire: %s%s%s\n", tb_strerror(rc),
              msg[0] ? ": " : "", msg);
      break;
    }
    uint64_t t_acq = now_ns();
    tb_lease_info(m, &info);

    struct frame_meta meta;
    const DLTensor *t = &m->dl_tensor;
    size_t bytes = (size_t)(t->dtype.bits / 8) * t->dtype.lanes;
    for (int i = 0; i < t->ndim; i++)
      bytes *= (size_t)t->shape[i];
    if (info.metadata_len != sizeof(meta)) {
      bad++;
    } else {
      memcpy(&meta, info.metadata, sizeof(meta));
      /* The tensor is a read-only view of the producer's buffer. */
      if (frame_checksum(t->data, bytes) != meta.checksum)
        bad++;
      if (meta.frame_id > expected)
        skipped += meta.frame_id - expected;
      expected = meta.frame_id + 1;
      if (nlat == caplat) {
        caplat = caplat ? caplat * 2 : 1024;
        lat = realloc(lat, caplat * sizeof(*lat));
        if (lat == NULL)
          return 1;
      }
      lat[nlat++] = t_acq - meta.t_pub_ns;
    }
    received++;
    last = info.version;
    m->deleter(m); /* ends the lease: the producer may reuse the buffer */
    if (nlat > 0 && expected == meta.frames)
      break; /* the producer's last frame */
  }

  if (nlat > 0) {
    uint64_t sum = 0;
    qsort(lat, nlat, sizeof(*lat), cmp_u64);
    for (size_t i = 0; i < nlat; i++)
      sum += lat[i];
    printf("consumer %d: %" PRIu64 " frames, %" PRIu64 " bad checksums, %"
           PRIu64 " skipped; latency publish->acquire us: mean %.1f, p50 "
           "%.1f, p99 %.1f, max %.1f\n",
           (int)getpid(), received, bad, skipped,
           (double)sum / (double)nlat / 1000.0, (double)lat[nlat / 2] / 1000.0,
           (double)lat[(nlat * 99) / 100] / 1000.0,
           (double)lat[nlat - 1] / 1000.0);
  } else {
    printf("consumer %d: no frames received\n", (int)getpid());
  }
  free(lat);
  tb_client_disconnect(c);
  return received > 0 && bad == 0 ? 0 : 1;
}
