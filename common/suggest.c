/* "did you mean": the closest known key by optimal-string-alignment edit
 * distance (Damerau-Levenshtein without repeated edits of one substring),
 * so "wall_clock_breakdwon" finds "wall_clock_breakdown". */
#include "common/suggest.h"

#include <ctype.h>
#include <string.h>

#define SUGGEST_MAX 64 /* longer keys are compared by their first 63 bytes */

static int osa_distance(const char *a, const char *b)
{
    int n = (int)strlen(a), m = (int)strlen(b);
    if (n > SUGGEST_MAX - 1) n = SUGGEST_MAX - 1;
    if (m > SUGGEST_MAX - 1) m = SUGGEST_MAX - 1;
    static _Thread_local int d[SUGGEST_MAX][SUGGEST_MAX];
    for (int i = 0; i <= n; i++) d[i][0] = i;
    for (int j = 0; j <= m; j++) d[0][j] = j;
    for (int i = 1; i <= n; i++) {
        for (int j = 1; j <= m; j++) {
            int cost = tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]);
            int v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < v) v = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    }
    return d[n][m];
}

const char *zero_suggest_key(const char *key, const char *const *known)
{
    if (!key || !known) return NULL;
    int limit = (int)strlen(key) / 3;
    if (limit < 2) limit = 2;
    const char *best = NULL;
    int best_d = limit + 1;
    for (; *known; known++) {
        int dist = osa_distance(key, *known);
        if (dist < best_d) {
            best_d = dist;
            best = *known;
        }
    }
    return best;
}
