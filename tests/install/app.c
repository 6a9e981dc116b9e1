/* SPDX-License-Identifier: Apache-2.0 */
/* A user's program, built against the installed tree in every way
 * tests/install/consumers.sh links it: the header and the library it runs
 * with agree on the version (and both are VERSION's, given as argv[1]), and
 * a connect where no daemon listens fails cleanly with TB_ECONNECT. */
#include <stdio.h>
#include <string.h>
#include <tensorbroker/tensorbroker.h>

int main(int argc, char **argv) {
  struct tb_connect_options o;
  tb_client *c = NULL;
  int rc;

  if (strcmp(tb_version(), TB_VERSION_STRING) != 0) {
    fprintf(stderr, "library %s, header %s\n", tb_version(), TB_VERSION_STRING);
    return 1;
  }
  if (argc > 1 && strcmp(argv[1], TB_VERSION_STRING) != 0) {
    fprintf(stderr, "header %s, VERSION %s\n", TB_VERSION_STRING, argv[1]);
    return 1;
  }
  tb_connect_options_init(&o);
  o.socket_path = argc > 2 ? argv[2] : "/nonexistent/tensorbroker.sock";
  rc = tb_client_connect(&o, &c);
  if (rc != TB_ECONNECT || c != NULL) {
    fprintf(stderr, "connect without a daemon: %d %s\n", rc, tb_err_name(rc));
    return 1;
  }
  printf("tensorbroker %s: no daemon: %s\n", tb_version(), tb_strerror(rc));
  return 0;
}
