/* Internal: "did you mean" for configuration keys. One copy serves the
 * engine's JSON loader and zero-train's config (compiled into both). */
#ifndef ZERO_COMMON_SUGGEST_H
#define ZERO_COMMON_SUGGEST_H

/* The entry of the NULL-terminated `known` closest to `key` by edit
 * distance (insertions, deletions, substitutions, transpositions of
 * neighbours; case-insensitive), or NULL when none is within
 * max(2, strlen(key) / 3) edits: a suggestion, not a guess. */
const char *zero_suggest_key(const char *key, const char *const *known);

#endif
