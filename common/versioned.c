/* Reading and writing back the caller's versioned structs: see versioned.h. */
#include "common/versioned.h"

#include <string.h>

/* Every versioned struct starts with these two fields. */
typedef struct versioned_header {
    size_t size;
    uint32_t version;
} versioned_header;

#define HEADER_END ZERO_FIELD_END(versioned_header, version)

uint32_t zero_versioned_version(const void *in)
{
    versioned_header h;
    memcpy(&h, in, HEADER_END);
    return h.version;
}

zero_status zero_versioned_read(zero_errbuf *err, zero_status status, const char *what,
                                const zero_versioned_type *t, const void *in, void *out)
{
    if (!in) return zero_fail(err, status, "%s: %s is NULL", what, t->name);
    versioned_header h;
    memcpy(&h, in, HEADER_END);
    if (h.version < 1 || h.version > t->latest)
        return zero_fail(err, status,
                         "%s: %s version %u is not one this libzero knows (1..%u)%s; initialise it with %s",
                         what, t->name, h.version, t->latest,
                         h.version > t->latest ? ": the caller was built against a newer libzero" : "",
                         t->init);
    const size_t end = t->versions[h.version - 1].end;
    if (h.size < end)
        return zero_fail(err, status,
                         "%s: %s size %zu is smaller than its version %u's fields (%zu bytes); initialise it "
                         "with %s",
                         what, t->name, h.size, h.version, end, t->init);
    memcpy((char *)out + HEADER_END, (const char *)in + HEADER_END, end - HEADER_END);
    versioned_header latest = {t->full_size, t->latest};
    memcpy(out, &latest, HEADER_END);
    return ZERO_OK;
}

zero_status zero_versioned_write(zero_errbuf *err, zero_status status, const char *what,
                                 const zero_versioned_type *t, const void *src, const void *defaults, void *dst)
{
    const uint32_t v = zero_versioned_version(dst);
    const size_t end = t->versions[v - 1].end;
    for (uint32_t later = v; later < t->latest; later++) {
        const size_t b = t->versions[later - 1].end, e = t->versions[later].end;
        if (memcmp((const char *)src + b, (const char *)defaults + b, e - b) != 0)
            return zero_fail(err, status,
                             "%s: the result sets fields of %s version %u (from '%s' on), which the caller's "
                             "version %u does not have; rebuild against a newer libzero header",
                             what, t->name, later + 1, t->versions[later].first, v);
    }
    memcpy((char *)dst + HEADER_END, (const char *)src + HEADER_END, end - HEADER_END);
    return ZERO_OK;
}
