/* The compiled sampling kernels: replaybank._sampling.
 *
 * The default sample paths (uniform draws and the prioritized sum tree) run here, so the
 * first sample() of a process waits for no JIT compiler: numba stays for the kernels it
 * serves best (windows, frame stacks, hindsight), loaded only where those are used.
 *
 * Each function is the C twin of a numpy oracle, with the same results bit for bit (the
 * same floating-point operations in the same order; the tests compare them):
 *
 *   map_raw        replaybank/ops/draws.py, map_raw (exact uniform ints from raw words)
 *   uniform        replaybank/ops/draws.py, uniform_ints: the same rounds of raw words,
 *                  read from the bit generator's C interface (its capsule) in one call
 *   lane_keys      replaybank/ops/ring.py, uniform_keys (flat positions -> item keys)
 *   uniform_lanes  uniform over every lane's live steps, then lane_keys: one call
 *   key_slots      replaybank/ops/ring.py, key_to_slot (item keys -> storage slots)
 *   find           replaybank/ops/sumtree.py, find (descent of the k-ary sum tree)
 *   update_pair    replaybank/ops/sumtree.py, update_pair (sum tree + its min tree)
 *   sample         replaybank/samplers/prioritized.py, PrioritizedSampler.sample's
 *                  stratified draw: targets, find, keys, probabilities, IS weights
 *   transform      (raw + eps) ** alpha and its maximum
 *   update_keys    stale-key filter, slots, transform and update_pair in one pass
 *   valid_update   update_priorities' argument checks (keys >= 0, priorities in
 *                  [0, limit]) in one pass
 *
 * replaybank/ops/sumtree_c.py wraps them with numpy-allocated outputs; callers never
 * reach this module directly. Arrays come through the buffer protocol (no numpy headers
 * are needed to build); every argument is checked against the others before any memory
 * is read, so a wrong call raises instead of reading or writing out of bounds.
 *
 * Speed: the descent is level-major (every draw's step at one level before the next
 * level), so the loads of different draws are independent and overlap. Each step is a
 * branch-free scan (no mispredicted exit waiting on a cache miss) that, once the draw's
 * child is known, prefetches that child's children for the next level, a whole level of
 * draws ahead; consecutive draws at one node (stratified draws near the root) share its
 * running sums. The default fanout (16) has its own instance with a constant K, so the
 * scans unroll. Tree updates refresh GROUP parent nodes at once, so their dependent
 * additions overlap, after prefetching the parents the first refresh writes; parents
 * come from a shift where K is a power of two. One lane's key and slot arithmetic needs
 * no division.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_fastdiv.h"

#define GROUP 4                 /* parent nodes refreshed together (at fanout 16 a group of
                                 * 4 keeps its sums and minima in registers) */
#define MAXDEPTH 64

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch((p), 0, 3)
#define PREFETCH_W(p) __builtin_prefetch((p), 1, 3)
#else
#define PREFETCH(p) ((void)0)
#define PREFETCH_W(p) ((void)0)
#endif

/* importance weights are clamped to the float32 range of normal numbers */
#define W_LO 1.1754943508222875e-38
#define W_HI 3.4028234663852886e+38

/* ------------------------------------------------------------------ arguments */

typedef struct {
    Py_buffer view;
    int held;
} Arr;

/* obj's buffer as a contiguous array of 8-byte items of kind 'f' (float64), 'i' (int64)
 * or 'u' (uint64); writable when asked. 0, or -1 with TypeError naming `what`. */
static int
get_arr(PyObject *obj, Arr *a, char kind, int writable, const char *what)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &a->view, flags) < 0)
        return -1;
    a->held = 1;
    const char *f = a->view.format ? a->view.format : "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    int ok = a->view.itemsize == 8 && f[0] != 0 && f[1] == 0;
    if (ok) {
        switch (kind) {
        case 'f': ok = f[0] == 'd'; break;
        case 'i': ok = f[0] == 'l' || f[0] == 'q'; break;
        default: ok = f[0] == 'L' || f[0] == 'Q'; break;
        }
    }
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "replaybank._sampling: %s must be a contiguous %s array",
                     what, kind == 'f' ? "float64" : kind == 'i' ? "int64" : "uint64");
        return -1;
    }
    return 0;
}

static void
release(Arr *a, int n)
{
    for (int i = 0; i < n; i++)
        if (a[i].held) {
            PyBuffer_Release(&a[i].view);
            a[i].held = 0;
        }
}

static inline Py_ssize_t
count(const Arr *a)
{
    return a->view.len / 8;
}

/* A k-ary tree's shape, checked against its arrays (see replaybank/ops/sumtree.py,
 * layout): level l holds K**l nodes at off[l], the leaves are level D. */
typedef struct {
    const int64_t *off;
    int depth;          /* D */
    int64_t K;
    int shift;          /* log2(K) where K is a power of two, else -1 */
    int64_t leaves;     /* K ** D */
} Shape;

/* The parent of node x (>= 0): x / K, a shift where K is a power of two (a 64-bit
 * division costs tens of cycles). */
static inline int64_t
parent_of(const Shape *s, int64_t x)
{
    return s->shift >= 0 ? x >> s->shift : x / s->K;
}

static int
tree_shape(Shape *s, const Arr *offsets, Py_ssize_t fanout, Py_ssize_t sum_len,
           Py_ssize_t min_len)
{
    Py_ssize_t n = count(offsets);
    s->off = (const int64_t *)offsets->view.buf;
    s->K = fanout;
    s->shift = -1;
    for (int b = 1; b < 7; b++)
        if (fanout == ((Py_ssize_t)1 << b))
            s->shift = b;
    s->depth = (int)(n - 2);
    if (fanout < 2 || fanout > 64 || n < 3 || n - 2 > MAXDEPTH) {
        PyErr_SetString(PyExc_ValueError, "replaybank._sampling: bad tree layout");
        return -1;
    }
    int64_t width = 1;
    for (int l = 0; l <= s->depth; l++) {
        if (s->off[l] < (l ? s->off[l - 1] : 0) || s->off[l + 1] - s->off[l] < width) {
            PyErr_SetString(PyExc_ValueError, "replaybank._sampling: bad tree layout");
            return -1;
        }
        if (l < s->depth) {
            if (width > INT64_MAX / fanout) {
                PyErr_SetString(PyExc_ValueError, "replaybank._sampling: bad tree layout");
                return -1;
            }
            width *= fanout;
        }
    }
    s->leaves = width;
    if (sum_len < s->off[s->depth + 1] || (min_len >= 0 && min_len < s->off[s->depth])) {
        PyErr_SetString(PyExc_ValueError,
                        "replaybank._sampling: tree arrays are shorter than their layout");
        return -1;
    }
    return 0;
}

/* The (sum tree, min tree, offsets) arguments args[0..2] of a tree kernel into a[0..2]
 * (the trees writable when asked) and their checked shape for `fanout`. 0 or -1. */
static int
tree_args(PyObject *const *args, Arr *a, int writable, Py_ssize_t fanout, Shape *s)
{
    if (get_arr(args[0], &a[0], 'f', writable, "sum_tree") < 0
        || get_arr(args[1], &a[1], 'f', writable, "min_tree") < 0
        || get_arr(args[2], &a[2], 'i', 0, "offsets") < 0)
        return -1;
    return tree_shape(s, &a[2], fanout, count(&a[0]), count(&a[1]));
}

/* ------------------------------------------------------------------ uniform draws */

/* map_raw(raw, high, out, start) -> int: replaybank.ops.draws.map_raw. */
static PyObject *
sampling_map_raw(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "map_raw(raw, high, out, start)");
        return NULL;
    }
    unsigned long long high = PyLong_AsUnsignedLongLong(args[1]);
    Py_ssize_t start = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred())
        return NULL;
    Arr a[2];
    memset(a, 0, sizeof a);
    if (get_arr(args[0], &a[0], 'u', 0, "raw") < 0 || get_arr(args[2], &a[1], 'i', 1, "out") < 0) {
        release(a, 2);
        return NULL;
    }
    const uint64_t *raw = (const uint64_t *)a[0].view.buf;
    int64_t *out = (int64_t *)a[1].view.buf;
    Py_ssize_t q = count(&a[0]), size = count(&a[1]), n = start;
    if (high < 1 || high > (1ULL << 63) || start < 0 || start > size) {
        release(a, 2);
        PyErr_SetString(PyExc_ValueError, "map_raw: need 1 <= high <= 2**63, 0 <= start <= len(out)");
        return NULL;
    }
    if (high <= (1ULL << 32)) {
        const uint64_t h = high, low32 = 0xFFFFFFFFULL, thresh = (1ULL << 32) % h;
        for (Py_ssize_t i = 0; i < q && n < size; i++) {
            uint64_t w = raw[i];
            for (int half = 0; half < 2 && n < size; half++) {
                uint64_t x = half ? w >> 32 : w & low32, p = x * h;
                if ((p & low32) >= thresh)
                    out[n++] = (int64_t)(p >> 32);
            }
        }
    } else {
        int bits = 64 - __builtin_clzll(high - 1);
        uint64_t mask = bits >= 64 ? ~0ULL : (1ULL << bits) - 1;
        for (Py_ssize_t i = 0; i < q && n < size; i++) {
            uint64_t v = raw[i] & mask;
            if (v < high)
                out[n++] = (int64_t)v;
        }
    }
    release(a, 2);
    return PyLong_FromSsize_t(n);
}

/* A numpy bit generator's C interface (numpy/random/bitgen.h, the struct its `capsule`
 * attribute holds under the name "BitGenerator"; documented for C extensions). */
typedef struct {
    void *state;
    uint64_t (*next_uint64)(void *st);
    uint32_t (*next_uint32)(void *st);
    double (*next_double)(void *st);
    uint64_t (*next_raw)(void *st);
} bitgen_t;

/* uniform(capsule, high, out[, offset]) -> words: replaybank.ops.draws.uniform_ints's
 * stream drawn straight from the bit generator (the raw words its random_raw returns, in
 * rounds of round_words words, each round read whole), plus offset, into out [size]
 * int64. The caller holds the bit generator's lock. Returns the raw words read. */
static PyObject *
sampling_uniform(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    (void)mod;
    if (nargs != 3 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "uniform(capsule, high, out[, offset])");
        return NULL;
    }
    long long offset = 0;
    if (nargs == 4) {
        offset = PyLong_AsLongLong(args[3]);
        if (offset == -1 && PyErr_Occurred())
            return NULL;
    }
    bitgen_t *bg = (bitgen_t *)PyCapsule_GetPointer(args[0], "BitGenerator");
    if (bg == NULL)
        return NULL;
    unsigned long long high = PyLong_AsUnsignedLongLong(args[1]);
    if (high == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (high < 1 || high > (1ULL << 63)
            || (offset > 0 && high - 1 > (unsigned long long)(INT64_MAX - offset))) {
        PyErr_SetString(PyExc_ValueError, "uniform: need 1 <= high <= 2**63 and offset + high "
                        "- 1 inside int64");
        return NULL;
    }
    Arr a[1];
    memset(a, 0, sizeof a);
    if (get_arr(args[2], &a[0], 'i', 1, "out") < 0) {
        release(a, 1);
        return NULL;
    }
    int64_t *out = (int64_t *)a[0].view.buf;
    Py_ssize_t size = count(&a[0]), n = 0;
    long long words = 0;
    if (high <= (1ULL << 32)) {
        const uint64_t h = high, low32 = 0xFFFFFFFFULL, thresh = (1ULL << 32) % h;
        while (n < size) {
            Py_ssize_t q = (size - n) / 2 + 2;  /* round_words */
            words += q;
            for (Py_ssize_t i = 0; i < q; i++) {
                uint64_t w = bg->next_raw(bg->state);
                for (int half = 0; half < 2 && n < size; half++) {
                    uint64_t x = half ? w >> 32 : w & low32, p = x * h;
                    if ((p & low32) >= thresh)
                        out[n++] = (int64_t)(p >> 32) + offset;
                }
            }
        }
    } else {
        int bits = 64 - __builtin_clzll(high - 1);
        uint64_t mask = bits >= 64 ? ~0ULL : (1ULL << bits) - 1;
        while (n < size) {
            Py_ssize_t q = 2 * (size - n) + 8;  /* round_words */
            words += q;
            for (Py_ssize_t i = 0; i < q; i++) {
                uint64_t v = bg->next_raw(bg->state) & mask;
                if (v < high && n < size)
                    out[n++] = (int64_t)(v + (uint64_t)offset);
            }
        }
    }
    release(a, 1);
    return PyLong_FromLongLong(words);
}

/* ------------------------------------------------------------------ keys and slots */

/* The lanes of a flat order: starts[l] (starts[lanes] = the total), and whether every
 * lane holds as many live steps. 0, or -1 where a lane's range is not sane (counts < 0,
 * written < counts) or its keys could overflow int64. */
static int
lane_starts(const int64_t *written, const int64_t *counts, Py_ssize_t lanes,
            int64_t *starts, int *equal)
{
    int64_t total = 0;
    *equal = 1;
    for (Py_ssize_t l = 0; l < lanes; l++) {
        int64_t w = written[l], c = counts[l];
        if (c < 0 || w < c || w > ((int64_t)1 << 62) / lanes)
            return -1;
        starts[l] = total;
        total += c;
        *equal &= c == counts[0];
    }
    starts[lanes] = total;
    return 0;
}

/* out[i] = the item key of flat position out[i] (in [0, starts[lanes]), checked by the
 * caller), lanes in order and each oldest to newest: ring.uniform_keys. */
static void
map_lanes(int64_t *out, Py_ssize_t b, const int64_t *written, const int64_t *counts,
          Py_ssize_t lanes, const int64_t *starts, int equal)
{
    const FastDiv by_c0 = fastdiv_of(counts[0] > 0 ? counts[0] : 1);
    for (Py_ssize_t i = 0; i < b; i++) {
        int64_t p = out[i], lane;
        if (equal) {  /* synchronous vector envs: every lane equally full */
            lane = fastdiv_q(p, by_c0);
        } else {  /* the last lane whose start is at or below p, as searchsorted - 1 */
            Py_ssize_t lo = 0, hi = lanes;  /* starts[lo] <= p < starts[hi] */
            while (hi - lo > 1) {
                Py_ssize_t mid = (lo + hi) / 2;
                if (starts[mid] <= p)
                    lo = mid;
                else
                    hi = mid;
            }
            lane = lo;
        }
        int64_t seq = written[lane] - counts[lane] + (p - starts[lane]);
        out[i] = seq * lanes + lane;
    }
}

#define MAXLANES 4096

/* lane_keys(flat, written, counts, out) -> bool: replaybank.ops.ring.uniform_keys, the
 * item key of each flat position in [0, sum(counts)) (lanes in order, each oldest to
 * newest), into out [B] int64. False (nothing written) where a value is out of range: the
 * caller then takes the numpy function, which gives its own answer or error. */
static PyObject *
sampling_lane_keys(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    (void)mod;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "lane_keys(flat, written, counts, out)");
        return NULL;
    }
    Arr a[4];
    memset(a, 0, sizeof a);
    PyObject *r = NULL;
    if (get_arr(args[0], &a[0], 'i', 0, "flat") < 0 || get_arr(args[1], &a[1], 'i', 0, "written") < 0
        || get_arr(args[2], &a[2], 'i', 0, "counts") < 0 || get_arr(args[3], &a[3], 'i', 1, "out") < 0)
        goto done;
    const int64_t *flat = a[0].view.buf, *written = a[1].view.buf, *counts = a[2].view.buf;
    int64_t *out = a[3].view.buf;
    Py_ssize_t b = count(&a[0]), lanes = count(&a[1]);
    if (count(&a[2]) != lanes || count(&a[3]) != b) {
        PyErr_SetString(PyExc_ValueError, "lane_keys: counts must match written, out flat");
        goto done;
    }
    int64_t starts[MAXLANES + 1];
    int equal;
    if (lanes < 1 || lanes > MAXLANES || lane_starts(written, counts, lanes, starts, &equal) < 0) {
        r = Py_NewRef(Py_False);
        goto done;
    }
    for (Py_ssize_t i = 0; i < b; i++) {
        if (flat[i] < 0 || flat[i] >= starts[lanes]) {
            r = Py_NewRef(Py_False);
            goto done;
        }
    }
    memmove(out, flat, (size_t)b * sizeof(int64_t));
    map_lanes(out, b, written, counts, lanes, starts, equal);
    r = Py_NewRef(Py_True);
done:
    release(a, 4);
    return r;
}

/* key_slots(keys, lanes, T, out) -> bool: replaybank.ops.ring.key_to_slot, the storage
 * slot (key // lanes % T) * lanes + key % lanes of each key, into out [B] int64. False
 * (nothing written) where a key is negative (numpy's floor division is then the rule). */
static PyObject *
sampling_key_slots(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    (void)mod;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "key_slots(keys, lanes, T, out)");
        return NULL;
    }
    long long lanes = PyLong_AsLongLong(args[1]), T = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred())
        return NULL;
    if (lanes < 1 || T < 1) {
        PyErr_SetString(PyExc_ValueError, "key_slots: need lanes >= 1 and T >= 1");
        return NULL;
    }
    Arr a[2];
    memset(a, 0, sizeof a);
    PyObject *r = NULL;
    if (get_arr(args[0], &a[0], 'i', 0, "keys") < 0 || get_arr(args[3], &a[1], 'i', 1, "out") < 0)
        goto done;
    const int64_t *keys = a[0].view.buf;
    int64_t *out = a[1].view.buf;
    Py_ssize_t b = count(&a[0]);
    if (count(&a[1]) != b) {
        PyErr_SetString(PyExc_ValueError, "key_slots: out must match keys");
        goto done;
    }
    for (Py_ssize_t i = 0; i < b; i++) {
        if (keys[i] < 0) {
            r = Py_NewRef(Py_False);
            goto done;
        }
    }
    const int64_t L = lanes, TT = T;
    const FastDiv by_l = fastdiv_of(L), by_t = fastdiv_of(TT);
    for (Py_ssize_t i = 0; i < b; i++) {
        int64_t seq = fastdiv_q(keys[i], by_l);
        out[i] = (seq - fastdiv_q(seq, by_t) * TT) * L + (keys[i] - seq * L);
    }
    r = Py_NewRef(Py_True);
done:
    release(a, 2);
    return r;
}

/* uniform_lanes(capsule, written, counts, out) -> words: uniform item keys over the live
 * steps of every lane: the draws of uniform(capsule, sum(counts), out) mapped by
 * lane_keys, in one call (the caller holds the bit generator's lock). -1 (nothing drawn)
 * where no step is live, or a lane's range is not sane. */
static PyObject *
sampling_uniform_lanes(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "uniform_lanes(capsule, written, counts, out)");
        return NULL;
    }
    Arr a[2];
    memset(a, 0, sizeof a);
    PyObject *r = NULL;
    if (get_arr(args[1], &a[0], 'i', 0, "written") < 0 || get_arr(args[2], &a[1], 'i', 0, "counts") < 0)
        goto done;
    const int64_t *written = a[0].view.buf, *counts = a[1].view.buf;
    Py_ssize_t lanes = count(&a[0]);
    int64_t starts[MAXLANES + 1];
    int equal;
    if (count(&a[1]) != lanes || lanes < 1 || lanes > MAXLANES
            || lane_starts(written, counts, lanes, starts, &equal) < 0 || starts[lanes] < 1) {
        r = PyLong_FromLong(-1);
        goto done;
    }
    PyObject *high = PyLong_FromLongLong(starts[lanes]);
    if (high == NULL)
        goto done;
    PyObject *call[3] = {args[0], high, args[3]};
    r = sampling_uniform(mod, call, 3);
    Py_DECREF(high);
    if (r == NULL)
        goto done;
    Arr o[1];
    memset(o, 0, sizeof o);
    if (get_arr(args[3], &o[0], 'i', 1, "out") < 0) {
        Py_CLEAR(r);
        goto done;
    }
    map_lanes((int64_t *)o[0].view.buf, count(&o[0]), written, counts, lanes, starts, equal);
    release(o, 1);
done:
    release(a, 2);
    return r;
}

/* ------------------------------------------------------------------ the sum tree */

/* Index of the lowest set bit of x != 0. */
static inline int
lowest_bit(uint64_t x)
{
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_ctzll(x);
#else
    int i = 0;
    while (!(x & 1)) {
        x >>= 1;
        i++;
    }
    return i;
#endif
}

/* Descend every draw b from node[b] of level `lvl` to its child, t[b] becoming the mass
 * left inside that child: the first child whose running sum exceeds t[b], clamped to the
 * last positive child (round-off, or a target at the total). Running sums add the
 * children in order from 0.0, as numpy's cumsum and the oracle's find.
 *
 * The scan is branch-free: every child's running sum is formed (the same additions in
 * the same order as a scan that stops at its child; the later sums are not used) with a
 * bit per child whose sum exceeds t[b], and the chosen child is the lowest set bit, so
 * no branch waits for the children's cache miss. Once a draw's child is known, the
 * lines of that child's own children (the next level) are prefetched, a whole level of
 * draws ahead of their use. `K` is a constant in the default fanout's instance (see
 * descend), so the scan unrolls. */
static inline void
descend_k(const double *tree, const Shape *s, const int64_t K, int lvl, int64_t *node,
          double *t, Py_ssize_t n)
{
    const int64_t off = s->off[lvl + 1];
    const int next = lvl + 1 < s->depth;
    const int64_t noff = next ? s->off[lvl + 2] : 0;
    double cum[64];
    int64_t held = -1; /* the node whose running sums cum holds */
    for (Py_ssize_t b = 0; b < n; b++) {
        const double *ch = tree + off + node[b] * K;
        const double tb = t[b];
        uint64_t above = (uint64_t)1 << (K - 1); /* no sum above t[b]: the last child */
        if (node[b] == held) { /* the previous draw's node (stratified draws near the
                                * root): the same sums, compared only */
            for (int64_t k = 0; k < K - 1; k++)
                above |= (uint64_t)(cum[k] > tb) << k;
        } else {
            double acc = 0.0;
            for (int64_t k = 0; k < K - 1; k++) {
                acc = acc + ch[k];
                cum[k] = acc;
                above |= (uint64_t)(acc > tb) << k;
            }
            held = node[b];
        }
        int64_t c = lowest_bit(above);
        double before = c ? cum[c - 1] : 0.0;
        if (c == K - 1 && !(ch[c] > 0.0 && before + ch[c] > tb)) {
            /* round-off, or a target at the total: the last positive child */
            int64_t last = 0;
            double run = 0.0, before_last = 0.0;
            for (int64_t k = 0; k < K; k++) {
                if (ch[k] > 0.0) {
                    last = k;
                    before_last = run;
                }
                run = run + ch[k];
            }
            c = last;
            before = before_last;
        }
        t[b] = tb - before;
        const int64_t child = node[b] * K + c;
        node[b] = child;
        if (next) {
            const double *g = tree + noff + child * K;
            for (int64_t k = 0; k < K; k += 8)
                PREFETCH(g + k);
        }
    }
}

static void
descend(const double *tree, const Shape *s, int lvl, int64_t *node, double *t, Py_ssize_t n)
{
    if (s->K == 16)
        descend_k(tree, s, 16, lvl, node, t, n);
    else
        descend_k(tree, s, s->K, lvl, node, t, n);
}

static void
find_leaves(const double *tree, const Shape *s, const double *targets, Py_ssize_t n,
            int64_t *out, double *t)
{
    for (Py_ssize_t b = 0; b < n; b++) {
        out[b] = 0;
        t[b] = targets[b];
    }
    for (int lvl = 0; lvl < s->depth; lvl++)
        descend(tree, s, lvl, out, t, n);
}

/* find(tree, offsets, fanout, targets, out) */
static PyObject *
sampling_find(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "find(tree, offsets, fanout, targets, out)");
        return NULL;
    }
    Py_ssize_t fanout = PyLong_AsSsize_t(args[2]);
    if (fanout == -1 && PyErr_Occurred())
        return NULL;
    Arr a[4];
    memset(a, 0, sizeof a);
    Shape s;
    PyObject *res = NULL;
    double *t = NULL;
    if (get_arr(args[0], &a[0], 'f', 0, "tree") < 0 || get_arr(args[1], &a[1], 'i', 0, "offsets") < 0
        || get_arr(args[3], &a[2], 'f', 0, "targets") < 0 || get_arr(args[4], &a[3], 'i', 1, "out") < 0
        || tree_shape(&s, &a[1], fanout, count(&a[0]), -1) < 0)
        goto done;
    Py_ssize_t n = count(&a[2]);
    if (count(&a[3]) != n) {
        PyErr_SetString(PyExc_ValueError, "find: out and targets differ in length");
        goto done;
    }
    t = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(double));
    if (t == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    find_leaves((const double *)a[0].view.buf, &s, (const double *)a[2].view.buf, n,
                (int64_t *)a[3].view.buf, t);
    res = Py_None;
    Py_INCREF(res);
done:
    PyMem_Free(t);
    release(a, 4);
    return res;
}

static int
cmp_int64(const void *x, const void *y)
{
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

/* Recompute nodes[0..k) (sum and min) of level lvl from their children, G nodes at once
 * so their dependent additions overlap (G a constant: the group's sums stay in
 * registers). The min tree holds internal levels only; the leaves of the min are the sum
 * tree's, 0 counting as +inf. Sums add the children in order (as the oracle's cumsum),
 * mins keep the first of equals. */
static inline void
refresh_group(double *st, double *mt, const int64_t K, int64_t coff, int64_t poff,
              int leaf_children, const int64_t *nodes, const int G)
{
    double sum[GROUP], mn[GROUP];
    for (int i = 0; i < G; i++) {
        const int64_t base = coff + nodes[i] * K;
        sum[i] = st[base];
        if (leaf_children)
            mn[i] = sum[i] > 0.0 ? sum[i] : INFINITY;
        else
            mn[i] = mt[base];
    }
    if (leaf_children)
        for (int64_t c = 1; c < K; c++)
            for (int i = 0; i < G; i++) {
                const double v = st[coff + nodes[i] * K + c], w = v > 0.0 ? v : INFINITY;
                sum[i] = sum[i] + v;
                mn[i] = w < mn[i] ? w : mn[i];
            }
    else
        for (int64_t c = 1; c < K; c++)
            for (int i = 0; i < G; i++) {
                const int64_t at = coff + nodes[i] * K + c;
                const double w = mt[at];
                sum[i] = sum[i] + st[at];
                mn[i] = w < mn[i] ? w : mn[i];
            }
    for (int i = 0; i < G; i++) {
        st[poff + nodes[i]] = sum[i];
        mt[poff + nodes[i]] = mn[i];
    }
}

static inline void
refresh_k(double *st, double *mt, const Shape *s, const int64_t K, int lvl,
          const int64_t *nodes, Py_ssize_t k)
{
    const int64_t coff = s->off[lvl + 1], poff = s->off[lvl];
    const int leaf_children = lvl == s->depth - 1;
    Py_ssize_t n0 = 0;
    for (; n0 + GROUP <= k; n0 += GROUP)
        refresh_group(st, mt, K, coff, poff, leaf_children, nodes + n0, GROUP);
    for (; n0 < k; n0++)
        refresh_group(st, mt, K, coff, poff, leaf_children, nodes + n0, 1);
}

static void
refresh(double *st, double *mt, const Shape *s, int lvl, const int64_t *nodes, Py_ssize_t k)
{
    if (s->K == 16)
        refresh_k(st, mt, s, 16, lvl, nodes, k);
    else
        refresh_k(st, mt, s, s->K, lvl, nodes, k);
}

/* Set leaves idx[i] = values[i] (later duplicates win) and refresh each ancestor once.
 * idx must be inside the leaves (checked by the callers). 0, or -1 on no memory. */
static int
update_tree(double *st, double *mt, const Shape *s, const int64_t *idx, const double *values,
            Py_ssize_t n)
{
    const int64_t leaf0 = s->off[s->depth], poff = s->off[s->depth - 1];
    for (Py_ssize_t i = 0; i < n; i++) {
        st[leaf0 + idx[i]] = values[i];
        /* the parents' sum and min are rewritten next: the min tree's line is
         * often not cached (a draw reads only the sum tree) */
        const int64_t p = poff + parent_of(s, idx[i]);
        PREFETCH_W(mt + p);
        PREFETCH_W(st + p);
    }
    if (n == 0)
        return 0;
    int64_t *nodes = PyMem_Malloc((size_t)n * sizeof(int64_t));
    if (nodes == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(nodes, idx, (size_t)n * sizeof(int64_t));
    for (Py_ssize_t i = 1; i < n; i++)
        if (nodes[i] < nodes[i - 1]) {
            qsort(nodes, (size_t)n, sizeof(int64_t), cmp_int64);
            break;
        }
    Py_ssize_t k = n;
    for (int lvl = s->depth - 1; lvl >= 0; lvl--) {
        Py_ssize_t m = 0; /* distinct parents, in order */
        for (Py_ssize_t i = 0; i < k; i++) {
            const int64_t p = parent_of(s, nodes[i]);
            if (m == 0 || nodes[m - 1] != p)
                nodes[m++] = p;
        }
        k = m;
        refresh(st, mt, s, lvl, nodes, k);
    }
    PyMem_Free(nodes);
    return 0;
}

/* update_pair(sum_tree, min_tree, offsets, fanout, idx, values) */
static PyObject *
sampling_update_pair(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "update_pair(sum_tree, min_tree, offsets, fanout, idx, values)");
        return NULL;
    }
    Py_ssize_t fanout = PyLong_AsSsize_t(args[3]);
    if (fanout == -1 && PyErr_Occurred())
        return NULL;
    Arr a[5];
    memset(a, 0, sizeof a);
    Shape s;
    PyObject *res = NULL;
    if (tree_args(args, a, 1, fanout, &s) < 0 || get_arr(args[4], &a[3], 'i', 0, "idx") < 0
        || get_arr(args[5], &a[4], 'f', 0, "values") < 0)
        goto done;
    Py_ssize_t n = count(&a[3]);
    const int64_t *idx = (const int64_t *)a[3].view.buf;
    if (count(&a[4]) != n) {
        PyErr_SetString(PyExc_ValueError, "update_pair: idx and values differ in length");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (idx[i] < 0 || idx[i] >= s.leaves) {
            PyErr_Format(PyExc_IndexError, "update_pair: leaf %lld outside [0, %lld)",
                         (long long)idx[i], (long long)s.leaves);
            goto done;
        }
    if (update_tree((double *)a[0].view.buf, (double *)a[1].view.buf, &s, idx,
                    (const double *)a[4].view.buf, n) < 0)
        goto done;
    res = Py_None;
    Py_INCREF(res);
done:
    release(a, 5);
    return res;
}

/* Python's floor modulo of an int64 by a positive m. */
static inline int64_t
floor_mod(int64_t a, int64_t m)
{
    int64_t r = a % m;
    return r < 0 ? r + m : r;
}

/* sample(tree, min_tree, offsets, fanout, u, written, counts, rows, beta, norm, n_items,
 *        keys, probs, weights): the stratified draw of replaybank.ops.sumtree_numba's
 * sample_stratified: targets (b + u[b]) * total / B, their leaves, the item keys of those
 * slots, P(i) and IS weights (norm 0: by the buffer's min, 1: the batch's, 2: none). */
static PyObject *
sampling_sample(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 14) {
        PyErr_SetString(PyExc_TypeError,
                        "sample(tree, min_tree, offsets, fanout, u, written, counts, rows, beta, "
                        "norm, n_items, keys, probs, weights)");
        return NULL;
    }
    Py_ssize_t fanout = PyLong_AsSsize_t(args[3]), rows = PyLong_AsSsize_t(args[7]);
    double beta = PyFloat_AsDouble(args[8]);
    long norm = PyLong_AsLong(args[9]);
    double n_items = (double)PyLong_AsLongLong(args[10]);
    if (PyErr_Occurred())
        return NULL;
    Arr a[9];
    memset(a, 0, sizeof a);
    Shape s;
    PyObject *res = NULL;
    int64_t *slots = NULL;
    double *t = NULL;
    if (tree_args(args, a, 0, fanout, &s) < 0 || get_arr(args[4], &a[3], 'f', 0, "u") < 0
        || get_arr(args[5], &a[4], 'i', 0, "written") < 0 || get_arr(args[6], &a[5], 'i', 0, "counts") < 0
        || get_arr(args[11], &a[6], 'i', 1, "keys") < 0 || get_arr(args[12], &a[7], 'f', 1, "probs") < 0
        || get_arr(args[13], &a[8], 'f', 1, "weights") < 0)
        goto done;
    const Py_ssize_t n = count(&a[3]), lanes = count(&a[4]);
    if (count(&a[6]) != n || count(&a[7]) != n || count(&a[8]) != n || count(&a[5]) != lanes
        || lanes < 1 || rows < 1 || (int64_t)rows * lanes > s.leaves || norm < 0 || norm > 2) {
        PyErr_SetString(PyExc_ValueError, "sample: arguments disagree in length or range");
        goto done;
    }
    const double *tree = (const double *)a[0].view.buf, *u = (const double *)a[3].view.buf;
    const int64_t *written = (const int64_t *)a[4].view.buf, *counts = (const int64_t *)a[5].view.buf;
    int64_t *keys = (int64_t *)a[6].view.buf;
    double *probs = (double *)a[7].view.buf, *weights = (double *)a[8].view.buf;
    slots = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    t = PyMem_Malloc((size_t)(n ? 2 * n : 1) * sizeof(double));
    if (slots == NULL || t == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const double total = tree[s.off[0]], step = total / (double)n;
    double *targets = t + n;
    for (Py_ssize_t b = 0; b < n; b++)
        targets[b] = ((double)b + u[b]) * step;
    find_leaves(tree, &s, targets, n, slots, t);
    const int64_t leaf0 = s.off[s.depth];
    const double p_min = ((const double *)a[1].view.buf)[s.off[0]];
    const int64_t oldest0 = written[0] - counts[0], old_mod = floor_mod(oldest0, rows);
    double p_bmin = INFINITY;
    for (Py_ssize_t b = 0; b < n; b++) {
        const int64_t sl = slots[b];
        const double p = tree[leaf0 + sl];
        probs[b] = p / total;
        weights[b] = p;
        p_bmin = p < p_bmin ? p : p_bmin;
        if (sl >= (int64_t)rows * lanes) { /* a padding leaf: only a corrupt tree gives one */
            PyErr_SetString(PyExc_RuntimeError, "sample: the sum tree is damaged (a draw "
                            "landed past the last slot); rebuild it from a checkpoint");
            goto done;
        }
        if (lanes == 1) { /* row = slot: floor_mod(row - oldest, rows) without a division */
            const int64_t d = sl - old_mod;
            keys[b] = oldest0 + (d < 0 ? d + rows : d);
        } else {
            const int64_t row = sl / lanes, lane = sl - row * lanes;
            const int64_t oldest = written[lane] - counts[lane];
            keys[b] = (oldest + floor_mod(row - oldest, rows)) * lanes + lane;
        }
    }
    for (Py_ssize_t b = 0; b < n; b++) {
        const double p = weights[b];
        double w;
        if (norm == 0)
            w = pow(p / p_min, -beta);
        else if (norm == 1)
            w = pow(p / p_bmin, -beta);
        else
            w = pow(n_items * (p / total), -beta);
        w = W_LO > w ? W_LO : w;
        weights[b] = w > W_HI ? W_HI : w;
    }
    res = Py_None;
    Py_INCREF(res);
done:
    PyMem_Free(slots);
    PyMem_Free(t);
    release(a, 9);
    return res;
}

/* transform(raw, eps, alpha, out) -> max: out = (raw + eps) ** alpha, max 0.0 if empty. */
static PyObject *
sampling_transform(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "transform(raw, eps, alpha, out)");
        return NULL;
    }
    double eps = PyFloat_AsDouble(args[1]), alpha = PyFloat_AsDouble(args[2]);
    if (PyErr_Occurred())
        return NULL;
    Arr a[2];
    memset(a, 0, sizeof a);
    if (get_arr(args[0], &a[0], 'f', 0, "raw") < 0 || get_arr(args[3], &a[1], 'f', 1, "out") < 0) {
        release(a, 2);
        return NULL;
    }
    const Py_ssize_t n = count(&a[0]);
    if (count(&a[1]) != n) {
        release(a, 2);
        PyErr_SetString(PyExc_ValueError, "transform: raw and out differ in length");
        return NULL;
    }
    const double *raw = (const double *)a[0].view.buf;
    double *out = (double *)a[1].view.buf, m = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const double v = pow(raw[i] + eps, alpha);
        out[i] = v;
        m = v > m ? v : m;
    }
    release(a, 2);
    return PyFloat_FromDouble(m);
}

/* update_keys(sum_tree, min_tree, offsets, fanout, keys, raw, written, counts, rows, eps,
 *             alpha) -> (applied, top): the live keys' slots get (raw + eps) ** alpha;
 * stale keys (overwritten or cleared since they were sampled) and negative ones are
 * skipped. */
static PyObject *
sampling_update_keys(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError,
                        "update_keys(sum_tree, min_tree, offsets, fanout, keys, raw, written, "
                        "counts, rows, eps, alpha)");
        return NULL;
    }
    Py_ssize_t fanout = PyLong_AsSsize_t(args[3]), rows = PyLong_AsSsize_t(args[8]);
    double eps = PyFloat_AsDouble(args[9]), alpha = PyFloat_AsDouble(args[10]);
    if (PyErr_Occurred())
        return NULL;
    Arr a[7];
    memset(a, 0, sizeof a);
    Shape s;
    PyObject *res = NULL;
    int64_t *slots = NULL;
    double *vals = NULL;
    if (tree_args(args, a, 1, fanout, &s) < 0 || get_arr(args[4], &a[3], 'i', 0, "keys") < 0
        || get_arr(args[5], &a[4], 'f', 0, "raw") < 0 || get_arr(args[6], &a[5], 'i', 0, "written") < 0
        || get_arr(args[7], &a[6], 'i', 0, "counts") < 0)
        goto done;
    const Py_ssize_t n = count(&a[3]), lanes = count(&a[5]);
    if (count(&a[4]) != n || count(&a[6]) != lanes || lanes < 1 || rows < 1
        || (int64_t)rows * lanes > s.leaves) {
        PyErr_SetString(PyExc_ValueError, "update_keys: arguments disagree in length or range");
        goto done;
    }
    const int64_t *keys = (const int64_t *)a[3].view.buf, *written = (const int64_t *)a[5].view.buf,
                  *counts = (const int64_t *)a[6].view.buf;
    const double *raw = (const double *)a[4].view.buf;
    slots = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    vals = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(double));
    if (slots == NULL || vals == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t m = 0;
    double top = 0.0;
    const int64_t oldest0 = written[0] - counts[0];
    const int fast = lanes == 1 && oldest0 >= 0;
    const int64_t old_mod = fast ? oldest0 % rows : 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t k = keys[i];
        if (k < 0)
            continue;
        const int64_t seq = k / lanes, lane = k - seq * lanes;
        if (seq >= written[lane] || seq < written[lane] - counts[lane])
            continue; /* overwritten (stale) or cleared */
        const double v = pow(raw[i] + eps, alpha);
        const int64_t d = seq - oldest0;
        if (fast && d < rows) { /* seq % rows from the oldest live row: no division */
            const int64_t r = old_mod + d;
            slots[m] = r >= rows ? r - rows : r;
        } else {
            slots[m] = (seq % rows) * lanes + lane;
        }
        vals[m] = v;
        top = v > top ? v : top;
        m++;
    }
    if (update_tree((double *)a[0].view.buf, (double *)a[1].view.buf, &s, slots, vals, m) < 0)
        goto done;
    res = Py_BuildValue("(nd)", m, top);
done:
    PyMem_Free(slots);
    PyMem_Free(vals);
    release(a, 7);
    return res;
}

/* valid_update(keys, priorities, limit) -> bool: every key >= 0 and every priority a
 * number in [0, limit] (NaN and +inf refused): update_priorities' checks in one pass. */
static PyObject *
sampling_valid_update(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "valid_update(keys, priorities, limit)");
        return NULL;
    }
    double limit = PyFloat_AsDouble(args[2]);
    if (limit == -1.0 && PyErr_Occurred())
        return NULL;
    Arr a[2];
    memset(a, 0, sizeof a);
    if (get_arr(args[0], &a[0], 'i', 0, "keys") < 0
        || get_arr(args[1], &a[1], 'f', 0, "priorities") < 0) {
        release(a, 2);
        return NULL;
    }
    const int64_t *keys = (const int64_t *)a[0].view.buf;
    const double *p = (const double *)a[1].view.buf;
    const Py_ssize_t nk = count(&a[0]), np_ = count(&a[1]);
    int ok = 1;
    for (Py_ssize_t i = 0; ok && i < nk; i++)
        ok = keys[i] >= 0;
    for (Py_ssize_t i = 0; ok && i < np_; i++)
        ok = p[i] >= 0.0 && p[i] <= limit && p[i] != INFINITY; /* NaN fails the first */
    release(a, 2);
    return PyBool_FromLong(ok);
}

static PyMethodDef sampling_functions[] = {
    {"map_raw", (PyCFunction)(void (*)(void))sampling_map_raw, METH_FASTCALL,
     "map_raw(raw, high, out, start) -> int: replaybank.ops.draws.map_raw in C."},
    {"uniform_lanes", (PyCFunction)(void (*)(void))sampling_uniform_lanes, METH_FASTCALL,
     "uniform_lanes(capsule, written, counts, out) -> words: uniform item keys of every "
     "lane's live steps (uniform, then lane_keys) in one call; -1 where none is live."},
    {"lane_keys", (PyCFunction)(void (*)(void))sampling_lane_keys, METH_FASTCALL,
     "lane_keys(flat, written, counts, out) -> bool: replaybank.ops.ring.uniform_keys in C."},
    {"key_slots", (PyCFunction)(void (*)(void))sampling_key_slots, METH_FASTCALL,
     "key_slots(keys, lanes, T, out) -> bool: replaybank.ops.ring.key_to_slot in C."},
    {"uniform", (PyCFunction)(void (*)(void))sampling_uniform, METH_FASTCALL,
     "uniform(capsule, high, out) -> words: uniform_ints's stream from the bit generator."},
    {"find", (PyCFunction)(void (*)(void))sampling_find, METH_FASTCALL,
     "find(tree, offsets, fanout, targets, out): the leaf of each target prefix mass."},
    {"update_pair", (PyCFunction)(void (*)(void))sampling_update_pair, METH_FASTCALL,
     "update_pair(sum_tree, min_tree, offsets, fanout, idx, values): set leaves, refresh "
     "their ancestors."},
    {"sample", (PyCFunction)(void (*)(void))sampling_sample, METH_FASTCALL,
     "sample(...): the fused stratified prioritized draw (keys, probabilities, weights)."},
    {"transform", (PyCFunction)(void (*)(void))sampling_transform, METH_FASTCALL,
     "transform(raw, eps, alpha, out) -> max: (raw + eps) ** alpha."},
    {"update_keys", (PyCFunction)(void (*)(void))sampling_update_keys, METH_FASTCALL,
     "update_keys(...) -> (applied, top): the fused priority update by item key."},
    {"valid_update", (PyCFunction)(void (*)(void))sampling_valid_update, METH_FASTCALL,
     "valid_update(keys, priorities, limit) -> bool: keys >= 0, priorities in [0, limit]."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef samplingmodule = {
    PyModuleDef_HEAD_INIT, "_sampling",
    "Compiled sampling kernels of replaybank (uniform draws, the prioritized sum tree).", -1,
    sampling_functions,
};

PyMODINIT_FUNC
PyInit__sampling(void)
{
    return PyModule_Create(&samplingmodule);
}
