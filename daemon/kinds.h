/* SPDX-License-Identifier: Apache-2.0 */
/* Memory kinds as the daemon sees them: one row per kind (DESIGN.md
 * section 8, "Memory kinds are transports"). What outlives the process
 * that published it is decided here and nowhere else. */
#ifndef TBD_KINDS_H
#define TBD_KINDS_H

#include <stdbool.h>

struct tbd_kind {
  int kind;               /* TENSORBROKER__V1__MEMORY_KIND__* */
  const char *name;       /* in messages */
  bool survives_producer; /* its memory stays valid once its producer ends */
};

/* The row of kind, or NULL for a kind the daemon does not know. */
const struct tbd_kind *tbd_kind_find(int kind);

/* Whether memory of this kind may still be granted after the session that
 * published it ended. False for an unknown kind. */
bool tbd_kind_survives_producer(int kind);

/* The kind's name for messages ("memory" for an unknown kind). */
const char *tbd_kind_name(int kind);

#endif /* TBD_KINDS_H */
