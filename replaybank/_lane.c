/* The compiled writer of host step tables: replaybank._lane.Appender.
 *
 * One writer for every add and extend of a numpy, memmap or shared-memory step table
 * (replaybank/storage/writers/compiled.py builds it; replaybank/buffers/writer.py routes
 * the calls). A call goes through three stages, the same as the Python writer's:
 *
 * 1. the boundary: every value is taken once and brought to its field's stored dtype
 *    under the spec's casting rules (replaybank/spec.py, FieldSpec.cast): numpy arrays of any
 *    numeric dtype, byte order and strides (read-only too), numpy scalars, Python bools,
 *    ints and floats, nested lists and tuples of them, and, through the `host` callback,
 *    other array objects (torch CPU tensors). A value that breaks a casting rule (a
 *    fraction, NaN or out-of-range number for an int field, a 2 for a flag, a complex
 *    number, a string, a wrong shape) or that this file does not know is not taken: the
 *    call returns 0 before a byte is written and the Python boundary names the error;
 * 2. the plan: plan_write decides from the lane counters alone where the n steps of the
 *    m lanes go (the C twin of replaybank/storage/writers/plan.py, differential-tested
 *    against it through the module function plan_write);
 * 3. the applier: apply_plan carries the plan out in the four steps of the write plan
 *    (evict, continue, link, commit), in the order of the Python applier
 *    (replaybank/storage/writers/reference.py), so both leave identical tables: data,
 *    links, side slots in the same free-list order, counters (tests/test_fastpath.py).
 *
 * Layout: every field is a flat [T * L, *shape] C-contiguous array (row-major [T, L]);
 * the step of lane l in row r is item r * L + l. Storage and inputs are reached through
 * the buffer protocol (no numpy headers are needed to build).
 *
 * Durable tables (memmap files, shared-memory writers) keep a reader's view consistent at
 * every instant: each ordered store is preceded by DURABLE_STORE, which is a release fence
 * in production; a build with REPLAYBANK_KILLPOINTS defined (replaybank._lane_killpoints,
 * the crash tests' build) also counts the stores and kills the process before the n-th.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <signal.h>

#define NSTD 5      /* obs, action, reward, terminated, truncated: f[0..NSTD) */
#define MAXEXTRA 32 /* extra fields (f[NSTD..NSTD + nx)); tables with more: the Python writer */
#define MAXOBS 16   /* fields of a dict observation; more: the Python writer */
#define MAXFIELDS (NSTD + MAXEXTRA + MAXOBS - 1)
#define MAXDIM 8
#define STACK_ITEMS 512 /* steps x lanes handled without a heap allocation */

#ifdef REPLAYBANK_KILLPOINTS
#define MODULE_NAME "_lane_killpoints"
#define MODULE_INIT PyInit__lane_killpoints
#else
#define MODULE_NAME "_lane"
#define MODULE_INIT PyInit__lane
#endif

/* What a buffer format says of its items: kind 'b' (bool), 'i', 'u', 'f' (a number this
 * file converts), 'x' (a number it copies only: complex, half, long double) or 0 (not a
 * number it knows); size in bytes; swap: not in this machine's byte order. */
typedef struct {
    char kind;
    char code; /* the format letter ('F', 'D' for complex) */
    int size;
    int swap;
} NumFmt;

typedef struct {
    Py_buffer store;           /* flat [T * L, *shape] storage, C-contiguous */
    char fmt[16];              /* the storage's buffer format (e.g. "f", "?", "l") */
    NumFmt num;                /* what the format says; num.kind 'x' or swapped: exact
                                  inputs only (no conversion into this field) */
    Py_ssize_t itemsize;
    int ndim;                  /* item ndim */
    Py_ssize_t shape[MAXDIM];  /* item shape */
    Py_ssize_t nbytes;         /* bytes of one step of one lane */
    char dk;                   /* conversion target: 'b', 'i', 'u', 'f', or 0: exact only */
    char is_obs;               /* an obs field: its values (obs and next obs) may stay lazy */
    int64_t lo, hi;            /* int fields: the range ('u': lo 0, uhi the top) */
    uint64_t uhi;
    double dlo, dhi1;          /* int fields: lo and hi + 1 as doubles (exact powers of 2) */
    PyObject *name;            /* extra fields: the key in the extras dict (interned str) */
} Field;

/* The state of a buffer's call guard (replaybank/buffers/guard.py subclasses this type),
 * read here so that the compiled writes check it without a Python call. While only the
 * owner thread calls the buffer, a compiled write raises `busy` around itself (a second
 * thread switching the guard to shared mode waits for it to drop); in shared mode only the
 * thread holding the guard's lock (`holder`) may write. Any other caller is refused
 * (0), and the buffer's guarded Python path takes the call. */
typedef struct {
    PyObject_HEAD
    unsigned long owner;  /* thread id that may call without the lock */
    unsigned long holder; /* thread id holding the lock in shared mode (0: none) */
    char shared;          /* a second thread was seen: every call takes the lock */
    char busy;            /* the owner is inside an unlocked call */
} GuardState;

static PyMemberDef GuardState_members[] = {
    {"owner", T_ULONG, offsetof(GuardState, owner), 0, "Thread id of the lock-free caller."},
    {"holder", T_ULONG, offsetof(GuardState, holder), 0, "Thread id holding the lock."},
    {"shared", T_BOOL, offsetof(GuardState, shared), 0, "Every call takes the lock."},
    {"busy", T_BOOL, offsetof(GuardState, busy), 0, "The owner is inside an unlocked call."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject GuardStateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "replaybank." MODULE_NAME ".GuardState",
    .tp_doc = "Flags of a buffer's call guard, shared with the compiled writer.",
    .tp_basicsize = sizeof(GuardState),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_members = GuardState_members,
};

/* -1: another thread's call (refused), 0: may write, 1: may write, lower busy after. No
 * GIL release happens between the checks and raising busy, so they are one step. */
static inline int
guard_enter(GuardState *g)
{
    if (g == NULL)
        return 0;
    unsigned long me = PyThread_get_thread_ident();
    if (g->shared)
        return g->holder == me ? 0 : -1;
    if (g->owner != me)
        return -1;
    if (g->busy) /* inside the owner's own guarded call */
        return 0;
    g->busy = 1;
    return 1;
}

typedef struct {
    PyObject_HEAD
    Field f[MAXFIELDS];        /* the NSTD standard fields (f[0]: the first obs field), the
                                  nx extra fields, then obs fields 1..nob-1 */
    int nf;                    /* fields initialised (for dealloc; all of them after init) */
    int nx;                    /* extra fields: f[NSTD .. NSTD + nx) */
    int nob;                   /* obs fields (1: a flat obs; more, or okey set: a dict obs;
                                  0: a rows table, whose next observations are not kept) */
    int rows;                  /* a rows table: only write_fields writes it */
    int oi[MAXOBS];            /* obs field p is f[oi[p]] */
    PyObject *okey[MAXOBS];    /* dict obs: the key of obs field p in obs / next_obs (NULL:
                                  a flat obs, the value itself) */
    PyObject *oside[MAXOBS];   /* the side store array of obs field p (interned str) */
    PyObject *xkey[MAXEXTRA];  /* the extras' keys (borrowed: f[NSTD + i].name) */
    Py_buffer link, written, counts, episodes;
    int nmeta;
    PyObject *table;           /* the SideStore: .arrays[name], .free, .alloc(k) */
    PyObject *ndarray_type;
    PyObject *generic_type;    /* numpy.generic: numpy scalars export a buffer */
    PyObject *host;            /* host(value) -> ndarray or None, for other objects */
    Py_ssize_t T, L;
    int durable;               /* files / shared memory: the crash-safe write order */
    Py_buffer start;           /* durable: int64 [L] seq of each lane's oldest live step */
    int has_start;
    Py_ssize_t chunk;          /* durable: the most steps of a lane one chunk evicts */
    Py_ssize_t side_slots;     /* slots in the side arrays of the last side_view */
    GuardState *guard;         /* the owning buffer's call guard, or NULL */
    int ready;                 /* __init__ succeeded (the methods refuse other objects) */
} Appender;

/* ------------------------------------------------------------------ kill points
 * Test hook of the killpoints build (REPLAYBANK_KILL_AT=<n>, read once at import, or
 * arm(n)): the process kills itself with SIGKILL just before the n-th durable store (the
 * counter is shared with the Python writer through store_point()). The production build
 * has no counter: a durable store costs a release fence (no instruction on x86-64). */
#ifdef REPLAYBANK_KILLPOINTS
static long long kill_at = 0, stores_done = 0;

static void
store_point(void)
{
    if (kill_at && ++stores_done == kill_at) {
        fflush(NULL);
        raise(SIGKILL);
    }
}
#define STORE_POINT() store_point()
#else
#define STORE_POINT() ((void)0)
#endif

/* A release fence before each ordered store: the stores before it reach other processes
 * (a learner mapping shared memory) before the ones after it; a compiler barrier and no
 * instruction on x86-64, a barrier instruction on weakly ordered CPUs. */
#if defined(__GNUC__) || defined(__clang__)
#define RELEASE_FENCE() __atomic_thread_fence(__ATOMIC_RELEASE)
#else
#define RELEASE_FENCE() ((void)0)
#endif

#define DURABLE_STORE(self)          \
    do {                             \
        if ((self)->durable) {       \
            STORE_POINT();           \
            RELEASE_FENCE();         \
        }                            \
    } while (0)

static PyObject *s_free, *s_side, *s_obs, *s_alloc;

/* Paths off the common call (conversions, errors): kept out of the hot code's cache lines. */
#if defined(__GNUC__) || defined(__clang__)
#define COLD __attribute__((cold, noinline))
/* a loop over many items that a COLD caller must not inline (cold code is built small) */
#define NOINLINE __attribute__((noinline))
#else
#define COLD
#define NOINLINE
#endif

static inline int64_t *
meta(Py_buffer *b)
{
    return (int64_t *)b->buf;
}

/* ------------------------------------------------------------------ formats */
static int
host_little(void)
{
    const uint16_t one = 1;
    return *(const unsigned char *)&one;
}

/* The items of a buffer format (struct module syntax, as numpy exports it). */
static NumFmt
parse_format(const char *fmt, Py_ssize_t itemsize)
{
    NumFmt r = {0, 0, (int)itemsize, 0};
    if (fmt == NULL)
        fmt = "B";
    int little = host_little();
    switch (*fmt) {
    case '<':
        r.swap = !little;
        fmt++;
        break;
    case '>':
    case '!':
        r.swap = little;
        fmt++;
        break;
    case '@':
    case '=':
        fmt++;
        break;
    default:
        break;
    }
    if (fmt[0] == 'Z' && fmt[1] != '\0' && fmt[2] == '\0') {
        r.kind = 'x'; /* complex: copied when the field is complex too */
        r.code = fmt[1] == 'f' ? 'F' : fmt[1] == 'd' ? 'D' : 'G';
        return r;
    }
    if (fmt[0] == '\0' || fmt[1] != '\0')
        return r;
    r.code = fmt[0];
    switch (fmt[0]) {
    case '?':
        r.kind = itemsize == 1 ? 'b' : 0;
        break;
    case 'b': case 'h': case 'i': case 'l': case 'q':
        r.kind = 'i';
        break;
    case 'B': case 'H': case 'I': case 'L': case 'Q':
        r.kind = 'u';
        break;
    case 'f': case 'd':
        r.kind = 'f';
        break;
    case 'e': case 'g':
        r.kind = 'x'; /* half and long double: copied only */
        break;
    default:
        return r;
    }
    if ((r.kind == 'i' || r.kind == 'u')
        && itemsize != 1 && itemsize != 2 && itemsize != 4 && itemsize != 8)
        r.kind = 0;
    if (r.kind == 'f' && itemsize != 4 && itemsize != 8)
        r.kind = 0;
    return r;
}

/* ------------------------------------------------------------------ casting rules
 * One element into a field of kind dk (replaybank/spec.py, FieldSpec.cast, element by
 * element): floats go to float fields as C casts them (numpy's astype); into int fields
 * only when finite, integral and in range; into bool fields only 0 and 1 (ints and
 * floats alike); bools are 0/1 everywhere (any nonzero byte is True). 1: stored, 0: the
 * rules refuse the value. */
static inline void
store_int(char *dst, int size, uint64_t v)
{
    switch (size) {
    case 1: { uint8_t y = (uint8_t)v; memcpy(dst, &y, 1); break; }
    case 2: { uint16_t y = (uint16_t)v; memcpy(dst, &y, 2); break; }
    case 4: { uint32_t y = (uint32_t)v; memcpy(dst, &y, 4); break; }
    default: memcpy(dst, &v, 8); break;
    }
}

/* x into a float field of 4 or 8 bytes, cast from its own type (an int64 straight to
 * float32: one rounding, as numpy's astype). */
#define STORE_FLOAT(f, x, dst)                   \
    do {                                         \
        if ((f)->itemsize == 4) {                \
            float y_ = (float)(x);               \
            memcpy((dst), &y_, 4);               \
        } else {                                 \
            double y_ = (double)(x);             \
            memcpy((dst), &y_, 8);               \
        }                                        \
    } while (0)

static inline int
put_double(const Field *f, double x, char *dst)
{
    switch (f->dk) {
    case 'f':
        STORE_FLOAT(f, x, dst);
        return 1;
    case 'b':
        if (x == 0.0 || x == 1.0) {
            *dst = (char)(x != 0.0);
            return 1;
        }
        return 0;
    case 'i':
        if (!(x >= f->dlo && x < f->dhi1) || floor(x) != x) /* NaN fails the first test */
            return 0;
        store_int(dst, (int)f->itemsize, (uint64_t)(int64_t)x);
        return 1;
    case 'u':
        if (!(x >= 0.0 && x < f->dhi1) || floor(x) != x)
            return 0;
        store_int(dst, (int)f->itemsize, (uint64_t)x);
        return 1;
    default:
        return 0;
    }
}

static inline int
put_uint(const Field *f, uint64_t x, char *dst)
{
    switch (f->dk) {
    case 'f':
        STORE_FLOAT(f, x, dst);
        return 1;
    case 'b':
        if (x > 1)
            return 0;
        *dst = (char)x;
        return 1;
    case 'i':
        if (x > (uint64_t)f->hi)
            return 0;
        store_int(dst, (int)f->itemsize, x);
        return 1;
    case 'u':
        if (x > f->uhi)
            return 0;
        store_int(dst, (int)f->itemsize, x);
        return 1;
    default:
        return 0;
    }
}

/* A signed value: as put_uint when not negative (the same value), else only into float
 * fields and signed int fields whose range holds it. */
static inline int
put_int(const Field *f, int64_t x, char *dst)
{
    if (x >= 0)
        return put_uint(f, (uint64_t)x, dst);
    if (f->dk == 'f') { /* straight from the int: one rounding, as numpy's astype */
        STORE_FLOAT(f, x, dst);
        return 1;
    }
    if (f->dk != 'i' || x < f->lo)
        return 0;
    store_int(dst, (int)f->itemsize, (uint64_t)x);
    return 1;
}

static inline int
put_bool(const Field *f, int b, char *dst)
{
    if (f->dk == 'f')
        return put_int(f, b, dst);
    if (f->dk == 0)
        return 0;
    store_int(dst, (int)f->itemsize, (uint64_t)(b != 0));
    return 1;
}

static inline uint64_t
load_bits(const char *p, int size, int swap)
{
    switch (size) {
    case 1:
        return *(const uint8_t *)p;
    case 2: {
        uint16_t v;
        memcpy(&v, p, 2);
        return swap ? (uint16_t)((v >> 8) | (v << 8)) : v;
    }
    case 4: {
        uint32_t v;
        memcpy(&v, p, 4);
        return swap ? __builtin_bswap32(v) : v;
    }
    default: {
        uint64_t v;
        memcpy(&v, p, 8);
        return swap ? __builtin_bswap64(v) : v;
    }
    }
}

/* One element of format s at p into the field f at dst. */
static inline int
put_elem(const Field *f, NumFmt s, const char *p, char *dst)
{
    uint64_t bits = load_bits(p, s.size, s.swap);
    switch (s.kind) {
    case 'b':
        return put_bool(f, bits != 0, dst);
    case 'i': {
        int sh = 64 - 8 * s.size; /* sign-extend */
        int64_t v = sh ? (int64_t)(bits << sh) >> sh : (int64_t)bits;
        return put_int(f, v, dst);
    }
    case 'u':
        return put_uint(f, bits, dst);
    case 'f':
        if (s.size == 4) {
            uint32_t b32 = (uint32_t)bits;
            float x;
            memcpy(&x, &b32, 4);
            return put_double(f, (double)x, dst);
        } else {
            double x;
            memcpy(&x, &bits, 8);
            return put_double(f, x, dst);
        }
    default:
        return 0;
    }
}

/* ------------------------------------------------------------------ conversion kernels
 * A kernel converts a 2-d block of a source into the field f's contiguous dst: `outer`
 * runs, `os` bytes apart, of `count` elements each, `is` bytes apart, written run after
 * run. pick_kernel chooses one per value, so that a run costs its loop and not the
 * decision. The pairs that need no check (the same bits, float to float, int to float,
 * int widenings) and int to bool (one check OR-accumulated over the block) are plain C
 * casts that the compiler vectorises; each run is inlined three times, with the inner
 * stride a constant where it is one of the common two (contiguous, every other element:
 * a strided view of a wider array). Every other pair goes element by element through
 * put_elem and its casting rules. 1: done, 0: a value the casting rules refuse (dst is
 * then partly written: the caller drops it). */
typedef int (*Kernel)(const Field *f, const NumFmt *s, const char *src, Py_ssize_t is,
                      Py_ssize_t count, Py_ssize_t outer, Py_ssize_t os, char *dst);

#if defined(__GNUC__) || defined(__clang__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

/* Each conversion kernel is built for the baseline x86-64 (SSE2: two doubles per
 * instruction) and, with GCC, a second time for AVX2, which a call of WIDE_MIN items or
 * more takes where the CPU has it (have_avx2, read at import): a float64 chunk's cast is
 * most of a converting extend, while for the few items of an add the baseline loop costs
 * less (multiversioning every call through an ifunc, or AVX-512, made adds 5 % slower).
 * The same C casts in both: IEEE conversions round to nearest in each, so the stored bits
 * do not depend on the CPU. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define HAVE_WIDE 1
#define WIDE_ATTR __attribute__((target("avx2")))
#define WIDE_MIN 512
static int have_avx2;
#define WIDE_CALL(NAME)                                                             \
    if (have_avx2 && count * outer >= WIDE_MIN)                                     \
        return NAME##_wide(f, s, src, is, count, outer, os, dst);
#else
#define HAVE_WIDE 0
#define WIDE_CALL(NAME)
#endif

/* The runs of a kernel: RUN(p, d, count, step) converts one run, called with the inner
 * stride as a constant where it is ES (contiguous) or 2 * ES; DS bytes an output element;
 * ACC collects what each run returns. */
#define KERNEL_RUNS(ES, DS, RUN, ACC)                                               \
    for (Py_ssize_t o = 0; o < outer; o++) {                                        \
        const char *p_ = src + o * os;                                              \
        char *d_ = dst + o * count * (Py_ssize_t)(DS);                              \
        if (is == (Py_ssize_t)(ES))                                                 \
            ACC RUN(p_, d_, count, (Py_ssize_t)(ES));                               \
        else if (is == 2 * (Py_ssize_t)(ES))                                        \
            ACC RUN(p_, d_, count, 2 * (Py_ssize_t)(ES));                           \
        else                                                                        \
            ACC RUN(p_, d_, count, is);                                             \
    }

/* A kernel NAME whose body is BODY (over f, s, src, is, count, outer, os, dst): the
 * baseline function, and with HAVE_WIDE the same body built for AVX2 (NAME##_wide), which
 * NAME calls for WIDE_MIN items or more where the CPU has AVX2. */
#define KERNEL_ARGS                                                                 \
    const Field *f, const NumFmt *s, const char *src, Py_ssize_t is,                \
        Py_ssize_t count, Py_ssize_t outer, Py_ssize_t os, char *dst
#if HAVE_WIDE
#define KERNEL_BODY(NAME, ...)                                              \
    WIDE_ATTR static int NAME##_wide(KERNEL_ARGS)                                   \
    {                                                                               \
        (void)f;                                                                    \
        (void)s;                                                                    \
        __VA_ARGS__                                                                 \
    }                                                                               \
    static int NAME(KERNEL_ARGS)                                                    \
    {                                                                               \
        WIDE_CALL(NAME)                                                             \
        (void)f;                                                                    \
        (void)s;                                                                    \
        __VA_ARGS__                                                                 \
    }
#else
#define KERNEL_BODY(NAME, ...)                                              \
    static int NAME(KERNEL_ARGS)                                                    \
    {                                                                               \
        (void)f;                                                                    \
        (void)s;                                                                    \
        __VA_ARGS__                                                                 \
    }
#endif

/* S to D as C casts them: the same bits when S is D, and for the pairs picked here the
 * value put_int / put_uint / put_double would store (numpy's astype: one rounding from
 * the source type). */
#define CAST_KERNEL(NAME, S, D)                                                     \
    static ALWAYS_INLINE void NAME##_run(const char *p, char *d, Py_ssize_t count,  \
                                         Py_ssize_t step)                           \
    {                                                                               \
        for (Py_ssize_t k = 0; k < count; k++) {                                    \
            S x_;                                                                   \
            memcpy(&x_, p + k * step, sizeof(S));                                   \
            D y_ = (D)x_;                                                           \
            memcpy(d + k * (Py_ssize_t)sizeof(D), &y_, sizeof(D));                  \
        }                                                                           \
    }                                                                               \
    KERNEL_BODY(NAME, KERNEL_RUNS(sizeof(S), sizeof(D), NAME##_run, (void)) return 1;)

/* An int of type U (unsigned: a negative int has its top bit set) into a bool field:
 * 0 and 1 only (put_int / put_uint), checked once for the block: bad collects every bit
 * above the lowest. */
#define FLAG_KERNEL(NAME, U)                                                        \
    static ALWAYS_INLINE U NAME##_run(const char *p, char *d, Py_ssize_t count,     \
                                      Py_ssize_t step)                              \
    {                                                                               \
        U bad = 0;                                                                  \
        for (Py_ssize_t k = 0; k < count; k++) {                                    \
            U x_;                                                                   \
            memcpy(&x_, p + k * step, sizeof(U));                                   \
            bad |= (U)(x_ >> 1);                                                    \
            d[k] = (char)(x_ & 1);                                                  \
        }                                                                           \
        return bad;                                                                 \
    }                                                                               \
    KERNEL_BODY(NAME, U bad = 0; KERNEL_RUNS(sizeof(U), 1, NAME##_run, bad |=)     \
                return bad == 0;)

/* the same bits (also complex, half and long double of the same format: copy_n) */
CAST_KERNEL(copy_1, uint8_t, uint8_t)
CAST_KERNEL(copy_2, uint16_t, uint16_t)
CAST_KERNEL(copy_4, uint32_t, uint32_t)
CAST_KERNEL(copy_8, uint64_t, uint64_t)
/* float to float */
CAST_KERNEL(f8_f4, double, float)
CAST_KERNEL(f4_f8, float, double)
/* int to float: every int is stored (rounded once where float32 or float64 must) */
CAST_KERNEL(i1_f4, int8_t, float)
CAST_KERNEL(i2_f4, int16_t, float)
CAST_KERNEL(i4_f4, int32_t, float)
CAST_KERNEL(i8_f4, int64_t, float)
CAST_KERNEL(u1_f4, uint8_t, float)
CAST_KERNEL(u2_f4, uint16_t, float)
CAST_KERNEL(u4_f4, uint32_t, float)
CAST_KERNEL(u8_f4, uint64_t, float)
CAST_KERNEL(i1_f8, int8_t, double)
CAST_KERNEL(i2_f8, int16_t, double)
CAST_KERNEL(i4_f8, int32_t, double)
CAST_KERNEL(i8_f8, int64_t, double)
CAST_KERNEL(u1_f8, uint8_t, double)
CAST_KERNEL(u2_f8, uint16_t, double)
CAST_KERNEL(u4_f8, uint32_t, double)
CAST_KERNEL(u8_f8, uint64_t, double)
/* int widenings (every value fits): signed to wider signed, unsigned to wider of either */
CAST_KERNEL(i1_i2, int8_t, int16_t)
CAST_KERNEL(i1_i4, int8_t, int32_t)
CAST_KERNEL(i1_i8, int8_t, int64_t)
CAST_KERNEL(i2_i4, int16_t, int32_t)
CAST_KERNEL(i2_i8, int16_t, int64_t)
CAST_KERNEL(i4_i8, int32_t, int64_t)
CAST_KERNEL(u1_u2, uint8_t, uint16_t)
CAST_KERNEL(u1_u4, uint8_t, uint32_t)
CAST_KERNEL(u1_u8, uint8_t, uint64_t)
CAST_KERNEL(u2_u4, uint16_t, uint32_t)
CAST_KERNEL(u2_u8, uint16_t, uint64_t)
CAST_KERNEL(u4_u8, uint32_t, uint64_t)
/* ints to bool flags (the sign does not matter: a negative int is refused either way) */
FLAG_KERNEL(x1_b, uint8_t)
FLAG_KERNEL(x2_b, uint16_t)
FLAG_KERNEL(x4_b, uint32_t)
FLAG_KERNEL(x8_b, uint64_t)

/* bools (any nonzero byte is True) into a bool field */
static ALWAYS_INLINE void
bool_b_run(const char *p, char *d, Py_ssize_t count, Py_ssize_t step)
{
    for (Py_ssize_t k = 0; k < count; k++)
        d[k] = (char)(p[k * step] != 0);
}

static int
bool_b(const Field *f, const NumFmt *s, const char *src, Py_ssize_t is, Py_ssize_t count,
       Py_ssize_t outer, Py_ssize_t os, char *dst)
{
    (void)f;
    (void)s;
    KERNEL_RUNS(1, 1, bool_b_run, (void))
    return 1;
}

/* The same bits, items of another size (complex, long double) or of another byte order
 * than this machine's where the field has it too. */
static int
copy_n(const Field *f, const NumFmt *s, const char *src, Py_ssize_t is, Py_ssize_t count,
       Py_ssize_t outer, Py_ssize_t os, char *dst)
{
    (void)s;
    const Py_ssize_t ds = f->itemsize;
    for (Py_ssize_t o = 0; o < outer; o++, dst += count * ds)
        for (Py_ssize_t k = 0; k < count; k++)
            memcpy(dst + k * ds, src + o * os + k * is, (size_t)ds);
    return 1;
}

/* The same kind and size in the other byte order: the bytes reversed. */
static int
swap_n(const Field *f, const NumFmt *s, const char *src, Py_ssize_t is, Py_ssize_t count,
       Py_ssize_t outer, Py_ssize_t os, char *dst)
{
    const Py_ssize_t ds = f->itemsize;
    for (Py_ssize_t o = 0; o < outer; o++, dst += count * ds)
        for (Py_ssize_t k = 0; k < count; k++)
            store_int(dst + k * ds, (int)ds, load_bits(src + o * os + k * is, s->size, 1));
    return 1;
}

/* Every other pair: element by element under the casting rules (put_elem). */
static int
generic(const Field *f, const NumFmt *s, const char *src, Py_ssize_t is, Py_ssize_t count,
        Py_ssize_t outer, Py_ssize_t os, char *dst)
{
    const NumFmt sv = *s;
    const Py_ssize_t ds = f->itemsize;
    for (Py_ssize_t o = 0; o < outer; o++, dst += count * ds)
        for (Py_ssize_t k = 0; k < count; k++)
            if (!put_elem(f, sv, src + o * os + k * is, dst + k * ds))
                return 0;
    return 1;
}

static Kernel
copy_kernel(Py_ssize_t size)
{
    switch (size) {
    case 1: return copy_1;
    case 2: return copy_2;
    case 4: return copy_4;
    case 8: return copy_8;
    default: return copy_n;
    }
}

/* log2 of an int size (1, 2, 4, 8 bytes: 0..3) */
static inline int
size_log(int size)
{
    return size == 1 ? 0 : size == 2 ? 1 : size == 4 ? 2 : 3;
}

/* The kernel that brings items of format s into the field f, or NULL when no value of
 * that format is taken (a complex or half into another format, another byte order into
 * a field of another kind, anything into a field of an unknown format). */
static Kernel
pick_kernel(const Field *f, const NumFmt *s)
{
    static const Kernel int_f4[2][4] = {{i1_f4, i2_f4, i4_f4, i8_f4},
                                        {u1_f4, u2_f4, u4_f4, u8_f4}};
    static const Kernel int_f8[2][4] = {{i1_f8, i2_f8, i4_f8, i8_f8},
                                        {u1_f8, u2_f8, u4_f8, u8_f8}};
    /* widen[unsigned source][source size][field size], NULL where not a widening of the
     * field's kind (the field's signedness is checked below) */
    static const Kernel widen_i[4][4] = {{NULL, i1_i2, i1_i4, i1_i8},
                                         {NULL, NULL, i2_i4, i2_i8},
                                         {NULL, NULL, NULL, i4_i8},
                                         {NULL, NULL, NULL, NULL}};
    static const Kernel widen_u[4][4] = {{NULL, u1_u2, u1_u4, u1_u8},
                                         {NULL, NULL, u2_u4, u2_u8},
                                         {NULL, NULL, NULL, u4_u8},
                                         {NULL, NULL, NULL, NULL}};
    static const Kernel flag[4] = {x1_b, x2_b, x4_b, x8_b};
    const Py_ssize_t ds = f->itemsize;
    if (s->kind == 'x' || f->num.kind == 'x') { /* complex, half: the same format, copied */
        if (s->kind != f->num.kind || s->code != f->num.code || s->size != ds || s->swap
            || f->num.swap)
            return NULL;
        return copy_kernel(ds);
    }
    if (f->num.swap) /* a stored byte order of another machine: the same format only */
        return s->kind == f->num.kind && s->size == ds && s->swap ? copy_kernel(ds) : NULL;
    if (s->kind == f->num.kind && s->size == ds && s->kind != 'b')
        /* same kind and size: the bits as they are (NaN payloads, signed zeros) */
        return s->swap ? swap_n : copy_kernel(ds);
    if (f->dk == 0)
        return NULL;
    if (!s->swap) {
        const int sl = size_log(s->size), dl = size_log((int)ds);
        const int ints = s->kind == 'i' || s->kind == 'u';
        if (f->dk == 'f' && s->kind == 'f')
            return ds == 4 ? f8_f4 : f4_f8; /* the other size: same size was copied */
        if (f->dk == 'f' && ints)
            return (ds == 4 ? int_f4 : int_f8)[s->kind == 'u'][sl];
        if (f->dk == 'b' && s->kind == 'b' && s->size == 1)
            return bool_b;
        if (f->dk == 'b' && ints)
            return flag[sl];
        if (f->dk == 'i' && s->kind == 'i' && widen_i[sl][dl] != NULL)
            return widen_i[sl][dl];
        if (f->dk == 'i' && s->kind == 'u' && dl > sl) /* unsigned into a wider signed */
            return widen_u[sl][dl];
        if (f->dk == 'u' && s->kind == 'u' && widen_u[sl][dl] != NULL)
            return widen_u[sl][dl];
    }
    return generic;
}

/* An N-d strided source (shape, strides in bytes) into the field's contiguous dst: the
 * dims merged where the layout allows, the two innermost given to one kernel call, an
 * odometer over the rest. 1 done, 0 refused. */
static int
convert_strided(const Field *f, const NumFmt *s, Kernel kern, const char *src, int nd,
                const Py_ssize_t *shape, const Py_ssize_t *strides, char *dst)
{
    Py_ssize_t sh[2 * MAXDIM], st[2 * MAXDIM];
    int d = 0;
    for (int i = 0; i < nd; i++) {
        if (shape[i] == 0)
            return 1; /* nothing to convert */
        if (shape[i] == 1)
            continue; /* no effect on addresses */
        if (d > 0 && st[d - 1] == shape[i] * strides[i]) { /* merges with the outer dim */
            sh[d - 1] *= shape[i];
            st[d - 1] = strides[i];
        } else {
            sh[d] = shape[i];
            st[d] = strides[i];
            d++;
        }
    }
    if (d == 0)
        return kern(f, s, src, s->size, 1, 1, 0, dst);
    if (d == 1)
        return kern(f, s, src, st[0], sh[0], 1, 0, dst);
    /* the two innermost dims: one kernel call of sh[d-2] runs of sh[d-1] */
    const Py_ssize_t block = sh[d - 2] * sh[d - 1] * f->itemsize;
    Py_ssize_t idx[2 * MAXDIM] = {0};
    const char *p = src;
    for (;;) {
        if (!kern(f, s, p, st[d - 1], sh[d - 1], sh[d - 2], st[d - 2], dst))
            return 0;
        dst += block;
        int k = d - 3;
        for (; k >= 0; k--) { /* the odometer of the outer dims */
            if (++idx[k] < sh[k]) {
                p += st[k];
                break;
            }
            p -= st[k] * (sh[k] - 1);
            idx[k] = 0;
        }
        if (k < 0)
            return 1;
    }
}

/* ------------------------------------------------------------------ the boundary
 * A value taken for one field: exact bytes [lead..., *shape], C-contiguous, in the stored
 * format: the input's own buffer (held in view) or a converted copy. */
typedef struct {
    const char *buf;
    char *owned;      /* heap copy to free, or NULL */
    Py_buffer view;   /* the input's buffer, held when has_view */
    int has_view;
    Kernel lazy;      /* not NULL: buf is the held view's own items (of format lazy_fmt;
                         cell c, a step of a lane, at buf + c * lazy_cs, its items
                         contiguous), converted by this kernel where written (only into
                         float fields, where no value is refused) */
    NumFmt lazy_fmt;
    Py_ssize_t lazy_cs;
    char small[64];   /* small converted values */
} Src;

/* Items at least this many in a value before its conversion is left lazy (an extend's
 * chunk of observations: what the copy into scratch and back would cost shows there). */
#define LAZY_MIN 1024

static void
src_release(Src *s)
{
    if (s->has_view)
        PyBuffer_Release(&s->view);
    if (s->owned != NULL)
        PyMem_Free(s->owned);
    s->has_view = 0;
    s->owned = NULL;
}

static char *
src_scratch(Src *s, Py_ssize_t bytes)
{
    if (bytes <= (Py_ssize_t)sizeof(s->small))
        return s->small;
    s->owned = PyMem_Malloc((size_t)(bytes > 0 ? bytes : 1));
    if (s->owned == NULL)
        PyErr_NoMemory();
    return s->owned;
}

/* A Python number (bool, int, float) as numpy would see it alone: 1 converted, 0 not
 * taken (a type or an int beyond 64 bits that this file leaves to Python), -1 error. */
static int
put_number(const Field *f, PyObject *v, char *dst)
{
    if (PyBool_Check(v))
        return put_bool(f, v == Py_True, dst);
    if (PyFloat_Check(v))
        return put_double(f, PyFloat_AS_DOUBLE(v), dst);
    if (PyLong_Check(v)) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (x == -1 && PyErr_Occurred())
            return -1;
        if (overflow > 0) { /* numpy: uint64 when it fits */
            unsigned long long u = PyLong_AsUnsignedLongLong(v);
            if (u == (unsigned long long)-1 && PyErr_Occurred()) {
                PyErr_Clear();
                return 0;
            }
            return put_uint(f, u, dst);
        }
        if (overflow)
            return 0;
        return put_int(f, x, dst);
    }
    return 0;
}

/* Nested lists / tuples of Python numbers whose shape is full[depth..nd): which numbers
 * they hold (1 bool, 2 int, 4 float; numpy's dtype of the whole: float64 if any float,
 * else int64 if any int, else bool). 1: such a nest; 0: not (another type, a ragged or
 * wrong shape, an int beyond int64). */
COLD static int
nest_kinds(PyObject *v, int depth, int nd, const Py_ssize_t *full, int *kinds)
{
    if (depth == nd) {
        if (PyBool_Check(v)) {
            *kinds |= 1;
        } else if (PyFloat_Check(v)) {
            *kinds |= 4;
        } else if (PyLong_Check(v)) {
            int overflow = 0;
            long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
            if (overflow || (x == -1 && PyErr_Occurred())) {
                PyErr_Clear();
                return 0;
            }
            *kinds |= 2;
        } else {
            return 0;
        }
        return 1;
    }
    if (!PyList_CheckExact(v) && !PyTuple_CheckExact(v))
        return 0;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(v);
    if (len != full[depth])
        return 0;
    PyObject **items = PySequence_Fast_ITEMS(v);
    for (Py_ssize_t k = 0; k < len; k++)
        if (!nest_kinds(items[k], depth + 1, nd, full, kinds))
            return 0;
    return 1;
}

/* One number of a checked nest as numpy's array of the whole holds it (kinds). 1 ok, 0
 * refused by the casting rules, -1 error. */
static inline int
nest_leaf(const Field *f, PyObject *v, int kinds, char *dst)
{
    if (kinds & 4) {
        double x = PyFloat_CheckExact(v) ? PyFloat_AS_DOUBLE(v) : PyFloat_AsDouble(v);
        if (x == -1.0 && PyErr_Occurred())
            return -1;
        return put_double(f, x, dst);
    }
    if (kinds & 2) {
        long long x = PyLong_AsLongLong(v);
        if (x == -1 && PyErr_Occurred())
            return -1;
        return put_int(f, x, dst);
    }
    return put_bool(f, v == Py_True, dst);
}

/* Write the numbers of a checked nest in row-major order (see nest_leaf). */
COLD static int
nest_put(const Field *f, PyObject *v, int depth, int nd, int kinds, char **dst)
{
    if (depth == nd) {
        int r = nest_leaf(f, v, kinds, *dst);
        *dst += f->itemsize;
        return r;
    }
    Py_ssize_t len = PySequence_Fast_GET_SIZE(v);
    PyObject **items = PySequence_Fast_ITEMS(v);
    if (depth == nd - 1) { /* the innermost lists: their numbers in one loop */
        const Py_ssize_t step = f->itemsize;
        char *at = *dst;
        for (Py_ssize_t k = 0; k < len; k++, at += step) {
            int r = nest_leaf(f, items[k], kinds, at);
            if (r <= 0)
                return r;
        }
        *dst = at;
        return 1;
    }
    for (Py_ssize_t k = 0; k < len; k++) {
        int r = nest_put(f, items[k], depth + 1, nd, kinds, dst);
        if (r <= 0)
            return r;
    }
    return 1;
}

/* The innermost lists of a nest of one kind of number (see nest_fast): rows[0..n), each
 * a list or tuple of len items, stored one after another from *at (advanced); ITEM_OK(x)
 * is the exact type test of an item x and PUT(x, dst) stores it (0: refused). The kind is
 * chosen once for all the rows, so a row costs a type and length test and its items. */
#define NEST_ROWS(ITEM_OK, PUT)                                                   \
    for (Py_ssize_t r = 0; r < n; r++) {                                          \
        PyObject *row = rows[r];                                                  \
        if ((!PyList_CheckExact(row) && !PyTuple_CheckExact(row))                 \
                || PySequence_Fast_GET_SIZE(row) != len)                          \
            return 0;                                                             \
        PyObject **items = PySequence_Fast_ITEMS(row);                            \
        for (Py_ssize_t k = 0; k < len; k++, at += step) {                        \
            PyObject *x = items[k];                                               \
            if (!(ITEM_OK) || !(PUT))                                             \
                return 0;                                                         \
        }                                                                         \
    }

/* float32 store of a float (put_double's, which never refuses into a float field) */
static inline int
put_f32(double x, char *dst)
{
    float y = (float)x;
    memcpy(dst, &y, 4);
    return 1;
}

/* An exact int's store (an exact int cannot fail but by overflow: refused then). */
static inline int
put_exact_int(const Field *f, PyObject *x, char *dst)
{
    int overflow = 0;
    long long y = PyLong_AsLongLongAndOverflow(x, &overflow);
    return !overflow && put_int(f, y, dst);
}

/* n innermost lists of len items of one kind (4 float, 1 bool, 2 int) into *dst
 * (advanced); 1 done, 0 not such lists or a value refused (dst partly written). */
static int
nest_rows(const Field *f, PyObject **rows, Py_ssize_t n, Py_ssize_t len, int kind,
          char **dst)
{
    const Py_ssize_t step = f->itemsize;
    char *at = *dst;
    if (kind == 4 && f->dk == 'f' && step == 4) { /* floats into float32: the common one */
        NEST_ROWS(PyFloat_CheckExact(x), put_f32(PyFloat_AS_DOUBLE(x), at))
    } else if (kind == 4) {
        NEST_ROWS(PyFloat_CheckExact(x), put_double(f, PyFloat_AS_DOUBLE(x), at))
    } else if (kind == 1 && f->dk == 'b' && step == 1) { /* bools into bool flags */
        NEST_ROWS(x == Py_True || x == Py_False, (*at = (char)(x == Py_True), 1))
    } else if (kind == 1) {
        NEST_ROWS(x == Py_True || x == Py_False, put_bool(f, x == Py_True, at))
    } else {
        NEST_ROWS(PyLong_CheckExact(x), put_exact_int(f, x, at))
    }
    *dst = at;
    return 1;
}

/* One level of nest_fast: v must be a list or tuple of full[depth] items. */
NOINLINE static int
nest_fast_at(const Field *f, PyObject *v, int depth, int nd, const Py_ssize_t *full,
             int kind, char **dst)
{
    if (depth == nd - 1) /* v is itself an innermost list */
        return nest_rows(f, &v, 1, full[depth], kind, dst);
    if (!PyList_CheckExact(v) && !PyTuple_CheckExact(v))
        return 0;
    const Py_ssize_t len = PySequence_Fast_GET_SIZE(v);
    if (len != full[depth])
        return 0;
    PyObject **items = PySequence_Fast_ITEMS(v);
    if (depth == nd - 2) /* its items are the innermost lists */
        return nest_rows(f, items, len, full[nd - 1], kind, dst);
    for (Py_ssize_t k = 0; k < len; k++)
        if (!nest_fast_at(f, items[k], depth + 1, nd, full, kind, dst))
            return 0;
    return 1;
}

/* A nest of lists / tuples of shape full[0..nd) whose numbers are all of one exact type
 * (bool, int or float: that of the first one), checked and stored into dst in one pass,
 * each as nest_put stores a nest of that kind. 1: done; 0: not such a nest, or a value
 * refused (dst partly written: the two passes of take_other then decide). No Python
 * code runs (exact types only), so the nest cannot change under the walk. */
static int
nest_fast(const Field *f, PyObject *v, int nd, const Py_ssize_t *full, char *dst)
{
    PyObject *first = v;
    for (int d = 0; d < nd; d++) {
        if ((!PyList_CheckExact(first) && !PyTuple_CheckExact(first))
            || PySequence_Fast_GET_SIZE(first) == 0)
            return 0;
        first = PySequence_Fast_GET_ITEM(first, 0);
    }
    const int kind = PyFloat_CheckExact(first) ? 4 : PyBool_Check(first) ? 1
                     : PyLong_CheckExact(first) ? 2 : 0;
    return kind ? nest_fast_at(f, v, 0, nd, full, kind, &dst) : 0;
}

/* Whether every one of the n bytes at p (bools) is 0 or 1. */
static int
canonical_bytes(const char *p, Py_ssize_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    unsigned char any = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        any |= b[i] & 0xFE;
    return !any;
}

/* Whether every byte of a bool buffer is 0 or 1. */
static int
canonical(const Py_buffer *view)
{
    return canonical_bytes((const char *)view->buf, view->len);
}

static int take_value(Appender *self, const Field *f, PyObject *v, const Py_ssize_t *lead,
                      int nlead, Src *out, int allow_host);

/* Items of format s at buf, of shape full[0..nd) (strides in bytes; NULL: C-contiguous),
 * converted into out's scratch in one pass. 1 taken, 0 refused by the casting rules (or
 * not a number this file converts), -1 error. */
static int
convert_into(const Field *f, NumFmt s, const char *buf, int nd, const Py_ssize_t *full,
             const Py_ssize_t *strides, Py_ssize_t count, Src *out)
{
    Kernel kern = s.kind ? pick_kernel(f, &s) : NULL;
    if (kern == NULL)
        return 0;
    char *dst = src_scratch(out, count * f->itemsize);
    if (dst == NULL)
        return -1;
    Py_ssize_t cst[2 * MAXDIM];
    if (strides == NULL) { /* C-contiguous */
        Py_ssize_t st = s.size;
        for (int i = nd - 1; i >= 0; i--) {
            cst[i] = st;
            st *= full[i];
        }
        strides = cst;
    }
    if (!convert_strided(f, &s, kern, buf, nd, full, strides, dst)) {
        src_release(out);
        return 0;
    }
    out->buf = dst;
    return 1;
}

/* A held view (not of the stored format) converted into out's scratch; the view is
 * released. 1 taken, 0 refused, -1 error (see convert_into). */
static int
convert_view(const Field *f, Py_buffer *view, int nd, const Py_ssize_t *full,
             Py_ssize_t count, Src *out)
{
    int r = convert_into(f, parse_format(view->format, view->itemsize),
                         (const char *)view->buf, nd, full, view->strides, count, out);
    PyBuffer_Release(view);
    return r;
}

/* ------------------------------------------------------------------ torch tensors
 * A plain CPU torch tensor is read where it lies, without the host callback: numpy() costs
 * ~0.7 us a tensor, a few attribute reads ~0.3 us. Only an object whose type is exactly
 * torch.Tensor, on the CPU, without a lazy negation (or conjugation, for complex), of a
 * dtype listed in torch_fmt and with strided layout (to_dlpack exports it) goes this way; its bytes are then what tensor_to_numpy's view would show. Any
 * other tensor, and any exception on the way, goes to the host callback as before. The
 * device, dtype, shape, strides and data pointer come from one to_dlpack export (about
 * 0.2 us, where five attribute reads took 0.45 us), and the two lazy bits DLPack does not
 * carry from the C base type's descriptors (torch_descr). torch is never imported here:
 * the type and dtypes are looked up in sys.modules once torch is there (a value can only
 * be a tensor then). */
#define NTORCH 11
static PyObject *torch_tensor;        /* torch.Tensor, or NULL until torch is seen */
/* what the items of each dtype read directly are: float32, float64, int8, int16, int32,
 * int64, uint8, bool, float16, complex64, complex128 (see dl_dtype_index) */
static NumFmt torch_fmt[NTORCH];
/* The C descriptors of torch's tensor base type (torch._C.TensorBase), called directly:
 * no instance-dict lookup (an attribute set on a tensor cannot shadow them) and no bound
 * method; getter: shape; methods: is_neg, is_conj. */
enum { T_SHAPE, T_IS_NEG, T_IS_CONJ, NT_DESCR };
static PyObject *torch_descr[NT_DESCR];
/* torch.utils.dlpack.to_dlpack (torch._C._to_dlpack): one call gives a tensor's device,
 * dtype, shape, strides and data pointer. It ignores the lazy negation and conjugation
 * bits, so those are asked through the descriptors (is_neg, is_conj). */
static PyObject *torch_to_dlpack;
/* The DLPack ABI (dlpack.h, the unversioned DLManagedTensor in a "dltensor" capsule). */
typedef struct {
    int32_t device_type; /* kDLCPU = 1 */
    int32_t device_id;
} DLDevice_;
typedef struct {
    uint8_t code; /* kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLComplex 5, kDLBool 6 */
    uint8_t bits;
    uint16_t lanes;
} DLDataType_;
typedef struct {
    void *data;
    DLDevice_ device;
    int32_t ndim;
    DLDataType_ dtype;
    int64_t *shape;
    int64_t *strides; /* in items; NULL: compact row-major */
    uint64_t byte_offset;
} DLTensor_;
typedef struct DLManaged_ {
    DLTensor_ dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManaged_ *);
} DLManaged_;

/* Attribute `i` of the tensor v (a new reference, or NULL with an error set). */
static inline PyObject *
tensor_attr(PyObject *v, int i)
{
    PyObject *d = torch_descr[i];
    if (i < T_IS_NEG)
        return Py_TYPE(d)->tp_descr_get(d, v, (PyObject *)Py_TYPE(v));
    return PyObject_CallOneArg(d, v);
}

/* Whether torch is imported and its tensor type, descriptors and to_dlpack are known
 * (looked up once). */
static int
torch_known(void)
{
    if (torch_tensor != NULL)
        return 1;
    PyObject *torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch"); /* borrowed */
    if (torch == NULL)
        return 0;
    static const char *const fmts[NTORCH] = {"f", "d", "b", "h", "i", "q", "B", "?",
                                             "e", "Zf", "Zd"};
    static const int sizes[NTORCH] = {4, 8, 1, 2, 4, 8, 1, 1, 2, 8, 16};
    static const char *const dnames[NT_DESCR] = {"shape", "is_neg", "is_conj"};
    PyObject *tensor = PyObject_GetAttrString(torch, "Tensor"), *descr[NT_DESCR] = {NULL};
    int ok = tensor != NULL && PyType_Check(tensor);
    /* the base type in C that torch.Tensor (a Python class) derives from */
    PyTypeObject *base = ok ? ((PyTypeObject *)tensor)->tp_base : NULL;
    ok = ok && base != NULL && !(base->tp_flags & Py_TPFLAGS_HEAPTYPE);
    for (int i = 0; ok && i < NT_DESCR; i++) {
        descr[i] = PyObject_GetAttrString((PyObject *)base, dnames[i]);
        ok = descr[i] != NULL
             && (i < T_IS_NEG ? Py_TYPE(descr[i]) == &PyGetSetDescr_Type
                              : Py_TYPE(descr[i]) == &PyMethodDescr_Type);
    }
    PyObject *tc = ok ? PyDict_GetItemString(PyImport_GetModuleDict(), "torch._C") : NULL;
    PyObject *export = tc != NULL ? PyObject_GetAttrString(tc, "_to_dlpack") : NULL;
    ok = export != NULL && PyCFunction_Check(export);
    if (!ok) { /* a module named torch that is not torch (or half imported): the host */
        PyErr_Clear();
        Py_XDECREF(tensor);
        for (int i = 0; i < NT_DESCR; i++)
            Py_XDECREF(descr[i]);
        Py_XDECREF(export);
        return 0;
    }
    for (int i = 0; i < NTORCH; i++)
        torch_fmt[i] = parse_format(fmts[i], sizes[i]);
    for (int i = 0; i < NT_DESCR; i++)
        torch_descr[i] = descr[i];
    torch_to_dlpack = export;
    torch_tensor = tensor;
    return 1;
}

/* The index in torch_fmt of a DLPack dtype (-1: not one this file reads directly). */
static int
dl_dtype_index(DLDataType_ d)
{
    if (d.lanes != 1)
        return -1;
    switch (d.code) {
    case 0: return d.bits == 8 ? 2 : d.bits == 16 ? 3 : d.bits == 32 ? 4 : d.bits == 64 ? 5 : -1;
    case 1: return d.bits == 8 ? 6 : -1;
    case 2: return d.bits == 32 ? 0 : d.bits == 64 ? 1 : d.bits == 16 ? 8 : -1;
    case 5: return d.bits == 64 ? 9 : d.bits == 128 ? 10 : -1;
    case 6: return d.bits == 8 ? 7 : -1;
    default: return -1;
    }
}

/* A tuple of n ints (torch.Size, stride()) into out; 1 ok, 0 not. */
static int
int_tuple(PyObject *t, Py_ssize_t *out, int n)
{
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != n)
        return 0;
    for (int i = 0; i < n; i++) {
        out[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, i));
        if (out[i] == -1 && PyErr_Occurred())
            return 0;
    }
    return 1;
}

/* A tensor's shape (up to 2 * MAXDIM dims). 1 ok; 0 not (error cleared). */
static int
tensor_shape(PyObject *v, int *nd, Py_ssize_t *shape)
{
    PyObject *sh = tensor_attr(v, T_SHAPE);
    int ok = sh != NULL && PyTuple_Check(sh) && PyTuple_GET_SIZE(sh) <= 2 * MAXDIM;
    if (ok) {
        *nd = (int)PyTuple_GET_SIZE(sh);
        ok = int_tuple(sh, shape, *nd);
    }
    Py_XDECREF(sh);
    if (!ok)
        PyErr_Clear();
    return ok;
}

static int read_tensor(const Field *f, int k, const char *buf, int nd,
                       const Py_ssize_t *full, Py_ssize_t *strides, Py_ssize_t count,
                       Src *out);

/* Take a torch tensor v (its type exactly torch.Tensor) as take_value takes an array: 1
 * taken, 0 refused by the casting rules or of the wrong shape, -1 error, 2 not for the
 * direct read (the host then). One to_dlpack export gives all but the lazy bits. */
static int
take_tensor(const Field *f, PyObject *v, int nd, const Py_ssize_t *full, Py_ssize_t count,
            Src *out)
{
    PyObject *cap = PyObject_CallOneArg(torch_to_dlpack, v);
    DLManaged_ *m = cap != NULL ? (DLManaged_ *)PyCapsule_GetPointer(cap, "dltensor") : NULL;
    if (m == NULL) { /* not exportable (sparse, ...): the host */
        Py_XDECREF(cap);
        PyErr_Clear();
        return 2;
    }
    const DLTensor_ *t = &m->dl_tensor;
    int k = t->device.device_type == 1 && t->data != NULL ? dl_dtype_index(t->dtype) : -1;
    int r = 2;
    if (k >= 0) {
        /* the lazy negation (and conjugation) bits, which DLPack does not carry */
        PyObject *neg = tensor_attr(v, T_IS_NEG);
        int ok = neg == Py_False;
        Py_XDECREF(neg);
        if (ok && (torch_fmt[k].code == 'F' || torch_fmt[k].code == 'D')) {
            PyObject *conj = tensor_attr(v, T_IS_CONJ);
            ok = conj == Py_False;
            Py_XDECREF(conj);
        }
        if (!ok)
            PyErr_Clear();
        else if (t->ndim != nd)
            r = 0;
        else {
            Py_ssize_t strides[2 * MAXDIM];
            Py_ssize_t want = 1;
            r = 1;
            for (int i = nd - 1; i >= 0; i--) {
                if (t->shape[i] != full[i])
                    r = 0;
                strides[i] = t->strides != NULL ? (Py_ssize_t)t->strides[i] : want;
                want *= full[i];
            }
            if (r)
                r = read_tensor(f, k, (const char *)t->data + t->byte_offset, nd, full,
                                strides, count, out);
        }
    }
    Py_DECREF(cap); /* its destructor frees the export (v keeps the data alive) */
    return r;
}

/* A tensor's items (torch_fmt[k]) at buf, shape full[0..nd), strides in items (made bytes
 * here), read in place or converted into out: 1 taken, 0 refused, -1 error. */
static int
read_tensor(const Field *f, int k, const char *buf, int nd, const Py_ssize_t *full,
            Py_ssize_t *strides, Py_ssize_t count, Src *out)
{
    const NumFmt s = torch_fmt[k];
    int contiguous = 1;
    Py_ssize_t want = 1;
    for (int i = nd - 1; i >= 0; i--) { /* strides in items; a dim of 1 has any */
        if (full[i] != 1 && strides[i] != want)
            contiguous = 0;
        strides[i] *= s.size;
        want *= full[i];
    }
    if (contiguous && s.kind == f->num.kind && s.size == f->itemsize && !f->num.swap
        && (s.kind != 'x' || s.code == f->num.code)
        && (s.kind != 'b' || canonical_bytes((const char *)buf, count))) {
        out->buf = (const char *)buf; /* the stored format already: read in place */
        return 1;
    }
    return convert_into(f, s, (const char *)buf, nd, full, strides, count, out);
}

/* A value that is not an array: a Python number of a subclass, a nest of lists, or an
 * object the host converts (see take_value). */
COLD static int
take_other(Appender *self, const Field *f, PyObject *v, const Py_ssize_t *lead, int nlead,
           const Py_ssize_t *full, Py_ssize_t count, Src *out, int allow_host)
{
    const int nd = nlead + f->ndim;
    if (PyFloat_Check(v) || PyLong_Check(v)) { /* bool is an int */
        if (nd != 0)
            return 0;
        int r = put_number(f, v, out->small);
        if (r > 0)
            out->buf = out->small;
        return r;
    }
    if (PyList_CheckExact(v) || PyTuple_CheckExact(v)) {
        if (nd == 0)
            return 0;
        char *dst = src_scratch(out, count * f->itemsize);
        if (dst == NULL)
            return -1;
        char *at = dst;
        if (nest_fast(f, v, nd, full, dst)) { /* numbers of one type: one pass */
            out->buf = dst;
            return 1;
        }
        /* mixed or unusual numbers (or a refusal to confirm): which numbers the nest
         * holds decides how each is read (numpy's dtype of the whole), then a second
         * pass stores them */
        int kinds = 0;
        int r = nest_kinds(v, 0, nd, full, &kinds) ? nest_put(f, v, 0, nd, kinds, &at) : 0;
        if (r <= 0) {
            src_release(out);
            return r;
        }
        out->buf = dst;
        return 1;
    }
    if (allow_host && self->host != Py_None && !PyUnicode_Check(v) && !PyBytes_Check(v)
        && v != Py_None && !PyDict_Check(v)) {
        int r = torch_known() && (PyObject *)Py_TYPE(v) == torch_tensor
                    ? take_tensor(f, v, nd, full, count, out) : 2;
        if (r != 2)
            return r;
        PyObject *h = PyObject_CallOneArg(self->host, v);
        if (h == NULL)
            return -1;
        r = h == Py_None ? 0 : take_value(self, f, h, lead, nlead, out, 0);
        Py_DECREF(h); /* a held view keeps its own reference */
        return r;
    }
    return 0;
}

/* Dims [lo, hi) of view v as one run at one stride (dims of one item skipped): 1 with
 * the stride in *st and the run's length in *run (0 when every dim is 1: no stride), or
 * 0. A stride may be 0 (a broadcast dim: the same items again). */
static int
one_run(const Py_buffer *v, int lo, int hi, Py_ssize_t *st, Py_ssize_t *run)
{
    *st = 0;
    *run = 0;
    for (int d = hi - 1; d >= lo; d--) {
        if (v->shape[d] == 1)
            continue;
        if (*run == 0) {
            *st = v->strides[d];
            *run = v->shape[d];
        } else if (v->strides[d] == *st * *run) {
            *run *= v->shape[d];
        } else {
            return 0;
        }
    }
    return 1;
}

/* Whether the cells of v (its first nlead dims: steps, lanes) lie at one stride *cs and
 * the items of a cell at one stride *is, neither negative. */
static int
cell_strides(const Py_buffer *v, int nlead, Py_ssize_t *cs, Py_ssize_t *is)
{
    Py_ssize_t items, cells;
    if (v->strides == NULL || !one_run(v, nlead, v->ndim, is, &items)
        || !one_run(v, 0, nlead, cs, &cells))
        return 0;
    if (items == 0) /* one item a cell */
        *is = v->itemsize;
    if (cells == 0) /* one cell */
        *cs = (items ? items : 1) * *is;
    return *is >= 0 && *cs >= 0;
}

/* Take the value v of field f with leading dims lead[0..nlead): 1 taken (out filled:
 * src_release it), 0 not taken (nothing held), -1 error. The common values (a Python
 * number for a scalar field, an array of exactly the stored format) are decided here;
 * the conversions live in the functions above. */
static int
take_value(Appender *self, const Field *f, PyObject *v, const Py_ssize_t *lead, int nlead,
           Src *out, int allow_host)
{
    const int nd = nlead + f->ndim;
    PyTypeObject *tp = Py_TYPE(v);
    out->buf = NULL;
    out->owned = NULL;
    out->has_view = 0;
    out->lazy = NULL;
    if (nd == 0 && (tp == &PyFloat_Type || tp == &PyBool_Type || tp == &PyLong_Type)) {
        /* a Python number for a scalar field: the commonest value of a one-env add */
        int r = put_number(f, v, out->small);
        if (r > 0)
            out->buf = out->small;
        return r;
    }
    Py_ssize_t full[2 * MAXDIM];
    Py_ssize_t count = 1;
    for (int i = 0; i < nlead; i++)
        full[i] = lead[i];
    for (int i = 0; i < f->ndim; i++)
        full[nlead + i] = f->shape[i];
    for (int i = 0; i < nd; i++)
        count *= full[i];
    if ((PyObject *)tp != self->ndarray_type
        && !PyObject_TypeCheck(v, (PyTypeObject *)self->ndarray_type)
        && !PyObject_TypeCheck(v, (PyTypeObject *)self->generic_type))
        return take_other(self, f, v, lead, nlead, full, count, out, allow_host);
    Py_buffer *view = &out->view;
    if (PyObject_GetBuffer(v, view, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear(); /* e.g. datetime: the Python boundary names it */
        return 0;
    }
    int ok = view->ndim == nd && view->itemsize > 0;
    for (int i = 0; ok && i < nd; i++)
        ok = view->shape[i] == full[i];
    if (!ok) {
        PyBuffer_Release(view);
        return 0;
    }
    if (view->itemsize == f->itemsize
        && strcmp(view->format ? view->format : "B", f->fmt) == 0
        && PyBuffer_IsContiguous(view, 'C')
        && (f->num.kind != 'b' || canonical(view))) {
        out->buf = (const char *)view->buf; /* exactly the stored format */
        out->has_view = 1;
        return 1;
    }
    Py_ssize_t is;
    if (f->is_obs && count >= LAZY_MIN && f->dk == 'f'
        && cell_strides(view, nlead, &out->lazy_cs, &is) && is == view->itemsize) {
        /* (items apart within a cell: gathered once into scratch is faster, as measured) */
        /* numbers into a float field (never refused): converted where they are written */
        NumFmt s = parse_format(view->format, view->itemsize);
        int number = s.kind == 'f' || s.kind == 'i' || s.kind == 'u' || s.kind == 'b';
        Kernel kern = number && !s.swap ? pick_kernel(f, &s) : NULL;
        if (kern != NULL) {
            out->buf = (const char *)view->buf;
            out->has_view = 1;
            out->lazy = kern;
            out->lazy_fmt = s;
            return 1;
        }
    }
    return convert_view(f, view, nd, full, count, out);
}

/* A lazy value (see Src) of `cells` cells converted now into its scratch: 1, -1 error. */
static int
src_settle(const Field *f, Src *s, Py_ssize_t cells)
{
    Kernel kern = s->lazy;
    if (kern == NULL)
        return 1;
    s->lazy = NULL;
    const Py_ssize_t per = f->nbytes / f->itemsize;
    char *dst = src_scratch(s, cells * f->nbytes);
    if (dst == NULL)
        return -1;
    /* into a float field: never refused */
    (void)kern(f, &s->lazy_fmt, s->buf, s->lazy_fmt.size, per, cells, s->lazy_cs, dst);
    s->buf = dst;
    return 1;
}

/* The shape of a value as the boundary would take it: ndim and the first two dims. 1:
 * known; 0: not a value this file takes. *conv gets a new reference to the host's array
 * for an object the host converts (use it instead of v), else NULL. */
COLD static int
probe_value(Appender *self, PyObject *v, int *ndim, Py_ssize_t *dims, PyObject **conv)
{
    *conv = NULL;
    dims[0] = dims[1] = 0;
    if (PyObject_TypeCheck(v, (PyTypeObject *)self->ndarray_type)
        || PyObject_TypeCheck(v, (PyTypeObject *)self->generic_type)) {
        Py_buffer view;
        if (PyObject_GetBuffer(v, &view, PyBUF_RECORDS_RO) < 0) {
            PyErr_Clear();
            return 0;
        }
        *ndim = view.ndim;
        for (int i = 0; i < 2 && i < view.ndim; i++)
            dims[i] = view.shape[i];
        PyBuffer_Release(&view);
        return 1;
    }
    if (PyFloat_Check(v) || PyLong_Check(v)) {
        *ndim = 0;
        return 1;
    }
    if (PyList_CheckExact(v) || PyTuple_CheckExact(v)) {
        int d = 0;
        while (PyList_CheckExact(v) || PyTuple_CheckExact(v)) {
            Py_ssize_t len = PySequence_Fast_GET_SIZE(v);
            if (d < 2)
                dims[d] = len;
            d++;
            if (len == 0 || d > 2 * MAXDIM)
                break;
            v = PySequence_Fast_GET_ITEM(v, 0);
        }
        *ndim = d;
        return 1;
    }
    if (self->host == Py_None || PyUnicode_Check(v) || PyBytes_Check(v) || v == Py_None
        || PyDict_Check(v))
        return 0;
    Py_ssize_t shape[2 * MAXDIM];
    if (torch_known() && (PyObject *)Py_TYPE(v) == torch_tensor
        && tensor_shape(v, ndim, shape)) {
        for (int i = 0; i < 2 && i < *ndim; i++) /* take_value reads it (or its host copy) */
            dims[i] = shape[i];
        return 1;
    }
    PyObject *h = PyObject_CallOneArg(self->host, v);
    if (h == NULL) {
        PyErr_Clear();
        return 0;
    }
    if (h == Py_None || !PyObject_TypeCheck(h, (PyTypeObject *)self->ndarray_type)) {
        Py_DECREF(h);
        return 0;
    }
    int r = probe_value(self, h, ndim, dims, conv);
    if (r)
        *conv = h;
    else
        Py_DECREF(h);
    return r;
}

/* ------------------------------------------------------------------ the plan
 * The C twin of replaybank/storage/writers/plan.py (plan_write): where a write of n
 * steps to each of the m lanes `lanes` goes, from the counters alone. Per lane j: s0 (its
 * written), c0 (its counts), kept (kept_old: live old steps after the eviction), ncount
 * (new_counts). Kept step i of lane j goes to row (s0 + skip + i) % T; it evicts a live
 * old step when that row lies within the c0 newest rows; the lane's previous newest step
 * (row s0 - 1) may continue into the write when skip == 0, c0 > 0 and kept > 0. */
typedef struct {
    Py_ssize_t T, L, n, m, skip, nk;
    Py_ssize_t row0;  /* lanes in step: the row of the first kept step (every lane's) */
    int all_lanes, in_step, any_evict;
    const int64_t *lanes;
    int64_t *s0, *c0, *kept, *ncount; /* [m] each */
} Plan;

static void
plan_write(Plan *p, Py_ssize_t T, Py_ssize_t L, const int64_t *lanes, Py_ssize_t m,
           int all_lanes, const int64_t *written, const int64_t *counts, Py_ssize_t n,
           int64_t *scratch)
{
    p->T = T;
    p->L = L;
    p->n = n;
    p->m = m;
    p->lanes = lanes;
    p->all_lanes = all_lanes;
    p->skip = n > T ? n - T : 0;
    p->nk = n - p->skip;
    p->s0 = scratch;
    p->c0 = scratch + m;
    p->kept = scratch + 2 * m;
    p->ncount = scratch + 3 * m;
    p->in_step = 1;
    p->any_evict = 0;
    for (Py_ssize_t j = 0; j < m; j++) {
        int64_t s = written[lanes[j]], c = counts[lanes[j]];
        int64_t over = c + n - T > 0 ? c + n - T : 0;
        p->s0[j] = s;
        p->c0[j] = c;
        p->kept[j] = c - over > 0 ? c - over : 0;
        p->ncount[j] = c + n < T ? c + n : T;
        p->any_evict |= p->kept[j] < c;
        if (j && (s != p->s0[0] || c != p->c0[0]))
            p->in_step = 0;
    }
    p->row0 = m ? (Py_ssize_t)((p->s0[0] + p->skip) % T) : 0;
}

static inline Py_ssize_t
mod_T(int64_t x, Py_ssize_t T)
{
    int64_t r = x % T;
    return (Py_ssize_t)(r < 0 ? r + T : r);
}

/* Row of kept step i of lane position j. */
static inline Py_ssize_t
plan_row(const Plan *p, Py_ssize_t i, Py_ssize_t j)
{
    if (p->in_step) { /* i < nk <= T: one wrap at most, no division */
        Py_ssize_t r = p->row0 + i;
        return r >= p->T ? r - p->T : r;
    }
    return mod_T(p->s0[j] + p->skip + i, p->T);
}

static inline int
plan_evicted(const Plan *p, Py_ssize_t i, Py_ssize_t j)
{
    return mod_T(plan_row(p, i, j) - (p->s0[j] - p->c0[j]), p->T) < p->c0[j];
}

/* Row of the lane's newest step before the write. */
static inline Py_ssize_t
plan_prev_row(const Plan *p, Py_ssize_t j)
{
    if (p->in_step && p->skip == 0)
        return p->row0 ? p->row0 - 1 : p->T - 1;
    return mod_T(p->s0[j] - 1, p->T);
}

/* The lane's previous newest step survives and may continue into this write. */
static inline int
plan_prev(const Plan *p, Py_ssize_t j)
{
    return p->skip == 0 && p->c0[j] > 0 && p->kept[j] > 0;
}

/* ------------------------------------------------------------------ the side store */
/* The side store arrays of every obs field as buffers sv[0..nob) (they may have been
 * reallocated); 0 ok (release them with release_sides), -1 error (none held). */
static int
side_view(Appender *self, Py_buffer *sv)
{
    if (self->nob == 0) /* a rows table: its side slots hold no data */
        return 0;
    PyObject *side = PyObject_GetAttr(self->table, s_side);
    if (side == NULL)
        return -1;
    for (int p = 0; p < self->nob; p++) {
        PyObject *arr = PyObject_GetItem(side, self->oside[p]);
        int r = arr == NULL ? -1 : PyObject_GetBuffer(arr, &sv[p], PyBUF_CONTIG);
        Py_XDECREF(arr);
        if (r < 0) {
            while (p > 0)
                PyBuffer_Release(&sv[--p]);
            Py_DECREF(side);
            return -1;
        }
    }
    Py_DECREF(side);
    self->side_slots = PY_SSIZE_T_MAX;
    for (int p = 0; p < self->nob; p++) { /* slots every obs field's array holds */
        Py_ssize_t k = sv[p].len / self->f[self->oi[p]].nbytes;
        self->side_slots = k < self->side_slots ? k : self->side_slots;
    }
    return 0;
}

static void
release_sides(Appender *self, Py_buffer *sv)
{
    for (int p = 0; p < self->nob; p++)
        PyBuffer_Release(&sv[p]);
}

/* Whether side slot `slot` lies inside every obs field's side array (the views of the
 * last side_view: a rows table's slots hold no data). */
static inline int
slot_inside(Appender *self, long long slot)
{
    return slot >= 0 && (self->nob == 0 || slot < self->side_slots);
}

/* A link or free slot outside the side store: raise instead of touching memory. */
COLD static int
corrupt(long long link)
{
    PyErr_Format(PyExc_RuntimeError,
                 "side slot %lld is outside the side store: the table is corrupt "
                 "(its links or free list were edited); restore it from a checkpoint",
                 link - 1);
    return 1;
}

static int
free_append(PyObject *free, long long slot)
{
    PyObject *x = PyLong_FromLongLong(slot);
    if (x == NULL)
        return -1;
    int r = PyList_Append(free, x);
    Py_DECREF(x);
    return r;
}

/* k slots in SideStore.alloc(k) order (popped from the end of the free list, or the side
 * store grows first); 0 ok, -1 error. */
static int
take_slots(Appender *self, PyObject *free, Py_ssize_t k, long long *out)
{
    Py_ssize_t have = PyList_GET_SIZE(free);
    if (have >= k) {
        for (Py_ssize_t j = 0; j < k; j++) {
            out[j] = PyLong_AsLongLong(PyList_GET_ITEM(free, have - 1 - j));
            if (out[j] == -1 && PyErr_Occurred())
                return -1;
        }
        return PyList_SetSlice(free, have - k, have, NULL);
    }
    PyObject *kk = PyLong_FromSsize_t(k);
    if (kk == NULL)
        return -1;
    PyObject *res = PyObject_CallMethodObjArgs(self->table, s_alloc, kk, NULL);
    Py_DECREF(kk);
    if (res == NULL)
        return -1;
    PyObject *lst = PySequence_List(res);
    Py_DECREF(res);
    if (lst == NULL)
        return -1;
    int err = PyList_GET_SIZE(lst) != k;
    if (err)
        PyErr_SetString(PyExc_RuntimeError, "SideStore.alloc returned the wrong number of slots");
    for (Py_ssize_t j = 0; !err && j < k; j++) {
        out[j] = PyLong_AsLongLong(PyList_GET_ITEM(lst, j));
        err = out[j] == -1 && PyErr_Occurred();
    }
    Py_DECREF(lst);
    return err ? -1 : 0;
}

static PyObject *
get_free(Appender *self)
{
    PyObject *free = PyObject_GetAttr(self->table, s_free);
    if (free != NULL && !PyList_CheckExact(free)) {
        Py_DECREF(free);
        PyErr_SetString(PyExc_TypeError, "side store free list must be a list");
        return NULL;
    }
    return free;
}

/* ------------------------------------------------------------------ the applier */
/* How obs field q's obs and next obs of a write are held: kern NULL, in the stored format;
 * else both lazy (see Src), of format fmt, per contiguous items a cell (a step of a
 * lane); cs[w] the cell stride of the obs (w = 0) and of the next obs (w = 1). */
typedef struct {
    Kernel kern;
    NumFmt fmt;
    Py_ssize_t per;
    Py_ssize_t cs[2];
} Lazy;

/* No field lazy (every write's but a large converting one's). */
static const Lazy NO_LAZY[MAXOBS];

/* Cell c of lazy value w (0 obs, 1 next obs) converted into dst (a cell of the stored
 * format: never refused, see Src). */
static inline void
lazy_cell(const Field *f, const Lazy *lz, int w, const char *raw, Py_ssize_t c, char *dst)
{
    (void)lz->kern(f, &lz->fmt, raw + c * lz->cs[w], lz->fmt.size, lz->per, 1, 0, dst);
}

/* Whether the given items of next obs cells [j, j + count) (nx) equal those of obs cells
 * [jo, jo + count) (ob), item for item (the items of a cell are contiguous). */
static int
lazy_same(const Lazy *lz, const char *nx, const char *ob, Py_ssize_t j, Py_ssize_t jo,
          Py_ssize_t count)
{
    const Py_ssize_t sz = lz->fmt.size, per = lz->per, cell = per * sz;
    const char *a = nx + j * lz->cs[1], *b = ob + jo * lz->cs[0];
    if (lz->cs[0] == cell && lz->cs[1] == cell)
        return !memcmp(a, b, (size_t)(count * cell));
    for (Py_ssize_t c = 0; c < count; c++)
        if (memcmp(a + c * lz->cs[1], b + c * lz->cs[0], (size_t)cell))
            return 0;
    return 1;
}

/* Next observations kn (cells [j, j + count) of [nk, m]) equal the obs of cells
 * [j + m, j + m + count) bitwise, in every obs field. A lazy field compares its items as
 * given (equal there: equal once converted); a cell that differs there is compared
 * converted (tmp: room for two cells). */
static int
next_is_obs(Appender *self, char *const *ks, const char *const *kn, Py_ssize_t m,
            Py_ssize_t j, Py_ssize_t count, const Lazy *lz, char *tmp)
{
    for (int q = 0; q < self->nob; q++) {
        const Field *f = &self->f[self->oi[q]];
        const char *obs = ks[self->oi[q]];
        if (lz[q].kern == NULL) {
            const Py_ssize_t ib = f->nbytes;
            if (memcmp(kn[q] + j * ib, obs + (j + m) * ib, (size_t)(count * ib)))
                return 0;
            continue;
        }
        if (lazy_same(&lz[q], kn[q], obs, j, j + m, count))
            continue;
        if (count > 1) /* the caller asks again cell by cell */
            return 0;
        lazy_cell(f, &lz[q], 1, kn[q], j, tmp);
        lazy_cell(f, &lz[q], 0, obs, j + m, tmp + f->nbytes);
        if (memcmp(tmp, tmp + f->nbytes, (size_t)f->nbytes))
            return 0;
    }
    return 1;
}

/* The first index in [lo, hi) of a nonzero byte of flags (0/1 bytes), or hi. */
static inline Py_ssize_t
first_set(const char *flags, Py_ssize_t lo, Py_ssize_t hi)
{
    if (lo >= hi)
        return hi;
    const char *at = memchr(flags + lo, 1, (size_t)(hi - lo));
    return at == NULL ? hi : at - flags;
}

/* The kept steps [nk, m] of one field (src, row-major) into their rows of the store. */
static void
write_rows(const Plan *p, char *store, Py_ssize_t nb, const char *src)
{
    const Py_ssize_t L = p->L, m = p->m, nk = p->nk;
    if (p->in_step && p->all_lanes) { /* whole rows: one block, two when it wraps */
        Py_ssize_t start = plan_row(p, 0, 0), first = nk < p->T - start ? nk : p->T - start;
        /* memmove: an input may even be a view of the storage itself */
        memmove(store + start * L * nb, src, (size_t)(first * L * nb));
        if (first < nk)
            memmove(store, src + first * L * nb, (size_t)((nk - first) * L * nb));
        return;
    }
    for (Py_ssize_t i = 0; i < nk; i++)
        for (Py_ssize_t j = 0; j < m; j++)
            memmove(store + (plan_row(p, i, j) * L + p->lanes[j]) * nb,
                    src + (i * m + j) * nb, (size_t)nb);
}

/* write_rows of a lazy field: its kept cells converted into their rows (the input never
 * overlaps the store: write_values checked). */
static void
write_rows_lazy(const Plan *p, const Field *f, const Lazy *lz, const char *raw)
{
    const Py_ssize_t L = p->L, m = p->m, nk = p->nk, nb = f->nbytes;
    char *store = (char *)f->store.buf;
    if (p->in_step && p->all_lanes) { /* whole rows: one block, two when it wraps */
        Py_ssize_t start = plan_row(p, 0, 0), first = nk < p->T - start ? nk : p->T - start;
        (void)lz->kern(f, &lz->fmt, raw, lz->fmt.size, lz->per, first * L, lz->cs[0],
                       store + start * L * nb);
        if (first < nk)
            (void)lz->kern(f, &lz->fmt, raw + first * L * lz->cs[0], lz->fmt.size, lz->per,
                           (nk - first) * L, lz->cs[0], store);
        return;
    }
    for (Py_ssize_t i = 0; i < nk; i++)
        for (Py_ssize_t j = 0; j < m; j++)
            lazy_cell(f, lz, 0, raw, i * m + j,
                      store + (plan_row(p, i, j) * L + p->lanes[j]) * nb);
}

/* Carry out the plan p (the four steps of replaybank/storage/writers/plan.py, in the
 * order of reference.apply): src[i] points at field i's [n, m, *shape] bytes (stored
 * format), nsrc[q] at obs field q's next observations. 0, or -1 with an exception set
 * (only on memory errors or a corrupt table; the table may then be partly written). */
static int
apply_plan(Appender *self, const Plan *p, char *const *src, const char *const *nsrc,
           const Lazy *lz)
{
    const Py_ssize_t T = p->T, L = p->L, m = p->m, nk = p->nk, skip = p->skip, n = p->n;
    const Py_ssize_t cells = nk * m;
    int32_t *link = (int32_t *)self->link.buf;
    int64_t *wr = meta(&self->written), *cn = meta(&self->counts), *ep = meta(&self->episodes);
    const char *sterm = (const char *)self->f[3].store.buf;
    const char *strunc = (const char *)self->f[4].store.buf;
    char *ks[MAXFIELDS];
    const char *kn[MAXOBS];
    for (int i = 0; i < self->nf; i++)
        ks[i] = src[i] + skip * m * self->f[i].nbytes;
    for (int q = 0; q < self->nob; q++)
        kn[q] = nsrc[q] + skip * m * self->f[self->oi[q]].nbytes;
    Py_ssize_t tmp_bytes = 0; /* two converted cells of the widest lazy field */
    for (int q = 0; lz != NO_LAZY && q < self->nob; q++) {
        if (lz[q].kern == NULL)
            continue;
        const int i = self->oi[q];
        ks[i] = src[i] + skip * m * lz[q].cs[0];
        kn[q] = nsrc[q] + skip * m * lz[q].cs[1];
        tmp_bytes = 2 * self->f[i].nbytes > tmp_bytes ? 2 * self->f[i].nbytes : tmp_bytes;
    }
    const char *kterm = ks[3], *ktrunc = ks[4]; /* [nk, m] bools */
    Py_ssize_t pos_s[STACK_ITEMS];
    long long slots_s[STACK_ITEMS], relink_s[STACK_ITEMS];
    int heap_c = cells > STACK_ITEMS, heap_m = m > STACK_ITEMS;
    Py_ssize_t *pos = heap_c ? PyMem_Malloc((size_t)cells * sizeof(Py_ssize_t)) : pos_s;
    long long *slots = heap_c ? PyMem_Malloc((size_t)cells * sizeof(long long)) : slots_s;
    long long *relink = heap_m ? PyMem_Malloc((size_t)m * sizeof(long long)) : relink_s;
    char *tmp = tmp_bytes ? PyMem_Malloc((size_t)tmp_bytes) : NULL;
    Py_buffer sv[MAXOBS];
    int err = 0, have_side = 0, any_relink = 0;
    PyObject *free = get_free(self);
    if (pos == NULL || slots == NULL || relink == NULL || free == NULL
        || (tmp_bytes && tmp == NULL)) {
        if (free != NULL)
            PyErr_NoMemory();
        err = 1;
        goto out;
    }
    /* 1. evict: the live old steps in the rows written leave the window first (durable:
     *    start advances, the truth of reopened files, and counts follow after the commit;
     *    files written before start existed drop counts instead), then their side slots
     *    are freed, row-major */
    if (p->any_evict) {
        if (self->durable) {
            DURABLE_STORE(self);
            if (self->has_start)
                for (Py_ssize_t j = 0; j < m; j++)
                    meta(&self->start)[p->lanes[j]] = p->s0[j] - p->kept[j];
            else
                for (Py_ssize_t j = 0; j < m; j++)
                    cn[p->lanes[j]] = p->kept[j];
        }
        if (p->in_step && p->all_lanes && skip == 0) {
            /* whole rows, in memory order: kept rows i >= T - c0 held a live step */
            Py_ssize_t start = plan_row(p, 0, 0), i0 = T - p->c0[0];
            for (Py_ssize_t seg = 0; !err && seg < 2; seg++) { /* before and after a wrap */
                Py_ssize_t lo = seg ? T - start : i0, hi = seg ? nk : T - start;
                lo = lo > i0 ? lo : i0;
                hi = hi < nk ? hi : nk;
                const int32_t *at = link + ((start + lo) % T) * L;
                for (Py_ssize_t c = 0; !err && c < (hi - lo) * L; c++)
                    if (at[c] > 0)
                        err = free_append(free, at[c] - 1) < 0;
            }
        } else {
            for (Py_ssize_t i = 0; !err && i < nk; i++)
                for (Py_ssize_t j = 0; !err && j < m; j++) {
                    Py_ssize_t at = plan_row(p, i, j) * L + p->lanes[j];
                    if (link[at] > 0 && plan_evicted(p, i, j))
                        err = free_append(free, link[at] - 1) < 0;
                }
        }
        if (err)
            goto out;
    }
    /* 2. does each lane's previous newest step continue into the first new obs? (not an
     *    episode end, and its kept next obs equals that obs bitwise in every obs field) */
    for (Py_ssize_t j = 0; j < m; j++) {
        relink[j] = 0;
        if (!plan_prev(p, j))
            continue;
        Py_ssize_t at = plan_prev_row(p, j) * L + p->lanes[j];
        long long q = link[at];
        if (q <= 0 || sterm[at] || strunc[at])
            continue;
        if (!have_side) {
            if (side_view(self, sv) < 0) {
                err = 1;
                goto out;
            }
            have_side = 1;
        }
        if (!slot_inside(self, q - 1)) {
            err = corrupt(q);
            goto out;
        }
        int same = 1;
        for (int o = 0; same && o < self->nob; o++) {
            const Field *f = &self->f[self->oi[o]];
            const Py_ssize_t ib = f->nbytes;
            const char *first = ks[self->oi[o]] + j * ib;
            if (lz[o].kern != NULL) {
                lazy_cell(f, &lz[o], 0, ks[self->oi[o]], j, tmp);
                first = tmp;
            }
            same = !memcmp((const char *)sv[o].buf + (q - 1) * ib, first, (size_t)ib);
        }
        if (same) {
            relink[j] = q;
            any_relink = 1;
        }
    }
    /* 3. the kept steps whose next obs goes aside, row-major: a step where some lane's
     *    episode ended or the data jumps (next obs is not the next step's obs bitwise),
     *    and the newest step of each lane. Runs of rows without an end: one compare. */
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < nk - 1;) {
        /* hi: the next row (before the last) where some lane's episode ends */
        Py_ssize_t hi = first_set(kterm, i * m, (nk - 1) * m) / m;
        Py_ssize_t hr = first_set(ktrunc, i * m, hi * m) / m;
        hi = hr < hi ? hr : hi;
        if (hi > i && !next_is_obs(self, ks, kn, m, i * m, (hi - i) * m, lz, tmp))
            for (Py_ssize_t c = i * m; c < hi * m; c++)
                if (!next_is_obs(self, ks, kn, m, c, 1, lz, tmp))
                    pos[k++] = c;
        if (hi < nk - 1) /* row hi: a lane's episode ends there */
            for (Py_ssize_t c = hi * m; c < (hi + 1) * m; c++)
                if (kterm[c] || ktrunc[c] || !next_is_obs(self, ks, kn, m, c, 1, lz, tmp))
                    pos[k++] = c;
        i = hi + 1;
    }
    for (Py_ssize_t c = (nk - 1) * m; c < cells; c++)
        pos[k++] = c;
    if (have_side && PyList_GET_SIZE(free) < k) { /* growing replaces the side arrays */
        release_sides(self, sv);
        have_side = 0;
    }
    if (take_slots(self, free, k, slots) < 0) {
        err = 1;
        goto out;
    }
    if (!have_side) {
        if (side_view(self, sv) < 0) {
            err = 1;
            goto out;
        }
        have_side = 1;
    }
    for (Py_ssize_t s = 0; s < k; s++)
        if (!slot_inside(self, slots[s])) {
            err = corrupt(slots[s] + 1);
            goto out;
        }
    for (int o = 0; o < self->nob; o++) {
        const Field *f = &self->f[self->oi[o]];
        const Py_ssize_t ib = f->nbytes;
        DURABLE_STORE(self);
        if (lz[o].kern != NULL)
            for (Py_ssize_t s = 0; s < k; s++)
                lazy_cell(f, &lz[o], 1, kn[o], pos[s], (char *)sv[o].buf + slots[s] * ib);
        else
            for (Py_ssize_t s = 0; s < k; s++)
                memcpy((char *)sv[o].buf + slots[s] * ib, kn[o] + pos[s] * ib, (size_t)ib);
    }
    release_sides(self, sv);
    have_side = 0;
    /* 4. data and links (outside the live window), then the commit (written), then the
     *    previous newest steps that continued are relinked (no longer the newest), then
     *    counts and episodes */
    for (int i = 0; i < self->nf; i++) {
        DURABLE_STORE(self);
        const Lazy *li = NULL; /* field i's Lazy, where it is lazy (obs fields only) */
        if (tmp_bytes && self->f[i].is_obs)
            for (int q = 0; q < self->nob; q++)
                if (self->oi[q] == i && lz[q].kern != NULL)
                    li = &lz[q];
        if (li == NULL)
            write_rows(p, (char *)self->f[i].store.buf, self->f[i].nbytes, ks[i]);
        else
            write_rows_lazy(p, &self->f[i], li, ks[i]);
    }
    DURABLE_STORE(self);
    if (p->in_step && p->all_lanes) {
        Py_ssize_t start = plan_row(p, 0, 0), first = nk < T - start ? nk : T - start;
        memset(link + start * L, 0, (size_t)(first * L) * sizeof(int32_t));
        if (first < nk)
            memset(link, 0, (size_t)((nk - first) * L) * sizeof(int32_t));
    } else {
        for (Py_ssize_t i = 0; i < nk; i++)
            for (Py_ssize_t j = 0; j < m; j++)
                link[plan_row(p, i, j) * L + p->lanes[j]] = 0;
    }
    for (Py_ssize_t s = 0; s < k; s++) {
        Py_ssize_t i = pos[s] / m, j = pos[s] % m;
        link[plan_row(p, i, j) * L + p->lanes[j]] = (int32_t)(slots[s] + 1);
    }
    DURABLE_STORE(self);
    for (Py_ssize_t j = 0; j < m; j++)
        wr[p->lanes[j]] = p->s0[j] + n;
    if (any_relink) {
        DURABLE_STORE(self);
        for (Py_ssize_t j = 0; !err && j < m; j++) {
            if (relink[j]) {
                link[plan_prev_row(p, j) * L + p->lanes[j]] = 0;
                err = free_append(free, relink[j] - 1) < 0;
            }
        }
    }
    DURABLE_STORE(self);
    for (Py_ssize_t j = 0; j < m; j++)
        cn[p->lanes[j]] = p->ncount[j];
    DURABLE_STORE(self);
    {
        /* every step's end, the skipped too; flags are 0/1 bytes, ends are rare */
        const char *term = src[3], *trunc = src[4];
        for (Py_ssize_t c = first_set(term, 0, n * m); c < n * m;
             c = first_set(term, c + 1, n * m))
            ep[p->lanes[c % m]] += 1;
        for (Py_ssize_t c = first_set(trunc, 0, n * m); c < n * m;
             c = first_set(trunc, c + 1, n * m))
            ep[p->lanes[c % m]] += !term[c];
    }
out:
    if (have_side)
        release_sides(self, sv);
    Py_XDECREF(free);
    if (tmp != NULL)
        PyMem_Free(tmp);
    if (heap_c) {
        PyMem_Free(pos);
        PyMem_Free(slots);
    }
    if (heap_m)
        PyMem_Free(relink);
    return err ? -1 : 0;
}

/* Plan and apply a write of n steps of the m lanes `lanes`; a durable write that evicts
 * live steps with more than `chunk` steps goes in chunks of at most that many, each
 * planned and applied whole (a kill shows a prefix of the write). 0 or -1. */
static int
commit(Appender *self, const int64_t *lanes, Py_ssize_t m, int all_lanes, Py_ssize_t n,
       char *const *src, const char *const *nsrc, const Lazy *lz)
{
    int64_t scratch_s[4 * 64];
    int64_t *scratch = m > 64 ? PyMem_Malloc((size_t)(4 * m) * sizeof(int64_t)) : scratch_s;
    if (scratch == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    const int64_t *written = meta(&self->written), *counts = meta(&self->counts);
    Plan p;
    plan_write(&p, self->T, self->L, lanes, m, all_lanes, written, counts, n, scratch);
    int r = 0;
    if (!(self->durable && p.any_evict && n > self->chunk)) {
        r = apply_plan(self, &p, src, nsrc, lz);
    } else {
        char *csrc[MAXFIELDS];
        const char *cnsrc[MAXOBS];
        for (Py_ssize_t lo = 0; r == 0 && lo < n; lo += self->chunk) {
            Py_ssize_t k = n - lo < self->chunk ? n - lo : self->chunk;
            for (int i = 0; i < self->nf; i++)
                csrc[i] = src[i] + lo * m * self->f[i].nbytes;
            for (int q = 0; q < self->nob; q++) {
                const Py_ssize_t nb = self->f[self->oi[q]].nbytes;
                csrc[self->oi[q]] = src[self->oi[q]] + lo * m * (lz[q].kern ? lz[q].cs[0] : nb);
                cnsrc[q] = nsrc[q] + lo * m * (lz[q].kern ? lz[q].cs[1] : nb);
            }
            plan_write(&p, self->T, self->L, lanes, m, all_lanes, written, counts, k, scratch);
            r = apply_plan(self, &p, csrc, cnsrc, lz);
        }
    }
    if (m > 64)
        PyMem_Free(scratch);
    return r;
}

/* ------------------------------------------------------------------ calls */
/* The lanes a call writes: None (every lane), or a list, tuple or 1-D int array of
 * distinct ints in [0, L). 1: parsed into out[0..*m); 0: not for this path (the Python
 * boundary names it); -1: error. */
static int
parse_lanes(Appender *self, PyObject *arg, int64_t *out, Py_ssize_t *m, int *all_lanes)
{
    const Py_ssize_t L = self->L;
    *all_lanes = 0;
    if (arg == Py_None) {
        for (Py_ssize_t l = 0; l < L; l++)
            out[l] = l;
        *m = L;
        *all_lanes = 1;
        return 1;
    }
    Py_ssize_t n = 0;
    int ok = 1;
    if (PyObject_TypeCheck(arg, (PyTypeObject *)self->ndarray_type)) {
        Py_buffer view;
        if (PyObject_GetBuffer(arg, &view, PyBUF_RECORDS_RO) < 0) {
            PyErr_Clear();
            return 0;
        }
        NumFmt s = parse_format(view.format, view.itemsize);
        ok = view.ndim == 1 && (s.kind == 'i' || s.kind == 'u');
        n = ok ? view.shape[0] : 0;
        ok = ok && n >= 1 && n <= L;
        for (Py_ssize_t j = 0; ok && j < n; j++) {
            const char *at = (const char *)view.buf + j * (view.strides ? view.strides[0]
                                                                       : view.itemsize);
            uint64_t bits = load_bits(at, s.size, s.swap);
            int sh = 64 - 8 * s.size;
            int64_t v = s.kind == 'i' && sh ? (int64_t)(bits << sh) >> sh : (int64_t)bits;
            ok = v >= 0 && v < L && (s.kind == 'i' || bits < (uint64_t)L);
            out[j] = v;
        }
        PyBuffer_Release(&view);
    } else if (PyList_CheckExact(arg) || PyTuple_CheckExact(arg)) {
        n = PySequence_Fast_GET_SIZE(arg);
        ok = n >= 1 && n <= L;
        PyObject **items = PySequence_Fast_ITEMS(arg);
        for (Py_ssize_t j = 0; ok && j < n; j++) {
            PyObject *item = items[j];
            if (!PyLong_CheckExact(item)) { /* numpy ints, bools: the Python boundary */
                ok = 0;
                break;
            }
            int overflow = 0;
            long long v = PyLong_AsLongLongAndOverflow(item, &overflow);
            if (v == -1 && PyErr_Occurred())
                return -1;
            ok = !overflow && v >= 0 && v < L;
            out[j] = v;
        }
    } else {
        return 0;
    }
    if (!ok)
        return 0;
    /* distinct: a bitmap for small tables, a quadratic scan is cheap for few lanes */
    if (n <= 16) {
        for (Py_ssize_t a = 1; a < n; a++)
            for (Py_ssize_t b = 0; b < a; b++)
                if (out[a] == out[b])
                    return 0;
    } else {
        char *seen = PyMem_Calloc((size_t)L, 1);
        if (seen == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t j = 0; ok && j < n; j++) {
            ok = !seen[out[j]];
            seen[out[j]] = 1;
        }
        PyMem_Free(seen);
        if (!ok)
            return 0;
    }
    *m = n;
    int all = n == L;
    for (Py_ssize_t j = 0; all && j < n; j++)
        all = out[j] == j;
    *all_lanes = all;
    return 1;
}

/* How a call's values are shaped: an add (one step, leading lane dim when several lanes
 * or env_ids), an extend (a leading step dim too), or arrays (always [n, m, ...], the
 * Python boundary's checked values). */
enum { MODE_ADD = 0, MODE_EXTEND = 1, MODE_ARRAYS = 2 };

/* Whether the bytes [p, p + len) share memory with the buffer b. */
static inline int
overlaps(const char *p, Py_ssize_t len, const Py_buffer *b)
{
    const char *lo = (const char *)b->buf;
    return b->buf != NULL && p < lo + b->len && lo < p + len;
}

/* Whether the lazy value s (`cells` cells of `per` items) shares memory with anything a
 * write stores into: a field's rows, the links and counters, the side arrays. */
static int
lazy_overlaps(Appender *self, const Src *s, Py_ssize_t cells, Py_ssize_t per,
              const Py_buffer *sv)
{
    const Py_ssize_t bytes = (cells - 1) * s->lazy_cs + per * s->lazy_fmt.size;
    for (int i = 0; i < self->nf; i++)
        if (overlaps(s->buf, bytes, &self->f[i].store))
            return 1;
    if (overlaps(s->buf, bytes, &self->link) || overlaps(s->buf, bytes, &self->written)
        || overlaps(s->buf, bytes, &self->counts) || overlaps(s->buf, bytes, &self->episodes)
        || (self->has_start && overlaps(s->buf, bytes, &self->start)))
        return 1;
    for (int q = 0; q < self->nob; q++)
        if (overlaps(s->buf, bytes, &sv[q]))
            return 1;
    return 0;
}

/* The Lazy of each obs field of a write of `cells` cells (steps x lanes), from its taken
 * obs and next obs (s[oi[q]], s[nf + q]): lazy where both are, of one format, and share
 * no memory with the buffer; every other lazy value converted now. 0, or -1 on error. */
static int
lazy_pairs(Appender *self, Src *s, Py_ssize_t cells, Lazy *lz)
{
    Py_buffer sv[MAXOBS];
    int have_side = 0, err = 0;
    for (int q = 0; q < self->nob; q++) {
        const Field *f = &self->f[self->oi[q]];
        Src *o = &s[self->oi[q]], *x = &s[self->nf + q];
        lz[q].kern = NULL;
        if (o->lazy == NULL && x->lazy == NULL)
            continue;
        const Py_ssize_t per = f->nbytes / f->itemsize;
        int keep = o->lazy != NULL && o->lazy == x->lazy
                   && o->lazy_fmt.size == x->lazy_fmt.size
                   && o->lazy_fmt.kind == x->lazy_fmt.kind;
        if (keep && !have_side) {
            if (side_view(self, sv) < 0)
                return -1;
            have_side = 1;
        }
        if (keep && !lazy_overlaps(self, o, cells, per, sv)
            && !lazy_overlaps(self, x, cells, per, sv)) {
            lz[q] = (Lazy){o->lazy, o->lazy_fmt, per, {o->lazy_cs, x->lazy_cs}};
            continue;
        }
        if (src_settle(f, o, cells) < 0 || src_settle(f, x, cells) < 0) {
            err = 1;
            break;
        }
    }
    if (have_side)
        release_sides(self, sv);
    return err ? -1 : 0;
}

/* The write of one call: vals[0..nf) every field's value in field order, nv[0..nob) each
 * obs field's next observations. Returns the steps written (>= 1), 0 when the call is
 * not for this path (nothing written), -1 on error. */
static Py_ssize_t
write_values(Appender *self, PyObject *lanes_arg, int mode, PyObject *const *vals,
             PyObject *const *nv)
{
    const int nf = self->nf, nob = self->nob;
    const Py_ssize_t L = self->L;
    int64_t lanes_s[STACK_ITEMS];
    int64_t *lanes = L > STACK_ITEMS ? PyMem_Malloc((size_t)L * sizeof(int64_t)) : lanes_s;
    if (lanes == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t result = 0, m = 0, n = 1;
    int all_lanes = 0, taken = 0;
    PyObject *v0 = vals[0], *conv0 = NULL;
    Src s[MAXFIELDS + MAXOBS];
    int r = parse_lanes(self, lanes_arg, lanes, &m, &all_lanes);
    if (r <= 0) {
        result = r;
        goto done;
    }
    const int explicit_lanes = lanes_arg != Py_None || L > 1;
    const Field *f0 = &self->f[0];
    Py_ssize_t lead[2];
    int nlead;
    if (mode == MODE_ADD) {
        lead[0] = m;
        nlead = explicit_lanes ? 1 : 0;
        r = take_value(self, f0, v0, lead, nlead, &s[0], 1);
        if (r == 0 && !explicit_lanes) { /* one env may come with its lane dim of 1 */
            nlead = 1;
            r = take_value(self, f0, v0, lead, nlead, &s[0], 1);
        }
    } else {
        int nd;
        Py_ssize_t dims[2];
        if (!probe_value(self, v0, &nd, dims, &conv0))
            goto done;
        if (conv0 != NULL)
            v0 = conv0;
        n = dims[0];
        lead[0] = n;
        lead[1] = m;
        nlead = mode == MODE_ARRAYS || explicit_lanes || nd == f0->ndim + 2 ? 2 : 1;
        if (n < 1)
            goto done;
        r = take_value(self, f0, v0, lead, nlead, &s[0], 1);
    }
    if (r <= 0) {
        result = r;
        goto done;
    }
    taken = 1;
    for (int i = 1; i < nf + nob; i++) {
        const Field *f = &self->f[i < nf ? i : self->oi[i - nf]];
        r = take_value(self, f, i < nf ? vals[i] : nv[i - nf], lead, nlead, &s[i], 1);
        if (r <= 0) {
            result = r;
            goto done;
        }
        taken = i + 1;
    }
    Lazy lz_s[MAXOBS];
    const Lazy *lz = NO_LAZY;
    for (int q = 0; q < nob; q++) {
        if (s[self->oi[q]].lazy != NULL || s[nf + q].lazy != NULL) {
            if (lazy_pairs(self, s, n * m, lz_s) < 0) {
                result = -1;
                goto done;
            }
            lz = lz_s;
            break;
        }
    }
    char *src[MAXFIELDS];
    const char *nsrc[MAXOBS];
    for (int i = 0; i < nf; i++)
        src[i] = (char *)s[i].buf;
    for (int q = 0; q < nob; q++)
        nsrc[q] = s[nf + q].buf;
    result = commit(self, lanes, m, all_lanes, n, src, nsrc, lz) < 0 ? -1 : n;
done:
    for (int i = 0; i < taken; i++)
        src_release(&s[i]);
    Py_XDECREF(conv0);
    if (L > STACK_ITEMS)
        PyMem_Free(lanes);
    return result;
}

/* The values of the plain dict d under keys[0..nk), as new references in out[0..nk)
 * (release them with drop_refs). 1: d's keys are exactly these; 0: not (an unknown or
 * missing key, or not a dict: the Python boundary names it). The lookups come first in a
 * call, before any table state is read: a key object of the caller's with a colliding
 * hash may run Python code in its __eq__. */
static int
get_keys(PyObject *d, PyObject *const *keys, Py_ssize_t nk, PyObject **out)
{
    if (!PyDict_CheckExact(d) || PyDict_GET_SIZE(d) != nk)
        return 0;
    for (Py_ssize_t i = 0; i < nk; i++) {
        PyObject *v = PyDict_GetItemWithError(d, keys[i]);
        if (v == NULL) {
            PyErr_Clear(); /* missing, or a key's __eq__ raised: the Python boundary */
            while (i > 0)
                Py_DECREF(out[--i]);
            return 0;
        }
        Py_INCREF(v);
        out[i] = v;
    }
    if (PyDict_GET_SIZE(d) != nk) { /* changed under the lookups */
        for (Py_ssize_t i = 0; i < nk; i++)
            Py_DECREF(out[i]);
        return 0;
    }
    return 1;
}

static void
drop_refs(PyObject **refs, Py_ssize_t k)
{
    for (Py_ssize_t i = 0; i < k; i++)
        Py_DECREF(refs[i]);
}

/* A standard call's values, args = (obs, action, reward, next_obs, terminated, truncated,
 * extras): every field's value in field order into vals[0..nf) (new references), each
 * obs field's next observation into nv[0..nob) (new references): release them with
 * release_call. 1: found; 0: not for this path (a rows table, or extras / obs of other
 * keys). */
static int
call_values(Appender *self, PyObject *const *args, PyObject **vals, PyObject **nv)
{
    if (self->rows || !get_keys(args[6], self->xkey, self->nx, vals + NSTD))
        return 0;
    PyObject *ov[MAXOBS];
    if (self->okey[0] == NULL) {
        ov[0] = args[0];
        nv[0] = args[3];
        Py_INCREF(ov[0]);
        Py_INCREF(nv[0]);
    } else if (!get_keys(args[0], self->okey, self->nob, ov)) {
        drop_refs(vals + NSTD, self->nx);
        return 0;
    } else if (!get_keys(args[3], self->okey, self->nob, nv)) {
        drop_refs(ov, self->nob);
        drop_refs(vals + NSTD, self->nx);
        return 0;
    }
    for (int p = 0; p < self->nob; p++)
        vals[self->oi[p]] = ov[p];
    const int std[4] = {1, 2, 4, 5}; /* action, reward, terminated, truncated */
    for (int i = 0; i < 4; i++) {
        vals[i + 1] = args[std[i]];
        Py_INCREF(vals[i + 1]);
    }
    return 1;
}

static void
release_call(Appender *self, PyObject **vals, PyObject **nv)
{
    drop_refs(vals, NSTD + self->nx + (self->nob > 1 ? self->nob - 1 : 0));
    drop_refs(nv, self->nob);
}

/* write(lanes, steps, obs, action, reward, next_obs, terminated, truncated, extras) */
static PyObject *
Appender_write_body(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "write(lanes, steps, obs, action, reward, next_obs, "
                                         "terminated, truncated, extras)");
        return NULL;
    }
    int steps = PyObject_IsTrue(args[1]);
    if (steps < 0)
        return NULL;
    PyObject *vals[MAXFIELDS], *nv[MAXOBS];
    if (!call_values(self, args + 2, vals, nv))
        return PyLong_FromLong(0);
    Py_ssize_t r = write_values(self, args[0], steps ? MODE_EXTEND : MODE_ADD, vals, nv);
    release_call(self, vals, nv);
    return r < 0 ? NULL : PyLong_FromSsize_t(r);
}

/* write_fields(lanes, mode, values, nexts) */
static PyObject *
Appender_write_fields_body(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "write_fields(lanes, mode, values, nexts)");
        return NULL;
    }
    long mode = PyLong_AsLong(args[1]);
    if (mode == -1 && PyErr_Occurred())
        return NULL;
    PyObject *values = args[2], *nexts = args[3];
    if (mode < MODE_ADD || mode > MODE_ARRAYS || !PyTuple_CheckExact(values)
        || !PyTuple_CheckExact(nexts)) {
        PyErr_SetString(PyExc_TypeError, "write_fields: mode 0, 1 or 2; values and nexts tuples");
        return NULL;
    }
    if (PyTuple_GET_SIZE(values) != self->nf || PyTuple_GET_SIZE(nexts) != self->nob)
        return PyLong_FromLong(0);
    Py_ssize_t r = write_values(self, args[0], (int)mode, PySequence_Fast_ITEMS(values),
                                PySequence_Fast_ITEMS(nexts));
    return r < 0 ? NULL : PyLong_FromSsize_t(r);
}

/* ------------------------------------------------------------------ the planner, as a
 * function: plan_write(T, lanes, lane_ids, written, counts, n) -> dict, for the
 * differential test against replaybank/storage/writers/plan.py. */
static int
int64_items(PyObject *seq, int64_t *out, Py_ssize_t size)
{
    PyObject *fast = PySequence_Fast(seq, "plan_write: a sequence of ints");
    if (fast == NULL)
        return -1;
    int ok = PySequence_Fast_GET_SIZE(fast) == size;
    for (Py_ssize_t i = 0; ok && i < size; i++) {
        out[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
        if (out[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
    }
    Py_DECREF(fast);
    if (!ok)
        PyErr_SetString(PyExc_ValueError, "plan_write: written and counts hold one int per lane");
    return ok ? 0 : -1;
}

static PyObject *
int_list(const int64_t *x, Py_ssize_t k)
{
    PyObject *l = PyList_New(k);
    for (Py_ssize_t i = 0; l != NULL && i < k; i++) {
        PyObject *v = PyLong_FromLongLong(x[i]);
        if (v == NULL) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, i, v);
    }
    return l;
}

COLD static PyObject *
lane_plan_write(PyObject *mod, PyObject *args)
{
    (void)mod;
    Py_ssize_t T, L, n;
    PyObject *ids, *wseq, *cseq;
    if (!PyArg_ParseTuple(args, "nnOOOn", &T, &L, &ids, &wseq, &cseq, &n))
        return NULL;
    if (T < 1 || L < 1 || n < 0 || L > 4096) {
        PyErr_SetString(PyExc_ValueError, "plan_write: T >= 1, 1 <= lanes <= 4096, n >= 0");
        return NULL;
    }
    PyObject *fast = PySequence_Fast(ids, "plan_write: lane_ids");
    if (fast == NULL)
        return NULL;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(fast);
    Py_DECREF(fast);
    int64_t *buf = PyMem_Malloc((size_t)(m + 2 * L + 4 * m + 1) * sizeof(int64_t));
    if (buf == NULL)
        return PyErr_NoMemory();
    int64_t *lanes = buf, *written = buf + m, *counts = buf + m + L, *scratch = buf + m + 2 * L;
    PyObject *out = NULL, *rows = NULL, *evicted = NULL, *prev_pos = NULL, *prev_rows = NULL;
    if (int64_items(ids, lanes, m) < 0 || int64_items(wseq, written, L) < 0
        || int64_items(cseq, counts, L) < 0)
        goto done;
    int all_lanes = m == L;
    for (Py_ssize_t j = 0; j < m; j++) {
        if (lanes[j] < 0 || lanes[j] >= L) {
            PyErr_SetString(PyExc_ValueError, "plan_write: lane ids in [0, lanes)");
            goto done;
        }
        all_lanes = all_lanes && lanes[j] == j;
    }
    Plan p;
    plan_write(&p, T, L, lanes, m, all_lanes, written, counts, n, scratch);
    rows = PyList_New(p.nk);
    evicted = p.any_evict ? PyList_New(p.nk) : Py_NewRef(Py_None);
    prev_pos = PyList_New(0);
    prev_rows = PyList_New(0);
    if (rows == NULL || evicted == NULL || prev_pos == NULL || prev_rows == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < p.nk; i++) {
        PyObject *r = PyList_New(m), *e = p.any_evict ? PyList_New(m) : NULL;
        if (r == NULL || (p.any_evict && e == NULL)) {
            Py_XDECREF(r);
            Py_XDECREF(e);
            goto done;
        }
        for (Py_ssize_t j = 0; j < m; j++) {
            PyList_SET_ITEM(r, j, PyLong_FromSsize_t(plan_row(&p, i, j)));
            if (e != NULL)
                PyList_SET_ITEM(e, j, PyBool_FromLong(plan_evicted(&p, i, j)));
        }
        PyList_SET_ITEM(rows, i, r);
        if (e != NULL)
            PyList_SET_ITEM(evicted, i, e);
    }
    for (Py_ssize_t j = 0; j < m; j++) {
        if (!plan_prev(&p, j))
            continue;
        PyObject *a = PyLong_FromSsize_t(j), *b = PyLong_FromSsize_t(plan_prev_row(&p, j));
        int bad = a == NULL || b == NULL || PyList_Append(prev_pos, a) < 0
                  || PyList_Append(prev_rows, b) < 0;
        Py_XDECREF(a);
        Py_XDECREF(b);
        if (bad)
            goto done;
    }
    for (Py_ssize_t j = 0; j < m; j++)
        p.s0[j] += n; /* new_written, reusing the scratch */
    out = Py_BuildValue("{s:n,s:n,s:O,s:O,s:N,s:N,s:N,s:O,s:O,s:O,s:O}", "skip", p.skip,
                        "kept", p.nk, "in_step", p.in_step ? Py_True : Py_False,
                        "all_lanes", p.all_lanes ? Py_True : Py_False,
                        "kept_old", int_list(p.kept, m), "new_counts", int_list(p.ncount, m),
                        "new_written", int_list(p.s0, m), "rows", rows, "evicted", evicted,
                        "prev_pos", prev_pos, "prev_rows", prev_rows);
done:
    Py_XDECREF(rows);
    Py_XDECREF(evicted);
    Py_XDECREF(prev_pos);
    Py_XDECREF(prev_rows);
    PyMem_Free(buf);
    return out;
}

/* ------------------------------------------------------------------ type */
static void
Appender_dealloc(Appender *self)
{
    for (int i = 0; i < self->nf; i++) {
        PyBuffer_Release(&self->f[i].store);
        Py_XDECREF(self->f[i].name);
    }
    Py_buffer *mv[4] = {&self->link, &self->written, &self->counts, &self->episodes};
    for (int i = 0; i < self->nmeta; i++)
        PyBuffer_Release(mv[i]);
    if (self->has_start)
        PyBuffer_Release(&self->start);
    Py_XDECREF(self->table);
    Py_XDECREF(self->ndarray_type);
    Py_XDECREF(self->generic_type);
    Py_XDECREF(self->host);
    Py_XDECREF(self->guard);
    for (int p = 0; p < MAXOBS; p++) {
        Py_XDECREF(self->okey[p]);
        Py_XDECREF(self->oside[p]);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
get_store(PyObject *arr, Py_buffer *view)
{
    if (PyObject_GetBuffer(arr, view, PyBUF_RECORDS) < 0)
        return -1;
    if (!PyBuffer_IsContiguous(view, 'C')) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "Appender: storage arrays must be C-contiguous");
        return -1;
    }
    return 0;
}

/* One field's storage: fspec = (flat_store, item_shape) or (flat_store, item_shape, name)
 * for an extra field. 0 ok, -1 error. */
static int
init_field(Appender *self, Field *f, PyObject *fspec, int extra)
{
    PyObject *store, *shape, *name = NULL;
    if (!PyTuple_Check(fspec)) {
        PyErr_SetString(PyExc_TypeError, "Appender: each field is a tuple");
        return -1;
    }
    if (!PyArg_ParseTuple(fspec, "OO|O", &store, &shape, &name))
        return -1;
    if (extra != (name != NULL) || (name != NULL && !PyUnicode_CheckExact(name))) {
        PyErr_SetString(PyExc_ValueError, "Appender: extra fields (and only they) end with "
                                          "their name, a str");
        return -1;
    }
    if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) > MAXDIM) {
        PyErr_SetString(PyExc_ValueError, "Appender: item shape: a tuple of at most 8 dims");
        return -1;
    }
    if (get_store(store, &f->store) < 0)
        return -1;
    self->nf++;
    if (name != NULL) {
        Py_INCREF(name);
        PyUnicode_InternInPlace(&name);
        f->name = name;
    }
    const char *fmt = f->store.format ? f->store.format : "B";
    if (strlen(fmt) >= sizeof(f->fmt)) {
        PyErr_SetString(PyExc_ValueError, "Appender: unsupported storage format");
        return -1;
    }
    strcpy(f->fmt, fmt);
    f->itemsize = f->store.itemsize;
    f->num = parse_format(fmt, f->itemsize);
    f->dk = f->num.swap || f->num.kind == 'x' ? 0 : f->num.kind;
    f->ndim = (int)PyTuple_GET_SIZE(shape);
    f->nbytes = f->itemsize;
    for (int d = 0; d < f->ndim; d++) {
        f->shape[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
        if (f->shape[d] < 0 && PyErr_Occurred())
            return -1;
        if (f->shape[d] < 0 || (f->shape[d] && f->nbytes > f->store.len / f->shape[d])) {
            PyErr_SetString(PyExc_ValueError, "Appender: item shape does not fit the storage");
            return -1;
        }
        f->nbytes *= f->shape[d];
    }
    if (f->nbytes == 0) { /* nothing to copy, and no slot size to bound a link by */
        PyErr_SetString(PyExc_ValueError, "Appender: zero-size fields take the Python writer");
        return -1;
    }
    if (f->dk == 'i' || f->dk == 'u') {
        int bits = 8 * (int)f->itemsize;
        if (f->dk == 'i') {
            f->hi = bits == 64 ? INT64_MAX : (int64_t)((1ULL << (bits - 1)) - 1);
            f->lo = -f->hi - 1;
            f->uhi = (uint64_t)f->hi;
            f->dlo = ldexp(-1.0, bits - 1);
            f->dhi1 = ldexp(1.0, bits - 1);
        } else {
            f->uhi = bits == 64 ? UINT64_MAX : (1ULL << bits) - 1;
            f->hi = bits == 64 ? INT64_MAX : (int64_t)f->uhi;
            f->lo = 0;
            f->dlo = 0.0;
            f->dhi1 = ldexp(1.0, bits);
        }
    }
    return 0;
}

/* Appender(side_store, ndarray, generic, host, fields, link, written, counts, episodes,
 *          lanes, durable=False, start=None, chunk=0, guard=None, obs_keys=None,
 *          rows=False)
 * fields: a tuple of (flat_store, item_shape) per field, in the order obs (a dict
 * observation: its first field), action, reward, terminated, truncated, then one
 * (flat_store, item_shape, name) per extra field (distinct str names: the keys of the
 * extras dict, which must then hold exactly these keys), then (a dict observation) one
 * (flat_store, item_shape) per further obs field; obs_keys: None (a flat obs: the side
 * store array "obs"), or one (key, side_array_name) str pair per obs field (distinct
 * keys: obs and next_obs must then be plain dicts with exactly these keys); host: None
 * or a callable turning another array object (a torch tensor) into an ndarray, or None;
 * link: flat int32 [T * lanes]; written, counts, episodes, start: int64 [lanes]; durable:
 * the crash-safe order; chunk: the most steps a durable write evicts in one chunk; guard:
 * the owning buffer's GuardState (writes refuse other threads' calls); rows: a rows table
 * (obs_keys None; the 5 "standard" fields are any 3 of its fields followed by terminated
 * and truncated, f[0] the one that shows the leading dims; no side data), written by
 * write_fields only. Zero-size fields are refused (the Python writer serves them). */
static int
Appender_init(Appender *self, PyObject *args, PyObject *kwds)
{
    PyObject *table, *nd, *gen, *host, *fields, *link, *written, *counts, *episodes;
    PyObject *start = Py_None, *guard = Py_None, *obs_keys = Py_None;
    Py_ssize_t lanes, chunk = 0;
    int durable = 0, rows = 0;
    (void)kwds;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOn|pOnOOp", &table, &nd, &gen, &host, &fields, &link,
                          &written, &counts, &episodes, &lanes, &durable, &start, &chunk,
                          &guard, &obs_keys, &rows))
        return -1;
    if (self->table != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Appender is initialised once");
        return -1;
    }
    if (rows && obs_keys != Py_None) {
        PyErr_SetString(PyExc_ValueError, "Appender: a rows table has no obs_keys");
        return -1;
    }
    if (guard != Py_None && !PyObject_TypeCheck(guard, &GuardStateType)) {
        PyErr_SetString(PyExc_TypeError, "Appender: guard must be a GuardState or None");
        return -1;
    }
    if (!PyType_Check(nd) || !PyType_Check(gen) || (host != Py_None && !PyCallable_Check(host))) {
        PyErr_SetString(PyExc_TypeError, "Appender: ndarray and generic are types, host a "
                                         "callable or None");
        return -1;
    }
    if (!PyTuple_Check(fields) || PyTuple_GET_SIZE(fields) < NSTD
        || PyTuple_GET_SIZE(fields) > MAXFIELDS || lanes < 1 || lanes > PY_SSIZE_T_MAX / 8) {
        PyErr_SetString(PyExc_ValueError, "Appender: fields: 5 standard field tuples, then "
                                          "at most 32 extra and 15 obs fields; lanes >= 1");
        return -1;
    }
    const int nfields = (int)PyTuple_GET_SIZE(fields);
    if (obs_keys != Py_None
        && (!PyTuple_Check(obs_keys) || PyTuple_GET_SIZE(obs_keys) < 1
            || PyTuple_GET_SIZE(obs_keys) > MAXOBS
            || nfields - NSTD - (PyTuple_GET_SIZE(obs_keys) - 1) < 0)) {
        PyErr_SetString(PyExc_ValueError, "Appender: obs_keys is None or 1 to 16 (key, side "
                                          "name) pairs, one field tuple each");
        return -1;
    }
    const int nob = rows ? 0 : obs_keys == Py_None ? 1 : (int)PyTuple_GET_SIZE(obs_keys);
    const int nx = nfields - NSTD - (nob > 1 ? nob - 1 : 0);
    if (nx > MAXEXTRA) {
        PyErr_SetString(PyExc_ValueError, "Appender: at most 32 extra fields");
        return -1;
    }
    Py_INCREF(table);
    self->table = table;
    self->nx = nx;
    self->rows = rows;
    self->nob = 0;
    if (!rows && obs_keys == Py_None) {
        Py_INCREF(s_obs);
        self->okey[0] = NULL;
        self->oside[0] = s_obs;
        self->nob = 1;
    }
    for (int p = 0; obs_keys != Py_None && p < nob; p++) {
        PyObject *pair = PyTuple_GET_ITEM(obs_keys, p), *key, *side;
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2
            || !PyUnicode_CheckExact(key = PyTuple_GET_ITEM(pair, 0))
            || !PyUnicode_CheckExact(side = PyTuple_GET_ITEM(pair, 1))) {
            PyErr_SetString(PyExc_ValueError, "Appender: obs_keys pairs are (str, str)");
            return -1;
        }
        for (int q = 0; q < p; q++) {
            if (PyUnicode_Compare(key, self->okey[q]) == 0) {
                PyErr_SetString(PyExc_ValueError, "Appender: obs keys must differ");
                return -1;
            }
        }
        Py_INCREF(key);
        Py_INCREF(side);
        PyUnicode_InternInPlace(&key);
        PyUnicode_InternInPlace(&side);
        self->okey[p] = key;
        self->oside[p] = side;
        self->nob = p + 1;
    }
    for (int p = 0; p < nob; p++)
        self->oi[p] = p == 0 ? 0 : NSTD + nx + p - 1;
    if (guard != Py_None) {
        Py_INCREF(guard);
        self->guard = (GuardState *)guard;
    }
    Py_INCREF(nd);
    self->ndarray_type = nd;
    Py_INCREF(gen);
    self->generic_type = gen;
    Py_INCREF(host);
    self->host = host;
    self->L = lanes;
    self->durable = durable;
    self->chunk = chunk > 0 ? chunk : 1;
    for (int i = 0; i < nfields; i++) {
        const int extra = i >= NSTD && i < NSTD + nx;
        if (init_field(self, &self->f[i], PyTuple_GET_ITEM(fields, i), extra) < 0)
            return -1;
        if (extra) {
            for (int j = NSTD; j < i; j++) {
                if (PyUnicode_Compare(self->f[i].name, self->f[j].name) == 0) {
                    PyErr_SetString(PyExc_ValueError, "Appender: extra field names must differ");
                    return -1;
                }
            }
            self->xkey[i - NSTD] = self->f[i].name;
        }
    }
    for (int i = 0; i < nfields; i++)
        self->f[i].is_obs = 0;
    for (int p = 0; p < self->nob && p < nob; p++)
        self->f[self->oi[p]].is_obs = 1;
    PyObject *ms[4] = {link, written, counts, episodes};
    Py_buffer *mv[4] = {&self->link, &self->written, &self->counts, &self->episodes};
    for (int i = 0; i < 4; i++) {
        if (get_store(ms[i], mv[i]) < 0)
            return -1;
        self->nmeta = i + 1;
        Py_ssize_t want = i == 0 ? 4 : 8;
        if (mv[i]->itemsize != want || (i > 0 && mv[i]->len != 8 * lanes)
            || (i == 0 && mv[i]->len % (4 * lanes))) {
            PyErr_SetString(PyExc_ValueError,
                            "Appender: link int32 [T * lanes], counters int64 [lanes]");
            return -1;
        }
    }
    if (start != Py_None) {
        if (get_store(start, &self->start) < 0)
            return -1;
        self->has_start = 1;
        if (self->start.itemsize != 8 || self->start.len != 8 * lanes) {
            PyErr_SetString(PyExc_ValueError, "Appender: start int64 [lanes]");
            return -1;
        }
    }
    self->T = self->link.len / 4 / lanes;
    if (self->T < 1) {
        PyErr_SetString(PyExc_ValueError, "Appender: link int32 [T * lanes] with T >= 1");
        return -1;
    }
    for (int i = 0; i < nfields; i++) {
        const Py_ssize_t items = self->T * lanes, len = self->f[i].store.len;
        if (len % items || len / items != self->f[i].nbytes) {
            PyErr_SetString(PyExc_ValueError, "Appender: field storage is not [T * lanes, *shape]");
            return -1;
        }
    }
    if (self->f[3].nbytes != 1 || self->f[4].nbytes != 1 || self->f[3].dk != 'b'
        || self->f[4].dk != 'b') {
        PyErr_SetString(PyExc_ValueError, "Appender: terminated/truncated must be bool scalars");
        return -1;
    }
    self->ready = 1;
    return 0;
}

#ifdef REPLAYBANK_KILLPOINTS
static PyObject *
lane_store_point(PyObject *mod, PyObject *noargs)
{
    (void)mod;
    (void)noargs;
    store_point();
    Py_RETURN_NONE;
}

static PyObject *
lane_kill_at(PyObject *mod, PyObject *noargs)
{
    (void)mod;
    (void)noargs;
    return PyLong_FromLongLong(kill_at);
}

static PyObject *
lane_arm(PyObject *mod, PyObject *arg)
{
    (void)mod;
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    kill_at = n > 0 ? n : 0;
    stores_done = 0;
    Py_RETURN_NONE;
}
#endif

static PyMethodDef lane_functions[] = {
    {"plan_write", lane_plan_write, METH_VARARGS,
     "plan_write(T, lanes, lane_ids, written, counts, n) -> dict: the compiled planner's "
     "decisions (the fields of replaybank.storage.writers.plan.WritePlan)"},
#ifdef REPLAYBANK_KILLPOINTS
    {"arm", lane_arm, METH_O, "Test hook: kill before the n-th durable store from now (0: off)."},
    {"store_point", lane_store_point, METH_NOARGS,
     "Test hook: count one durable store (REPLAYBANK_KILL_AT kills before the n-th)."},
    {"kill_at", lane_kill_at, METH_NOARGS, "REPLAYBANK_KILL_AT as read at import (0: unset)."},
#endif
    {NULL, NULL, 0, NULL},
};

/* the methods as Python calls them: the guard first (see GuardState) */
#define GUARDED(name)                                                              \
    static PyObject *name(Appender *self, PyObject *const *args, Py_ssize_t nargs) \
    {                                                                              \
        if (!self->ready) {                                                        \
            PyErr_SetString(PyExc_RuntimeError, "Appender is not initialised");    \
            return NULL;                                                           \
        }                                                                          \
        int g = guard_enter(self->guard);                                          \
        if (g < 0)                                                                 \
            return PyLong_FromLong(0);                                             \
        PyObject *r = name##_body(self, args, nargs);                              \
        if (g > 0)                                                                 \
            self->guard->busy = 0;                                                 \
        return r;                                                                  \
    }
GUARDED(Appender_write)
GUARDED(Appender_write_fields)

static PyMethodDef Appender_methods[] = {
    {"write", (PyCFunction)(void (*)(void))Appender_write, METH_FASTCALL,
     "write(lanes, steps, obs, action, reward, next_obs, terminated, truncated, extras) -> "
     "int: the steps written, 0 when the Python boundary must take the call"},
    {"write_fields", (PyCFunction)(void (*)(void))Appender_write_fields, METH_FASTCALL,
     "write_fields(lanes, mode, values, nexts) -> int: values in field order, nexts per obs "
     "field; mode 0 add, 1 extend, 2 arrays [n, m, ...]"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject AppenderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "replaybank." MODULE_NAME ".Appender",
    .tp_doc = "The compiled writer of one host step table (see replaybank/_lane.c).",
    .tp_basicsize = sizeof(Appender),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Appender_init,
    .tp_dealloc = (destructor)Appender_dealloc,
    .tp_methods = Appender_methods,
};

static struct PyModuleDef lanemodule = {
    PyModuleDef_HEAD_INIT, MODULE_NAME, "The compiled writer of host step tables.", -1,
    lane_functions, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
MODULE_INIT(void)
{
#ifdef REPLAYBANK_KILLPOINTS
    const char *kill = getenv("REPLAYBANK_KILL_AT");
    kill_at = kill != NULL ? strtoll(kill, NULL, 10) : 0;
    if (kill_at < 0)
        kill_at = 0;
#endif
#if HAVE_WIDE
    __builtin_cpu_init();
    have_avx2 = __builtin_cpu_supports("avx2");
#endif
    s_free = PyUnicode_InternFromString("free");
    s_side = PyUnicode_InternFromString("arrays");
    s_obs = PyUnicode_InternFromString("obs");
    s_alloc = PyUnicode_InternFromString("alloc");
    if (!s_free || !s_side || !s_obs || !s_alloc)
        return NULL;
    if (PyType_Ready(&AppenderType) < 0 || PyType_Ready(&GuardStateType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&lanemodule);
    if (m == NULL)
        return NULL;
#ifdef REPLAYBANK_KILLPOINTS
    const int killpoints = 1;
#else
    const int killpoints = 0;
#endif
    if (PyModule_AddObjectRef(m, "Appender", (PyObject *)&AppenderType) < 0
        || PyModule_AddObjectRef(m, "GuardState", (PyObject *)&GuardStateType) < 0
        || PyModule_AddObjectRef(m, "KILLPOINTS", killpoints ? Py_True : Py_False) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
