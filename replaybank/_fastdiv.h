/* Division by a divisor fixed for a loop, without the divider's latency (the C modules'
 * shared header).
 *
 * A batch of item keys maps each key to its storage slot by dividing by the lane count and
 * the ring's rows (slot = (key // lanes % T) * lanes + key % lanes): two 64-bit divisions
 * per key, 20-40 cycles each, for 256 keys a microsecond or two of a 30 us sample. Here the
 * quotient is estimated with one multiplication by the divisor's reciprocal in double
 * precision and corrected by one integer step, which is exact:
 *
 *   for 0 <= n < 2**51 and 1 <= d < 2**51 the computed product n * (1 / d) carries a
 *   relative error under 2**-51 (two roundings of 2**-53 each, and (double)n and
 *   (double)d exact), so it is within 1 of n / d, its truncation within 1 of floor(n / d),
 *   and the remainder n - q * d tells which of q - 1, q, q + 1 is the quotient (q * d
 *   stays below n + d: no overflow).
 *
 * Outside that range (negative n, or n or d at 2**51 and above: never in practice, as a key
 * counts the steps written) the machine division is used. */
#ifndef REPLAYBANK_FASTDIV_H
#define REPLAYBANK_FASTDIV_H

#include <stdint.h>

#define FASTDIV_LIMIT ((int64_t)1 << 51)

typedef struct {
    int64_t d;  /* the divisor, >= 1 */
    double inv; /* 1.0 / d */
} FastDiv;

/* The divisor d (>= 1) prepared for fastdiv_q. */
static inline FastDiv
fastdiv_of(int64_t d)
{
    FastDiv f = {d, 1.0 / (double)d};
    return f;
}

/* n / d as C's division gives it (floor for n >= 0). */
static inline int64_t
fastdiv_q(int64_t n, FastDiv f)
{
    if (n < 0 || n >= FASTDIV_LIMIT || f.d >= FASTDIV_LIMIT)
        return n / f.d;
    int64_t q = (int64_t)((double)n * f.inv);
    int64_t r = n - q * f.d;
    q -= r < 0;
    q += r >= f.d;
    return q;
}

#endif
