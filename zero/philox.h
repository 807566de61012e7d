/* Philox-4x32-10, the counter-based generator of Salmon, Moraes, Dror and
 * Shaw, "Parallel random numbers: as easy as 1, 2, 3" (SC 2011), written
 * from the paper's description: a 128-bit counter and a 64-bit key go
 * through 10 rounds; each round multiplies two of the four words by fixed
 * constants, swaps the 32-bit halves of the products into new positions and
 * xors in the other words and the round key; the key advances by two Weyl
 * constants (the golden ratio and sqrt(3) - 1, as 32-bit fractions) between
 * rounds. Output word j is a pure function of (counter, key): that is what
 * lets every rank compute element i of a parameter without the others.
 *
 * Known answers: tests/engine/test_engine_init.c checks the three
 * "philox4x32 10" vectors of Random123's tests/kat_vectors.
 *
 * Header-only (static inline) so the test can call it; not part of the ABI. */
#ifndef ZERO_PHILOX_H
#define ZERO_PHILOX_H

#include <stdint.h>

#define ZERO_PHILOX_M0 0xD2511F53u /* round multipliers */
#define ZERO_PHILOX_M1 0xCD9E8D57u
#define ZERO_PHILOX_W0 0x9E3779B9u /* key increments (Weyl sequence) */
#define ZERO_PHILOX_W1 0xBB67AE85u

static inline void zero_philox_round(uint32_t c[4], const uint32_t k[2])
{
    const uint64_t p0 = (uint64_t)ZERO_PHILOX_M0 * c[0];
    const uint64_t p1 = (uint64_t)ZERO_PHILOX_M1 * c[2];
    const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    const uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    const uint32_t n0 = hi1 ^ c[1] ^ k[0];
    const uint32_t n2 = hi0 ^ c[3] ^ k[1];
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
}

/* out = Philox4x32-10(counter, key). */
static inline void zero_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c[4] = {counter[0], counter[1], counter[2], counter[3]};
    uint32_t k[2] = {key[0], key[1]};
    for (int r = 0; r < 10; r++) {
        if (r > 0) { /* the first round uses the key as given */
            k[0] += ZERO_PHILOX_W0;
            k[1] += ZERO_PHILOX_W1;
        }
        zero_philox_round(c, k);
    }
    out[0] = c[0];
    out[1] = c[1];
    out[2] = c[2];
    out[3] = c[3];
}

#endif
