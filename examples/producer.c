/* SPDX-License-Identifier: Apache-2.0 */
/* Example producer: publishes frames (a float32 HxW tensor) on a channel,
 * zero copy, from a ring of broker buffers.
 *
 * Each frame is written into a host buffer made by tb_buffer_create_host(),
 * published with its frame id, a timestamp and a checksum as metadata, and
 * the buffer is rewritten only after tb_channel_wait_free() says no consumer
 * reads that version any more.
 *
 * With --cuda the ring is K device buffers (cuMemAlloc) on GPU 0: each frame
 * is copied in from a host pattern with cuMemcpyHtoDAsync on the producer's
 * own stream and published as a kDLCUDA tensor with that stream, so
 * consumers' streams wait for the copy (the library records an IPC event on
 * it); before a buffer is rewritten, tb_channel_wait_free(..., stream) makes
 * the stream wait for the consumers' done events. The host never waits for the
 * GPU. CUDA is reached through cuda_loader.c (dlopen of libcuda.so.1).
 *
 *   producer [--socket PATH] [--channel NAME] [--frames N] [--width W]
 *            [--height H] [--ring K] [--fps F] [--ready-fd N] [--hold-fd N]
 *            [--cuda] [--cuda-check]
 *
 * Exit status: 0 done, 1 a broker or CUDA call failed, 2 bad usage, 3 no
 * CUDA driver or GPU (--cuda, --cuda-check).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tensorbroker/tensorbroker.h>

#include "cuda_loader.h"
#include "frame.h"

/* Exit status for "no CUDA driver/GPU", so scripts can tell it apart. */
#define EXIT_NO_CUDA 3

static void usage(FILE *f) {
  fprintf(f,
          "Usage: producer [OPTION]...\n"
          "Publish frames (float32 HEIGHTxWIDTH) on a tensorbroker channel.\n"
          "\n"
          "  -s, --socket PATH    daemon socket (default: the library's)\n"
          "  -c, --channel NAME   channel (default demo/frames)\n"
          "  -n, --frames N       frames to publish (default 100)\n"
          "  -W, --width W        (default 512)\n"
          "  -H, --height H       (default 512)\n"
          "  -r, --ring K         buffers in the ring, >= 2 (default 8); the\n"
          "                       channel keeps K-1 versions of history\n"
          "  -f, --fps F          frames per second, 0 = as fast as possible\n"
          "                       (default 0)\n"
          "      --ready-fd N     write \"READY\\n\" to fd N once connected\n"
          "      --hold-fd N      after the last frame, keep the ring and the\n"
          "                       channel until fd N reads end-of-file (a\n"
          "                       launcher closes it once its consumers are\n"
          "                       done); use it with --cuda, whose memory\n"
          "                       lives only as long as this process\n"
          "      --cuda           publish from CUDA device memory on GPU 0: a\n"
          "                       ring of cuMemAlloc buffers, each frame copied\n"
          "                       in on the producer's own stream\n"
          "      --cuda-check     exit 0 if --cuda can work here, else say why\n"
          "                       and exit 3\n"
          "  -h, --help           this text\n"
          "\n"
          "Exit status: 0 done, 1 failure, 2 bad usage, 3 no CUDA driver/GPU\n"
          "(--cuda, --cuda-check).\n");
}

/* Parse a positive integer option, or exit with a usage error. */
static long parse_num(const char *s, const char *what, long min) {
  char *end;
  long v = strtol(s, &end, 10);
  if (*s == '\0' || *end != '\0' || v < min) {
    fprintf(stderr, "producer: bad %s '%s'\n", what, s);
    exit(2);
  }
  return v;
}

static int fail(tb_client *c, const char *what, int rc) {
  char msg[256] = "";
  if (c != NULL)
    tb_client_last_error(c, msg, sizeof(msg));
  fprintf(stderr, "producer: %s: %s%s%s\n", what, tb_strerror(rc),
          msg[0] ? ": " : "", msg);
  return 1;
}

static int cuda_fail(const struct cudl *cu, const char *what, cudl_result r) {
  fprintf(stderr, "producer: %s: %s (%d)\n", what, cudl_error_name(cu, r), r);
  return 1;
}

/* --cuda and --cuda-check: both libtensorbroker and this program's loader
 * must reach the driver and GPU 0. Returns 0 with *cu open, or prints why
 * and returns EXIT_NO_CUDA. */
static int cuda_start(struct cudl *cu) {
  char why[512];
  int rc = tb_cuda_available();

  if (cudl_open(cu, 0, why, sizeof(why)) < 0) {
    fprintf(stderr, "producer: no CUDA driver/GPU: %s\n", why);
    return EXIT_NO_CUDA;
  }
  if (rc < 0) {
    fprintf(stderr, "producer: no CUDA driver/GPU: libtensorbroker cannot "
            "use the driver (tb_cuda_available: %s)\n", tb_strerror(rc));
    cudl_close(cu);
    return EXIT_NO_CUDA;
  }
  return 0;
}

int main(int argc, char **argv) {
  static const struct option longopts[] = {
      {"socket", required_argument, NULL, 's'},
      {"channel", required_argument, NULL, 'c'},
      {"frames", required_argument, NULL, 'n'},
      {"width", required_argument, NULL, 'W'},
      {"height", required_argument, NULL, 'H'},
      {"ring", required_argument, NULL, 'r'},
      {"fps", required_argument, NULL, 'f'},
      {"ready-fd", required_argument, NULL, 'R'},
      {"hold-fd", required_argument, NULL, 'O'},
      {"cuda", no_argument, NULL, 'G'},
      {"cuda-check", no_argument, NULL, 'K'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  const char *channel = "demo/frames";
  long ready_fd = -1, hold_fd = -1;
  int use_cuda = 0, cuda_check = 0;
  struct cudl cu = {0};
  cudl_stream stream = NULL;
  cudl_deviceptr *dbufs = NULL; /* --cuda: the ring in device memory */
  float *pattern = NULL;        /* --cuda: the next frame, on the host */
  long frames = 100, width = 512, height = 512, ring = 8, fps = 0;
  struct tb_connect_options co;
  tb_client *c = NULL;
  tb_buffer **bufs;
  uint64_t *versions;
  size_t bytes;
  int opt, rc;

  tb_connect_options_init(&co);
  co.client_name = "example-producer";
  while ((opt = getopt_long(argc, argv, "s:c:n:W:H:r:f:h", longopts, NULL)) !=
         -1) {
    switch (opt) {
    case 's': co.socket_path = optarg; break;
    case 'c': channel = optarg; break;
    case 'n': frames = parse_num(optarg, "frame count", 1); break;
    case 'W': width = parse_num(optarg, "width", 1); break;
    case 'H': height = parse_num(optarg, "height", 1); break;
    case 'r': ring = parse_num(optarg, "ring size", 2); break;
    case 'f': fps = parse_num(optarg, "fps", 0); break;
    case 'R': ready_fd = parse_num(optarg, "ready fd", 0); break;
    case 'O': hold_fd = parse_num(optarg, "hold fd", 0); break;
    case 'G': use_cuda = 1; break;
    case 'K': cuda_check = 1; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (optind != argc || width > 65536 || height > 65536 || ring > 64) {
    usage(stderr);
    return 2;
  }
  bytes = (size_t)width * (size_t)height * sizeof(float);

  if (cuda_check || use_cuda) { /* before connecting: no daemon needed */
    rc = cuda_start(&cu);
    if (rc != 0)
      return rc;
    if (cuda_check) {
      printf("producer: CUDA available (GPU 0)\n");
      cudl_close(&cu);
      return 0;
    }
  }

  rc = tb_client_connect(&co, &c);
  if (rc < 0)
    return fail(NULL, "connect", rc);

  /* The ring: K buffers, each rewritten only once its last version is
   * free. versions[k] is the version last published from buffer k. */
  bufs = calloc((size_t)ring, sizeof(*bufs));
  versions = calloc((size_t)ring, sizeof(*versions));
  if (bufs == NULL || versions == NULL)
    return fail(c, "allocate", TB_ENOMEM);
  if (use_cuda) {
    cudl_result r = cu.stream_create(&stream, CUDL_STREAM_NON_BLOCKING);
    if (r != CUDL_SUCCESS)
      return cuda_fail(&cu, "cuStreamCreate", r);
    dbufs = calloc((size_t)ring, sizeof(*dbufs));
    pattern = malloc(bytes);
    if (dbufs == NULL || pattern == NULL)
      return fail(c, "allocate", TB_ENOMEM);
    for (long k = 0; k < ring; k++) {
      r = cu.mem_alloc(&dbufs[k], bytes);
      if (r != CUDL_SUCCESS)
        return cuda_fail(&cu, "cuMemAlloc", r);
    }
  } else {
    for (long k = 0; k < ring; k++) {
      rc = tb_buffer_create_host(c, bytes, 0, &bufs[k]);
      if (rc < 0)
        return fail(c, "create buffer", rc);
    }
  }

  if (ready_fd >= 0) { /* tell a launcher we are connected */
    if (write((int)ready_fd, "READY\n", 6) != 6)
      fprintf(stderr, "producer: ready-fd: %s\n", strerror(errno));
    close((int)ready_fd);
  }

  uint64_t t0 = now_ns();
  for (long f = 0; f < frames; f++) {
    long k = f % ring;
    if (versions[k] != 0) {
      /* Host memory: returns once nobody holds that version. CUDA: the
       * same, and then the stream waits for the consumers' done events, so
       * the copy below cannot overwrite a frame a consumer's stream still
       * reads; the host does not wait for the GPU. */
      rc = tb_channel_wait_free(c, channel, versions[k], -1,
                                use_cuda ? stream : NULL);
      if (rc < 0)
        return fail(c, "wait_free", rc);
    }
    float *px = use_cuda ? pattern : tb_buffer_data(bufs[k]);
    frame_fill(px, (size_t)width * (size_t)height, (uint64_t)f);

    int64_t shape[2] = {height, width};
    DLTensor t = {.data = px,
                  .device = {kDLCPU, 0},
                  .ndim = 2,
                  .dtype = {kDLFloat, 32, 1},
                  .shape = shape};
    if (use_cuda) {
      /* From pageable host memory the call returns once the driver has
       * staged the bytes, so the pattern may be refilled for the next frame
       * while the copy itself is still queued on the stream. */
      cudl_result r = cu.memcpy_htod_async(dbufs[k], px, bytes, stream);
      if (r != CUDL_SUCCESS)
        return cuda_fail(&cu, "cuMemcpyHtoDAsync", r);
      t.data = (void *)(uintptr_t)dbufs[k];
      t.device.device_type = kDLCUDA;
    }
    struct frame_meta meta = {.frame_id = (uint64_t)f,
                              .frames = (uint64_t)frames,
                              .checksum = frame_checksum(px, bytes)};
    struct tb_publish_options po;
    tb_publish_options_init(&po);
    po.metadata = &meta;
    po.metadata_len = sizeof(meta);
    po.history_depth = (uint32_t)(ring - 1);
    if (use_cuda)
      po.stream = stream; /* consumers' streams wait for the copy on it */
    meta.t_pub_ns = now_ns();
    rc = tb_channel_publish(c, channel, &t, &po, &versions[k]);
    if (rc < 0)
      return fail(c, "publish", rc);

    if (fps > 0) { /* pace like a camera would; not synchronisation */
      uint64_t due = t0 + (uint64_t)(f + 1) * 1000000000u / (uint64_t)fps;
      struct timespec ts = {(time_t)(due / 1000000000u),
                            (long)(due % 1000000000u)};
      clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
    }
  }
  double secs = (double)(now_ns() - t0) / 1e9;
  printf("producer: %ld frames of %ldx%ld float32 (%.2f MiB) in %.3f s: "
         "%.0f frames/s, %.0f MiB/s published (zero copy%s)\n",
         frames, height, width, (double)bytes / 1048576.0, secs,
         (double)frames / secs, (double)frames * (double)bytes / 1048576.0 / secs,
         use_cuda ? ", CUDA device memory on GPU 0" : "");
  fflush(stdout);

  if (hold_fd >= 0) { /* stay until the launcher says the consumers are done */
    char b[64];
    ssize_t n;
    while ((n = read((int)hold_fd, b, sizeof(b))) > 0 ||
           (n < 0 && errno == EINTR))
      ;
    close((int)hold_fd);
  }

  if (use_cuda) {
    /* Let the queued copies and waits finish, leave the channel (the daemon
     * retires the buffers), then free the memory. */
    cudl_result r = cu.stream_synchronize(stream);
    if (r != CUDL_SUCCESS)
      return cuda_fail(&cu, "cuStreamSynchronize", r);
    tb_client_disconnect(c);
    for (long k = 0; k < ring; k++)
      cu.mem_free(dbufs[k]);
    cu.stream_destroy(stream);
    cudl_close(&cu);
    free(dbufs);
    free(pattern);
  } else {
    for (long k = 0; k < ring; k++)
      tb_buffer_destroy(bufs[k]);
    tb_client_disconnect(c);
  }
  free(bufs);
  free(versions);
  return 0;
}
