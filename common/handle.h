/* Internal: detecting calls through destroyed handles.
 *
 * A destroyed zero_comm or zero_engine is not freed at once: its struct is
 * retired here with its magic number changed to ZERO_HANDLE_DEAD, so a
 * second destroy, or a call through the stale pointer, reads memory that is
 * still ours and is refused by name instead of touching freed memory. The
 * last ZERO_HANDLE_RETIRED_MAX retired handles are kept (about 1 KiB each);
 * older ones are freed, so detection is best effort for handles destroyed
 * long ago. Retired memory stays reachable, so leak checkers stay quiet. */
#ifndef ZERO_COMMON_HANDLE_H
#define ZERO_COMMON_HANDLE_H

#include <stdint.h>

#define ZERO_HANDLE_COMM 0x7a636f6du   /* "zcom" */
#define ZERO_HANDLE_ENGINE 0x7a656e67u /* "zeng" */
#define ZERO_HANDLE_DEAD 0xdeadd00du
#define ZERO_HANDLE_RETIRED_MAX 1024

/* Take ownership of a malloc'd handle whose magic the caller has set to
 * ZERO_HANDLE_DEAD and whose other resources are released; frees the oldest
 * retired handle beyond the limit. */
void zero_handle_retire(void *handle);

#endif
