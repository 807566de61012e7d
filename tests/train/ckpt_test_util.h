/* The set-up the checkpoint tests share (test_checkpoint.c,
 * test_ckpt_hostile.c): the world comm, this rank for CHECK messages, a
 * CPU device, and a fresh directory that rank 0 makes under /tmp and every
 * rank learns by broadcast. One copy of what each of them wrote out. */
#ifndef ZERO_TESTS_TRAIN_CKPT_TEST_UTIL_H
#define ZERO_TESTS_TRAIN_CKPT_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <zero/zero.h>

#include "check.h"

/* *comm (NULL when the world failed: a CHECK failure, return check_exit()),
 * *dev, *rank; dir (256 bytes) gets /tmp/<prefix>-XXXXXX made by rank 0. */
static inline void ckpt_test_open(zero_comm **comm, zero_device **dev, int *rank, const char *prefix, char dir[256])
{
    *comm = NULL, *dev = NULL, dir[0] = '\0';
    CHECK_OK(zero_comm_create_world(comm, NULL));
    if (!*comm) return;
    *rank = zero_comm_get_rank(*comm);
    check_set_rank(*rank);
    CHECK_OK(zero_device_create(dev, ZERO_DEVICE_CPU, 0));
    if (*rank == 0) {
        snprintf(dir, 256, "/tmp/%s-XXXXXX", prefix);
        CHECK(mkdtemp(dir) != NULL);
    }
    CHECK_OK(zero_broadcast(*comm, dir, dir, 256, ZERO_U8, 0));
}

#endif
