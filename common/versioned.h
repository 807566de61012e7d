/* Internal: reading the caller's versioned structs (zero_config,
 * zero_comm_config, zero_checkpoint_options, zero_init_spec,
 * zero_nvme_options).
 *
 * Each starts with `size_t size; uint32_t version;` and grows only by
 * appending fields, each batch of appended fields a new version. A caller
 * compiled against an older header passes its older version: the library
 * reads that version's fields and gives every later one its default (the
 * INIT macro's value). The VERSION, not the size, says which fields the
 * caller has: an older struct's trailing padding can cover the first bytes
 * of a field appended later, and those bytes were never the caller's. The
 * size must cover the version's fields (a size smaller than that, or a
 * version this library does not know - a caller built against a newer
 * libzero - is refused, naming both). */
#ifndef ZERO_COMMON_VERSIONED_H
#define ZERO_COMMON_VERSIONED_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

/* Offset just past `field`: where version n's fields end when `field` is the last it appended. */
#define ZERO_FIELD_END(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))

/* Beside each version table: `field` is the last one. Catches a field appended
 * without a new version whenever it grows the struct (not one that fits in
 * the old trailing padding: the version field is what protects callers). */
#define ZERO_ASSERT_LAST_FIELD(type, field)                                                                   \
    _Static_assert((ZERO_FIELD_END(type, field) + _Alignof(type) - 1) / _Alignof(type) * _Alignof(type) ==    \
                       sizeof(type),                                                                        \
                   "a field was appended to " #type " after " #field ": bump its version, add a table row")

typedef struct zero_struct_version {
    size_t end;        /* ZERO_FIELD_END of the last field of this version */
    const char *first; /* the first field this version appended (for messages) */
} zero_struct_version;

typedef struct zero_versioned_type {
    const char *name;                    /* "zero_config" */
    const char *init;                    /* "ZERO_CONFIG_INIT" */
    const zero_struct_version *versions; /* [0] is version 1 */
    uint32_t latest;                     /* this library's version: the table's length */
    size_t full_size;                    /* sizeof the latest struct */
} zero_versioned_type;

/* `out` holds the defaults (the INIT macro, copied in with memcpy so that its
 * padding is defined); overlay the fields of `in`'s version. out's size and
 * version become the latest. On refusal returns `status` with a message
 * starting with `what` (the caller's function) and leaves out untouched. */
zero_status zero_versioned_read(zero_errbuf *err, zero_status status, const char *what,
                                const zero_versioned_type *t, const void *in, void *out);

/* The caller's version of `in` (checked by zero_versioned_read first). */
uint32_t zero_versioned_version(const void *in);

/* Write the fields of `dst`'s version back from the latest struct `src` (for
 * in/out parameters such as zero_config_from_json); dst's size and version
 * stay. Refuses (changing nothing) when `src` differs from `defaults` in a
 * field dst's version does not have: the caller could not see that value. */
zero_status zero_versioned_write(zero_errbuf *err, zero_status status, const char *what,
                                 const zero_versioned_type *t, const void *src, const void *defaults, void *dst);

#endif
