/* Retired handles: see handle.h. */
#include "handle.h"

#include <pthread.h>
#include <stdlib.h>

static pthread_mutex_t retired_lock = PTHREAD_MUTEX_INITIALIZER;
static void *retired[ZERO_HANDLE_RETIRED_MAX];
static unsigned retired_next;

void zero_handle_retire(void *handle)
{
    if (!handle) return;
    pthread_mutex_lock(&retired_lock);
    void *oldest = retired[retired_next];
    retired[retired_next] = handle;
    retired_next = (retired_next + 1) % ZERO_HANDLE_RETIRED_MAX;
    pthread_mutex_unlock(&retired_lock);
    free(oldest);
}
