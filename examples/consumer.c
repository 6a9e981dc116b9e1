/* SPDX-License-Identifier: Apache-2.0 */
/* Example consumer: acquires every version of a channel it can see, checks
 * each frame's checksum against the one the producer sent as metadata, and
 * reports counts and publish-to-acquire latency.
 *
 * With --cuda it reads CUDA frames (producer --cuda) on its own stream on
 * GPU 0: tb_lease_acquire() makes that stream wait for the producer's ready
 * event, cuMemcpyDtoHAsync on the same stream copies the frame back, the
 * host waits for the stream and checks the checksum; the next acquire
 * releases the frame (tb_acquire_options.release, one request for both)
 * and hands the producer a done event recorded on that stream. CUDA is
 * reached through cuda_loader.c (dlopen of libcuda.so.1).
 *
 *   consumer [--socket PATH] [--channel NAME] [--timeout MS] [--ready-fd N]
 *            [--cuda] [--cuda-check]
 *
 * It stops after the producer's last frame, when the channel closes, or
 * when no frame came for --timeout milliseconds. Exit status 0 when every
 * received frame verified and at least one came, 1 otherwise, 2 bad usage,
 * 3 no CUDA driver/GPU (--cuda, --cuda-check). */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tensorbroker/tensorbroker.h>

#include "cuda_loader.h"
#include "frame.h"

/* Exit status for "no CUDA driver/GPU", so scripts can tell it apart. */
#define EXIT_NO_CUDA 3

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
          "      --cuda           read CUDA frames (producer --cuda) on this\n"
          "                       consumer's own stream on GPU 0, copying each\n"
          "                       back to the host to verify it\n"
          "      --cuda-check     exit 0 if --cuda can work here, else say why\n"
          "                       and exit 3\n"
          "  -h, --help           this text\n"
          "\n"
          "Exit status: 0 every frame verified, 1 failure, 2 bad usage, 3 no\n"
          "CUDA driver/GPU (--cuda, --cuda-check).\n");
}

/* --cuda and --cuda-check: both libtensorbroker and this program's loader
 * must reach the driver and GPU 0. Returns 0 with *cu open, or prints why
 * and returns EXIT_NO_CUDA. */
static int cuda_start(struct cudl *cu) {
  char why[512];
  int rc = tb_cuda_available();

  if (cudl_open(cu, 0, why, sizeof(why)) < 0) {
    fprintf(stderr, "consumer: no CUDA driver/GPU: %s\n", why);
    return EXIT_NO_CUDA;
  }
  if (rc < 0) {
    fprintf(stderr, "consumer: no CUDA driver/GPU: libtensorbroker cannot "
            "use the driver (tb_cuda_available: %s)\n", tb_strerror(rc));
    cudl_close(cu);
    return EXIT_NO_CUDA;
  }
  return 0;
}

/* --cuda: copy a frame's bytes from the device into host (grown as needed)
 * on stream, after what the stream already waits for, and wait for the
 * copy. Returns the host copy, or NULL after printing why. */
static const void *cuda_fetch(const struct cudl *cu, cudl_stream stream,
                              const DLTensor *t, size_t bytes, void **host,
                              size_t *cap) {
  cudl_result r;

  if (bytes > *cap) {
    void *p = realloc(*host, bytes);
    if (p == NULL) {
      fprintf(stderr, "consumer: out of memory\n");
      return NULL;
    }
    *host = p;
    *cap = bytes;
  }
  r = cu->memcpy_dtoh_async(*host, (cudl_deviceptr)(uintptr_t)t->data, bytes,
                            stream);
  if (r == CUDL_SUCCESS)
    r = cu->stream_synchronize(stream);
  if (r != CUDL_SUCCESS) {
    fprintf(stderr, "consumer: copying the frame back: %s (%d)\n",
            cudl_error_name(cu, r), r);
    return NULL;
  }
  return *host;
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
      {"cuda", no_argument, NULL, 'G'},
      {"cuda-check", no_argument, NULL, 'K'},
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
  int use_cuda = 0, cuda_check = 0, failed = 0;
  struct cudl cu = {0};
  cudl_stream stream = NULL;
  void *host = NULL; /* --cuda: each frame copied back here */
  size_t host_cap = 0;
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
    case 'G': use_cuda = 1; break;
    case 'K': cuda_check = 1; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (optind != argc) {
    usage(stderr);
    return 2;
  }

  if (cuda_check || use_cuda) { /* before connecting: no daemon needed */
    rc = cuda_start(&cu);
    if (rc != 0)
      return rc;
    if (cuda_check) {
      printf("consumer: CUDA available (GPU 0)\n");
      cudl_close(&cu);
      return 0;
    }
    cudl_result r = cu.stream_create(&stream, CUDL_STREAM_NON_BLOCKING);
    if (r != CUDL_SUCCESS) {
      fprintf(stderr, "consumer: cuStreamCreate: %s (%d)\n",
              cudl_error_name(&cu, r), r);
      return 1;
    }
  }

  /* Name the channel at connect: if its producer already publishes CUDA
   * frames, the first acquire opens the newest one's buffer while the
   * daemon answers (docs/cuda.md, "Channels named at connect"). */
  const char *named[] = {channel, NULL};
  co.channels = named;
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

  DLManagedTensorVersioned *prev = NULL; /* the last frame, still leased */
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
    if (use_cuda)
      ao.stream = stream; /* made to wait for the producer's ready event */
    /* The last frame's lease ends in the same request, before the wait
     * for the next one (--cuda: with a done event recorded on our stream,
     * after the copy that read it; the producer's stream waits for it
     * before rewriting the buffer). */
    ao.release = prev;
    ao.release_stream = use_cuda ? stream : NULL;
    prev = NULL;
    rc = tb_lease_acquire(c, channel, &ao, &m);
    if (rc == TB_ECLOSED)
      break; /* the producer left, none came back within the timeout, and
              * we have seen everything it kept */
    if (rc < 0) {
      char msg[256] = "";
      tb_client_last_error(c, msg, sizeof(msg));
      fprintf(stderr, "consumer: acquire: %s%s%s\n", tb_strerror(rc),
              msg[0] ? ": " : "", msg);
      break;
    }
    uint64_t t_acq = now_ns();
    tb_lease_get_info(m, sizeof(info), &info);

    struct frame_meta meta;
    const DLTensor *t = &m->dl_tensor;
    size_t bytes = (size_t)(t->dtype.bits / 8) * t->dtype.lanes;
    for (int i = 0; i < t->ndim; i++)
      bytes *= (size_t)t->shape[i];
    /* The tensor is a read-only view of the producer's buffer: host
     * memory mapped here, or (--cuda) device memory read by copying it
     * back on our stream. */
    const void *data = t->data;
    DLDeviceType want = use_cuda ? kDLCUDA : kDLCPU;
    if (t->device.device_type != want) {
      fprintf(stderr, "consumer: version %" PRIu64 " is a %s tensor; give "
              "the producer and the consumer the same --cuda setting\n",
              info.version,
              t->device.device_type == kDLCUDA ? "CUDA" : "host");
      data = NULL;
    } else if (use_cuda) {
      data = cuda_fetch(&cu, stream, t, bytes, &host, &host_cap);
    }
    if (data == NULL) {
      failed = 1;
      if (use_cuda)
        tb_lease_release(m, stream);
      else
        m->deleter(m);
      break;
    }
    if (info.metadata_len != sizeof(meta)) {
      bad++;
    } else {
      memcpy(&meta, info.metadata, sizeof(meta));
      if (frame_checksum(data, bytes) != meta.checksum)
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
    prev = m; /* released by the next acquire */
    if (nlat > 0 && expected == meta.frames)
      break; /* the producer's last frame */
  }
  if (prev != NULL) {
    rc = tb_lease_release(prev, use_cuda ? stream : NULL);
    if (rc < 0) {
      fprintf(stderr, "consumer: release: %s\n", tb_strerror(rc));
      failed = 1;
    }
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
  if (use_cuda) {
    cu.stream_destroy(stream);
    cudl_close(&cu);
    free(host);
  }
  return received > 0 && bad == 0 && !failed ? 0 : 1;
}
