/* common/error.c: a failure message may quote the previous one.
 *
 * Callers write zero_fail(h, st, "...: %s", zero_last_error()) to add context
 * to a lower layer's message (every nvme offload error does). The argument
 * then points into the very buffer being formatted: the message must come
 * out exactly "<context>: <previous message>", in the thread's buffer and in
 * the handle's, however often it is nested. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "common/error.h"

int main(void)
{
    zero_errbuf h = {{0}};
    const char *path = "/mnt/nvme0/libzero-offload/chunk-000017.bin";
    CHECK(zero_fail(NULL, ZERO_IO, "nvme store: opening %s: No such file or directory", path) == ZERO_IO);
    char inner[ZERO_ERRMSG_MAX];
    snprintf(inner, sizeof inner, "%s", zero_last_error());

    /* the argument is the thread buffer itself */
    CHECK(zero_fail(&h, ZERO_IO, "engine finalize: optimizer offload (%s) on rank %d: %s", "nvme store", 3,
                    zero_last_error()) == ZERO_IO);
    char want[ZERO_ERRMSG_MAX + 64];
    snprintf(want, sizeof want, "engine finalize: optimizer offload (nvme store) on rank 3: %s", inner);
    CHECK_MSG(strcmp(zero_last_error(), want) == 0, "got \"%s\"", zero_last_error());
    CHECK_MSG(strcmp(h.msg, want) == 0, "handle got \"%s\"", h.msg);

    /* the argument is the handle's own buffer, twice nested */
    CHECK(zero_fail(&h, ZERO_INVALID_STATE, "the swapper failed earlier (%s)", h.msg) == ZERO_INVALID_STATE);
    char want2[2 * ZERO_ERRMSG_MAX];
    snprintf(want2, sizeof want2, "the swapper failed earlier (%s)", want);
    CHECK_MSG(strcmp(h.msg, want2) == 0 && strcmp(zero_last_error(), want2) == 0, "got \"%s\"", h.msg);

    /* a message longer than the buffer is cut, never overrun, and stays terminated */
    char big[2 * ZERO_ERRMSG_MAX];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    zero_fail(&h, ZERO_IO, "%s: %s", zero_last_error(), big);
    CHECK(strlen(zero_last_error()) == ZERO_ERRMSG_MAX - 1 && strlen(h.msg) == ZERO_ERRMSG_MAX - 1);
    CHECK(strncmp(zero_last_error(), want2, strlen(want2)) == 0);

    /* forward with a prefix keeps the previous message after it */
    zero_fail(NULL, ZERO_TIMEOUT, "allreduce timed out");
    CHECK(zero_fail_forward(&h, ZERO_TIMEOUT, "engine step: ") == ZERO_TIMEOUT);
    CHECK(strcmp(h.msg, "engine step: allreduce timed out") == 0 && strcmp(zero_last_error(), h.msg) == 0);
    return check_exit();
}
