/* The compiled window plans and row gathers of window batches: replaybank._windows.
 *
 * A sequence batch is a few gathers of whole rows (every field of every step of B
 * windows) and a frame-stack batch is one more; numpy's ndarray.take copies one field per
 * call. take_rows copies the rows of every field of a batch in one call, with the rows a
 * few steps ahead prefetched, so the cache and TLB misses of consecutive rows (one page
 * apart in a multi-lane table) overlap.
 *
 *   take_rows(jobs)   jobs: a tuple of (src, idx, out) triples and (src, idx, out, next)
 *                     window pairs; for a triple, out[i] = src[idx[i]] (rows of src
 *                     along its first axis); for a pair, idx is [B, W + 1] and
 *                     out[b, j] = src[idx[b, j]], next[b, j] = src[idx[b, j + 1]]
 *                     (j < W): the obs and next_obs windows of one gather, each row read
 *                     once and stored twice
 *   take_steps(...)   the same for a batch of one-step transitions: every field and each
 *                     observation's next observation (the next step's row, or the side
 *                     store's where the link says so) in one call
 *
 * Which rows: the plans of the numba kernels in replaybank/ops/windows_numba.py and
 * stack_numba.py, as loops in C (one call per batch, no JIT to load or compile):
 *
 *   draw, plan, draw_plan   uniform draws -> checked window starts; slots, flags and side
 *                           patches of windows; both in one call
 *   draw_take               draw_plan, then the rows of every field of its windows
 *   extent, window_plan     window extents; slots, links and flags of a window gather
 *   sync                    the lane-major boundary bytes the scans read
 *   stack                   frame-stack slots
 *
 * Their numpy oracles are in replaybank/ops/windows.py (take_rows, take_steps,
 * window_extent, window_plan, stack_slots, and the compositions named in
 * windows_numba.py); the tests compare them on random cases. replaybank/ops/windows_c.py is the module that
 * replaybank.ops.jit.pick_kernel loads and that wraps these functions with the numba
 * module's signatures; callers never reach this module directly.
 *
 * Arrays come through the buffer protocol (no numpy headers are needed to build). Every
 * argument is checked before any byte is written: dtypes, C-contiguity, lengths, each
 * lane's live range (0 <= counts <= min(written, T)), and every value used as an index
 * (keys >= 0, draws inside the live steps, gather indices in [0, len(src))); take_rows
 * also refuses object arrays and a wrong output size. A wrong call raises instead of
 * reading or writing out of bounds. The loops run without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_fastdiv.h"

#define MAXJOBS 64      /* fields per call (a batch has a handful) */
#define AHEAD 8         /* rows prefetched ahead of the copy */
#define PF_BYTES 256    /* bytes of each row prefetched (the hardware streams the rest) */
#define SMALL_AHEAD 16  /* one-number rows prefetched ahead of the copy */

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch((p), 0, 3)
#else
#define PREFETCH(p) ((void)0)
#endif

typedef struct {
    Py_buffer src, idx, out, out2;
    int held;            /* bit 0 src, 1 idx, 2 out, 3 out2 */
    const char *s;
    const int64_t *ix;
    char *o;
    char *o2;            /* a window pair's next rows, else NULL */
    Py_ssize_t w1;       /* a window pair's W + 1 */
    Py_ssize_t rows;     /* len(src) */
    Py_ssize_t row;      /* bytes per row */
    Py_ssize_t n;        /* len(idx) */
} Job;

static void
release(Job *jobs, Py_ssize_t n)
{
    for (Py_ssize_t j = 0; j < n; j++) {
        if (jobs[j].held & 1)
            PyBuffer_Release(&jobs[j].src);
        if (jobs[j].held & 2)
            PyBuffer_Release(&jobs[j].idx);
        if (jobs[j].held & 4)
            PyBuffer_Release(&jobs[j].out);
        if (jobs[j].held & 8)
            PyBuffer_Release(&jobs[j].out2);
        jobs[j].held = 0;
    }
}

static const char *
strip(const char *f)
{
    if (f == NULL)
        return "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    return f;
}

/* Open and check job j (the triple `t`): 0, or -1 with an exception set. */
static int
open_job(PyObject *t, Py_ssize_t j, Job *job)
{
    if (!PyTuple_Check(t) || (PyTuple_GET_SIZE(t) != 3 && PyTuple_GET_SIZE(t) != 4)) {
        PyErr_Format(PyExc_TypeError, "replaybank._windows.take_rows: job %zd must be a "
                     "(src, idx, out) or (src, idx, out, next) tuple", j);
        return -1;
    }
    int pair = PyTuple_GET_SIZE(t) == 4;
    PyObject *src = PyTuple_GET_ITEM(t, 0), *idx = PyTuple_GET_ITEM(t, 1),
             *out = PyTuple_GET_ITEM(t, 2);
    if (PyObject_GetBuffer(src, &job->src, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    job->held |= 1;
    if (PyObject_GetBuffer(idx, &job->idx, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    job->held |= 2;
    if (PyObject_GetBuffer(out, &job->out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        return -1;
    job->held |= 4;
    const char *sf = strip(job->src.format);
    if (job->src.ndim < 1 || strchr(sf, 'O') != NULL) {
        PyErr_Format(PyExc_TypeError, "replaybank._windows.take_rows: job %zd: src must "
                     "be an array of at least one dimension without objects", j);
        return -1;
    }
    const char *xf = strip(job->idx.format);
    if (job->idx.itemsize != 8 || !(xf[0] == 'q' || xf[0] == 'l') || xf[1] != 0) {
        PyErr_Format(PyExc_TypeError, "replaybank._windows.take_rows: job %zd: idx must "
                     "be a contiguous int64 array", j);
        return -1;
    }
    job->rows = job->src.shape[0];
    job->row = job->rows > 0 ? job->src.len / job->rows : 0;
    job->n = job->idx.len / 8;
    Py_ssize_t n_out = job->n;  /* rows each output holds */
    if (pair) {
        if (job->idx.ndim != 2 || job->idx.shape[1] < 2) {
            PyErr_Format(PyExc_ValueError, "replaybank._windows.take_rows: job %zd: a window "
                         "pair's idx must be [B, W + 1] with W >= 1", j);
            return -1;
        }
        job->w1 = job->idx.shape[1];
        n_out = job->idx.shape[0] * (job->w1 - 1);
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(t, 3), &job->out2,
                               PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
            return -1;
        job->held |= 8;
        if (job->out2.len != n_out * job->row) {
            PyErr_Format(PyExc_ValueError, "replaybank._windows.take_rows: job %zd: next "
                         "holds %zd bytes, %zd rows of %zd bytes need %zd", j,
                         job->out2.len, n_out, job->row, n_out * job->row);
            return -1;
        }
        job->o2 = (char *)job->out2.buf;
    }
    if (job->out.len != n_out * job->row) {
        PyErr_Format(PyExc_ValueError, "replaybank._windows.take_rows: job %zd: out holds "
                     "%zd bytes, %zd rows of %zd bytes need %zd", j, job->out.len, n_out,
                     job->row, n_out * job->row);
        return -1;
    }
    job->s = (const char *)job->src.buf;
    job->ix = (const int64_t *)job->idx.buf;
    job->o = (char *)job->out.buf;
    for (Py_ssize_t i = 0; i < job->n; i++) {
        int64_t v = job->ix[i];
        if (v < 0 || v >= job->rows) {
            PyErr_Format(PyExc_IndexError, "replaybank._windows.take_rows: job %zd: index "
                         "%lld is out of bounds for %zd rows", j, (long long)v, job->rows);
            return -1;
        }
    }
    return 0;
}

static void
prefetch_row(const char *p, Py_ssize_t row)
{
    Py_ssize_t end = row < PF_BYTES ? row : PF_BYTES;
    for (Py_ssize_t c = 0; c < end; c += 64)
        PREFETCH(p + c);
}

/* A window pair: each row of idx [B, W + 1] read once, stored as out[b, j] (j < W) and
 * next[b, j - 1] (j >= 1). */
static void
copy_pair(const Job *job)
{
    const char *s = job->s;
    const int64_t *ix = job->ix;
    Py_ssize_t n = job->n, row = job->row, w1 = job->w1, w = w1 - 1;
    Py_ssize_t head = n < AHEAD ? n : AHEAD;
    for (Py_ssize_t i = 0; i < head; i++)
        prefetch_row(s + ix[i] * row, row);
    for (Py_ssize_t b = 0, i = 0; i < n; b++) {
        char *o = job->o + b * w * row, *o2 = job->o2 + b * w * row;
        for (Py_ssize_t j = 0; j < w1; j++, i++) {
            if (i + AHEAD < n)
                prefetch_row(s + ix[i + AHEAD] * row, row);
            const char *r = s + ix[i] * row;
            if (j < w)
                memcpy(o + j * row, r, (size_t)row);
            if (j > 0)
                memcpy(o2 + (j - 1) * row, r, (size_t)row);
        }
    }
}

/* out[i] = src[ix[i]] for i < n, rows of `row` bytes: one-number rows with a typed load
 * and store, the row SMALL_AHEAD on prefetched (in a multi-lane table consecutive steps
 * of a window are a cache line or more apart); longer rows AHEAD on prefetched. */
static void
copy_rows(const char *s, const int64_t *ix, char *o, Py_ssize_t n, Py_ssize_t row)
{
    switch (row) {
    case 1:
        for (Py_ssize_t i = 0; i < n; i++) {
            if (i + SMALL_AHEAD < n)
                PREFETCH(s + ix[i + SMALL_AHEAD]);
            o[i] = s[ix[i]];
        }
        return;
    case 4:
        for (Py_ssize_t i = 0; i < n; i++) {
            if (i + SMALL_AHEAD < n)
                PREFETCH(s + 4 * ix[i + SMALL_AHEAD]);
            memcpy(o + 4 * i, s + 4 * ix[i], 4);
        }
        return;
    case 8:
        for (Py_ssize_t i = 0; i < n; i++) {
            if (i + SMALL_AHEAD < n)
                PREFETCH(s + 8 * ix[i + SMALL_AHEAD]);
            memcpy(o + 8 * i, s + 8 * ix[i], 8);
        }
        return;
    default:
        break;
    }
    Py_ssize_t head = n < AHEAD ? n : AHEAD;
    for (Py_ssize_t i = 0; i < head; i++)
        prefetch_row(s + ix[i] * row, row);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + AHEAD < n)
            prefetch_row(s + ix[i + AHEAD] * row, row);
        memcpy(o + i * row, s + ix[i] * row, (size_t)row);
    }
}

static void
copy_job(const Job *job)
{
    if (job->o2 != NULL)
        copy_pair(job);
    else
        copy_rows(job->s, job->ix, job->o, job->n, job->row);
}

static PyObject *
take_rows(PyObject *self, PyObject *arg)
{
    (void)self;
    if (!PyTuple_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "replaybank._windows.take_rows: jobs must be a "
                        "tuple of (src, idx, out) tuples");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(arg);
    if (n > MAXJOBS) {
        PyErr_Format(PyExc_ValueError, "replaybank._windows.take_rows: %zd jobs, at most "
                     "%d per call", n, MAXJOBS);
        return NULL;
    }
    Job jobs[MAXJOBS];
    memset(jobs, 0, sizeof(Job) * (size_t)(n > 0 ? n : 1));
    for (Py_ssize_t j = 0; j < n; j++) {
        if (open_job(PyTuple_GET_ITEM(arg, j), j, &jobs[j]) < 0) {
            release(jobs, j + 1);
            return NULL;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < n; j++)
        copy_job(&jobs[j]);
    Py_END_ALLOW_THREADS
    release(jobs, n);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ window and stack plans
 *
 * C twins of the numba kernels of replaybank/ops/windows_numba.py and stack_numba.py (the
 * loops are the same, line for line; the numpy oracles are in replaybank/ops/windows.py).
 * Every function takes its arrays through the buffer protocol and checks them all (dtype,
 * C-contiguity, lengths, and the values it indexes with) before it writes anything; the
 * loops then run without the GIL. Arguments are positional (METH_FASTCALL).
 */

enum { K_I32, K_I64, K_U8, K_BOOL };

#define MAXBUF 20

typedef struct {
    Py_buffer b[MAXBUF];
    int n;
    const char *fn;
} Bufs;

static void
bufs_release(Bufs *bs)
{
    for (int i = 0; i < bs->n; i++)
        PyBuffer_Release(&bs->b[i]);
    bs->n = 0;
}

static const char *kind_names[] = {"int32", "int64", "uint8", "bool"};

/* Open argument `o` (called `name`) as a C-contiguous array of kind `kind`; its data and
 * element count go to *data and *len. NULL data where `o` is None and `optional`. */
static int
open_arr(Bufs *bs, PyObject *o, const char *name, int kind, int writable, int optional,
         void **data, Py_ssize_t *len)
{
    if (o == Py_None && optional) {
        *data = NULL;
        *len = 0;
        return 0;
    }
    Py_buffer *v = &bs->b[bs->n];
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(o, v, flags) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "replaybank._windows.%s: %s must be a C-contiguous%s "
                     "%s array", bs->fn, name, writable ? " writable" : "", kind_names[kind]);
        return -1;
    }
    bs->n++;
    const char *f = strip(v->format);
    int ok;
    switch (kind) {
    case K_I32:
        ok = v->itemsize == 4 && (f[0] == 'i' || f[0] == 'l') && f[1] == 0;
        break;
    case K_I64:
        ok = v->itemsize == 8 && (f[0] == 'q' || f[0] == 'l') && f[1] == 0;
        break;
    case K_U8:
        ok = v->itemsize == 1 && f[0] == 'B' && f[1] == 0;
        break;
    default:
        ok = v->itemsize == 1 && f[0] == '?' && f[1] == 0;
        break;
    }
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "replaybank._windows.%s: %s must be a C-contiguous "
                     "%s array, not format '%s'", bs->fn, name, kind_names[kind], f);
        return -1;
    }
    *data = v->buf;
    *len = v->len / v->itemsize;
    return 0;
}

static int
get_int(PyObject *o, const char *fn, const char *name, long long lo, long long *out)
{
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < lo) {
        PyErr_Format(PyExc_ValueError, "replaybank._windows.%s: %s=%lld must be >= %lld",
                     fn, name, v, lo);
        return -1;
    }
    *out = v;
    return 0;
}

static int
nargs_ok(Py_ssize_t n, Py_ssize_t want, const char *fn)
{
    if (n != want) {
        PyErr_Format(PyExc_TypeError, "replaybank._windows.%s takes %zd arguments (%zd "
                     "given)", fn, want, n);
        return 0;
    }
    return 1;
}

static int
too_short(const char *fn, const char *name, Py_ssize_t have, Py_ssize_t need)
{
    PyErr_Format(PyExc_ValueError, "replaybank._windows.%s: %s holds %zd values, %zd needed",
                 fn, name, have, need);
    return -1;
}

/* The step table: link [T, lanes] int32 (its shape from the buffer), optional boundary
 * bytes [lanes, T], written and counts [lanes] int64. Checks that every lane's live
 * range [written - counts, written) is sane, so that no loop indexes out of bounds. */
typedef struct {
    const int32_t *link;
    const uint8_t *bounds;
    const int64_t *written, *counts;
    int64_t T, lanes;
} Table;

#define WMAX ((int64_t)1 << 60)

static int
open_table(Bufs *bs, PyObject *link, PyObject *bounds, PyObject *written, PyObject *counts,
           Table *t)
{
    void *p;
    Py_ssize_t n;
    if (open_arr(bs, link, "link", K_I32, 0, 0, &p, &n) < 0)
        return -1;
    t->link = p;
    Py_buffer *v = &bs->b[bs->n - 1];
    if (v->ndim != 2 || v->shape[0] < 1 || v->shape[1] < 1) {
        PyErr_Format(PyExc_ValueError, "replaybank._windows.%s: link must be [T, lanes] "
                     "with T, lanes >= 1", bs->fn);
        return -1;
    }
    t->T = v->shape[0];
    t->lanes = v->shape[1];
    if (open_arr(bs, bounds, "bounds", K_U8, 0, 1, &p, &n) < 0)
        return -1;
    t->bounds = p;
    if (p != NULL && n != t->T * t->lanes)
        return too_short(bs->fn, "bounds", n, t->T * t->lanes);
    if (open_arr(bs, written, "written", K_I64, 0, 0, &p, &n) < 0)
        return -1;
    t->written = p;
    if (n != t->lanes)
        return too_short(bs->fn, "written", n, t->lanes);
    if (open_arr(bs, counts, "counts", K_I64, 0, 0, &p, &n) < 0)
        return -1;
    t->counts = p;
    if (n != t->lanes)
        return too_short(bs->fn, "counts", n, t->lanes);
    for (int64_t l = 0; l < t->lanes; l++) {
        int64_t w = t->written[l], c = t->counts[l];
        if (w < 0 || w > WMAX / t->lanes || c < 0 || c > t->T || c > w) {
            PyErr_Format(PyExc_ValueError, "replaybank._windows.%s: lane %lld has written="
                         "%lld, counts=%lld; need 0 <= counts <= min(written, T=%lld)",
                         bs->fn, (long long)l, (long long)w, (long long)c,
                         (long long)t->T);
            return -1;
        }
    }
    return 0;
}

/* Whether step `row` of lane `lane` keeps its next observation aside (link != 0). */
static inline int
cut_at(const Table *t, int64_t lane, int64_t row)
{
    return t->bounds ? t->bounds[lane * t->T + row] != 0
                     : t->link[row * t->lanes + lane] != 0;
}

/* Index of the first nonzero byte of p[0, n), or n: eight bytes per test (most windows
 * hold no boundary, so their scan is a few word loads). */
static inline int64_t
first_set(const uint8_t *p, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, sizeof w);
        if (w)
            break;
    }
    for (; i < n; i++)
        if (p[i])
            return i;
    return n;
}

/* The first j in [0, n) whose step (row + j) % T of `lane` keeps its next observation
 * aside (cut_at), or n (n <= T; n <= 0 gives n). */
static inline int64_t
first_cut(const Table *t, int64_t lane, int64_t row, int64_t n)
{
    if (n <= 0)
        return n;
    if (t->bounds) {  /* the lane's bytes are contiguous: two word scans around the wrap */
        const uint8_t *b = t->bounds + lane * t->T;
        int64_t head = t->T - row < n ? t->T - row : n;
        int64_t j = first_set(b + row, head);
        return j < head || head == n ? j : head + first_set(b, n - head);
    }
    for (int64_t j = 0; j < n; j++) {
        if (cut_at(t, lane, row))
            return j;
        if (++row == t->T)
            row = 0;
    }
    return n;
}

static int
check_keys(const char *fn, const int64_t *keys, Py_ssize_t n, const Table *t)
{
    int64_t hi = WMAX;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (keys[i] < 0 || keys[i] >= hi) {
            PyErr_Format(PyExc_ValueError, "replaybank._windows.%s: key %lld is out of "
                         "range", fn, (long long)keys[i]);
            return -1;
        }
    }
    (void)t;
    return 0;
}

/* ---- window extents (twin of windows_numba._extent) */
static void
extent_loop(const Table *t, const int64_t *keys, Py_ssize_t nb, int64_t width, int cross,
            int64_t *out)
{
    int64_t lanes = t->lanes, T = t->T;
    for (Py_ssize_t b = 0; b < nb; b++) {
        int64_t key = keys[b];
        if (key < 0) {
            out[b] = 0;
            continue;
        }
        int64_t seq = key / lanes, lane = key % lanes, hi = t->written[lane];
        if (seq < hi - t->counts[lane] || seq >= hi) {
            out[b] = 0;
            continue;
        }
        int64_t n = 1;
        while (n < width && seq + n < hi) {
            if (!cross && cut_at(t, lane, (seq + n - 1) % T))
                break;
            n++;
        }
        out[b] = n;
    }
}

static PyObject *
c_extent(PyObject *self, PyObject *const *a, Py_ssize_t na)
{
    /* extent(link, bounds, written, counts, keys, width, cross, out) */
    (void)self;
    Bufs bs = {.n = 0, .fn = "extent"};
    Table t;
    const int64_t *keys;
    int64_t *out;
    Py_ssize_t nk, no;
    long long width, cross;
    PyObject *r = NULL;
    if (!nargs_ok(na, 8, bs.fn))
        return NULL;
    if (open_table(&bs, a[0], a[1], a[2], a[3], &t) < 0
        || open_arr(&bs, a[4], "keys", K_I64, 0, 0, (void **)&keys, &nk) < 0
        || get_int(a[5], bs.fn, "width", 1, &width) < 0
        || get_int(a[6], bs.fn, "cross", 0, &cross) < 0
        || open_arr(&bs, a[7], "out", K_I64, 1, 0, (void **)&out, &no) < 0)
        goto done;
    if (no != nk) {
        too_short(bs.fn, "out", no, nk);
        goto done;
    }
    for (Py_ssize_t i = 0; i < nk; i++) {  /* negative keys give 0; huge ones would overflow */
        if (keys[i] >= WMAX) {
            check_keys(bs.fn, keys + i, 1, &t);
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    extent_loop(&t, keys, nk, width, cross != 0, out);
    Py_END_ALLOW_THREADS
    Py_INCREF(Py_None);
    r = Py_None;
done:
    bufs_release(&bs);
    return r;
}

/* ---- uniform draws -> checked window starts (twin of windows_numba._draw) */
static inline void
draw_one(const Table *t, int64_t p, int64_t width, int cross, int64_t *key, int64_t *ext)
{
    int64_t lane = 0, lanes = t->lanes, T = t->T;
    while (p >= t->counts[lane]) {
        p -= t->counts[lane];
        lane++;
    }
    int64_t hi = t->written[lane];
    int64_t seq = hi - t->counts[lane] + p;
    int64_t n = hi - seq < width ? hi - seq : width;
    if (!cross) {  /* the window ends at its first cut (a step of the window's last
                    * n - 1 that keeps its next observation aside ends it there) */
        int64_t j = first_cut(t, lane, seq % T, n - 1);
        if (j < n - 1)
            n = j + 1;
    }
    *key = seq * lanes + lane;
    *ext = n;
}

static int64_t
draw_loop(const Table *t, const int64_t *flat, Py_ssize_t m, int64_t width, int cross,
          int64_t min_len, int64_t *keys, int64_t *ext, Py_ssize_t nb)
{
    int64_t n_ok = 0, k, e;
    if (!cross && t->bounds) {  /* every candidate's boundary bytes requested up front */
        for (Py_ssize_t i = 0; i < m; i++) {
            int64_t q = flat[i], lane = 0;
            while (q >= t->counts[lane]) {
                q -= t->counts[lane];
                lane++;
            }
            int64_t seq = t->written[lane] - t->counts[lane] + q;
            PREFETCH(t->bounds + lane * t->T + seq % t->T);
        }
    }
    for (Py_ssize_t i = 0; i < m; i++) {
        draw_one(t, flat[i], width, cross, &k, &e);
        if (e >= min_len) {
            keys[n_ok] = k;
            ext[n_ok] = e;
            if (++n_ok == nb)  /* enough: later draws are not needed (nor counted) */
                return n_ok;
        }
    }
    /* too few valid draws: valid ones first, then invalid ones, in draw order (the
     * invalid ones recomputed: the same deterministic loop) */
    int64_t j = n_ok;
    for (Py_ssize_t i = 0; i < m && j < nb; i++) {
        draw_one(t, flat[i], width, cross, &k, &e);
        if (e < min_len) {
            keys[j] = k;
            ext[j] = e;
            j++;
        }
    }
    return n_ok;
}

static int
check_flat(const char *fn, const Table *t, const int64_t *flat, Py_ssize_t m)
{
    int64_t size = 0;
    for (int64_t l = 0; l < t->lanes; l++)
        size += t->counts[l];
    for (Py_ssize_t i = 0; i < m; i++) {
        if (flat[i] < 0 || flat[i] >= size) {
            PyErr_Format(PyExc_ValueError, "replaybank._windows.%s: draw %lld is outside "
                         "[0, %lld) (the live steps)", fn, (long long)flat[i],
                         (long long)size);
            return -1;
        }
    }
    return 0;
}

/* ---- slots, flags and side patches of windows (twin of windows_numba._seq_plan) */
typedef struct {
    const uint8_t *term, *trunc;
    const int64_t *keys, *ext;
    Py_ssize_t nb;
    int64_t width, burn_in;
    int64_t *slots, *steps, *side;
    uint8_t *flags;
} Plan;

static void
or_rows(uint8_t *restrict out, const uint8_t *restrict a, const uint8_t *restrict b,
        int64_t n)
{
    for (int64_t j = 0; j < n; j++)
        out[j] = a[j] | b[j];
}

static void
plan_loop(const Table *t, const Plan *p, int64_t *n_side_out, int *tail_out)
{
    int64_t T = t->T, lanes = t->lanes, W = p->width, nb = p->nb, n_side = 0;
    int tail_only = 1;
    uint8_t *fl = p->flags;
    /* the first flag and boundary bytes of every window requested before any is read, so
     * that the windows' cache misses overlap instead of coming one window at a time */
    for (int64_t b = 0; b < nb; b++) {
        int64_t seq = p->keys[b] / lanes, lane = p->keys[b] - seq * lanes, row = seq % T;
        PREFETCH(p->term + row * lanes + lane);
        PREFETCH(p->trunc + row * lanes + lane);
        if (t->bounds)
            PREFETCH(t->bounds + lane * T + row);
    }
    for (int64_t b = 0; b < nb; b++) {
        int64_t seq = p->keys[b] / lanes, lane = p->keys[b] - seq * lanes;
        int64_t newest = t->written[lane] - 1;
        int64_t m = p->ext[b] < W ? p->ext[b] : W;
        int64_t prev = seq - 1;
        int f = prev < t->written[lane] - t->counts[lane] ? 1 : cut_at(t, lane, prev % T);
        int64_t row0 = seq % T;
        int64_t *sl = p->slots + b * (W + 1), *st = p->steps + b * W;
        uint8_t *first = fl + (0 * nb + b) * W, *last = fl + (1 * nb + b) * W;
        uint8_t *terminal = fl + (2 * nb + b) * W, *mask = fl + (3 * nb + b) * W;
        uint8_t *burn = fl + (4 * nb + b) * W, *tm = fl + (5 * nb + b) * W;
        uint8_t *tr = fl + (6 * nb + b) * W;
        if (row0 + W < T) {  /* no wrap: slots step by lanes */
            int64_t base = row0 * lanes + lane;
            for (int64_t j = 0; j <= W; j++)
                sl[j] = base + j * lanes;
        } else {
            int64_t row = row0;
            for (int64_t j = 0; j <= W; j++) {
                sl[j] = row * lanes + lane;
                if (++row == T)
                    row = 0;
            }
        }
        memcpy(st, sl, (size_t)W * sizeof(int64_t));
        /* the flag rows of numba's per-step loop, as row copies and fills */
        int64_t mm = m < 0 ? 0 : m, bi = p->burn_in < W ? p->burn_in : W;
        for (int64_t j = 0; j < mm; j++) {
            tm[j] = p->term[sl[j]] != 0;
            tr[j] = p->trunc[sl[j]] != 0;
        }
        memset(tm + mm, 0, (size_t)(W - mm));
        memset(tr + mm, 0, (size_t)(W - mm));
        memcpy(terminal, tm, (size_t)W);
        or_rows(last, tm, tr, W);
        memset(burn, 1, (size_t)bi);
        memset(burn + bi, 0, (size_t)(W - bi));
        memset(mask, 0, (size_t)W);  /* mask: burn_in <= j < m */
        if (mm > bi)
            memset(mask + bi, 1, (size_t)(mm - bi));
        memset(first, 0, (size_t)W);
        if (m > 0)
            first[0] = (uint8_t)f;
        /* each step whose next observation is kept aside, found by a word scan */
        for (int64_t j = first_cut(t, lane, row0, m); j < m;
             j += 1 + first_cut(t, lane, (row0 + j + 1) % T, m - j - 1)) {
            int64_t row = (row0 + j) % T;
            if (j + 1 < m)
                first[j + 1] = 1;
            if (seq + j != newest)
                last[j] = 1;
            int64_t *s = p->side + 3 * n_side;
            s[0] = b;
            s[1] = j;
            s[2] = (int64_t)t->link[row * lanes + lane] - 1;
            n_side++;
            if (j != W - 1)
                tail_only = 0;
        }
    }
    *n_side_out = n_side;
    *tail_out = tail_only;
}

/* Open the plan arguments a[0..] = term, trunc, (keys, ext: when `with_keys`), width,
 * burn_in, slots, steps, flags, side; the keys and extents of a draw are its outputs. */
static int
open_plan(Bufs *bs, PyObject *const *a, const Table *t, Py_ssize_t nb, Plan *p)
{
    Py_ssize_t n;
    long long width, burn_in;
    if (open_arr(bs, a[0], "term", K_BOOL, 0, 0, (void **)&p->term, &n) < 0)
        return -1;
    if (n != t->T * t->lanes)
        return too_short(bs->fn, "term", n, t->T * t->lanes);
    if (open_arr(bs, a[1], "trunc", K_BOOL, 0, 0, (void **)&p->trunc, &n) < 0)
        return -1;
    if (n != t->T * t->lanes)
        return too_short(bs->fn, "trunc", n, t->T * t->lanes);
    if (get_int(a[2], bs->fn, "width", 1, &width) < 0
        || get_int(a[3], bs->fn, "burn_in", 0, &burn_in) < 0)
        return -1;
    if (width > WMAX / (nb + 1) / 8) {
        PyErr_Format(PyExc_ValueError, "replaybank._windows.%s: width=%lld is too large",
                     bs->fn, width);
        return -1;
    }
    p->width = width;
    p->burn_in = burn_in;
    p->nb = nb;
    int64_t W = width;
    if (open_arr(bs, a[4], "slots", K_I64, 1, 0, (void **)&p->slots, &n) < 0)
        return -1;
    if (n != nb * (W + 1))
        return too_short(bs->fn, "slots", n, nb * (W + 1));
    if (open_arr(bs, a[5], "steps", K_I64, 1, 0, (void **)&p->steps, &n) < 0)
        return -1;
    if (n != nb * W)
        return too_short(bs->fn, "steps", n, nb * W);
    if (open_arr(bs, a[6], "flags", K_BOOL, 1, 0, (void **)&p->flags, &n) < 0)
        return -1;
    if (n != 7 * nb * W)
        return too_short(bs->fn, "flags", n, 7 * nb * W);
    if (open_arr(bs, a[7], "side", K_I64, 1, 0, (void **)&p->side, &n) < 0)
        return -1;
    if (n < 3 * nb * W)
        return too_short(bs->fn, "side", n, 3 * nb * W);
    return 0;
}

static PyObject *
c_plan(PyObject *self, PyObject *const *a, Py_ssize_t na)
{
    /* plan(link, bounds, written, counts, keys, ext, term, trunc, width, burn_in, slots,
     *      steps, flags, side) -> (n_side, tail_only) */
    (void)self;
    Bufs bs = {.n = 0, .fn = "plan"};
    Table t;
    Plan p;
    Py_ssize_t nk, ne;
    PyObject *r = NULL;
    if (!nargs_ok(na, 14, bs.fn))
        return NULL;
    if (open_table(&bs, a[0], a[1], a[2], a[3], &t) < 0
        || open_arr(&bs, a[4], "keys", K_I64, 0, 0, (void **)&p.keys, &nk) < 0
        || open_arr(&bs, a[5], "ext", K_I64, 0, 0, (void **)&p.ext, &ne) < 0)
        goto done;
    if (ne != nk) {
        too_short(bs.fn, "ext", ne, nk);
        goto done;
    }
    if (check_keys(bs.fn, p.keys, nk, &t) < 0 || open_plan(&bs, a + 6, &t, nk, &p) < 0)
        goto done;
    int64_t n_side;
    int tail;
    Py_BEGIN_ALLOW_THREADS
    plan_loop(&t, &p, &n_side, &tail);
    Py_END_ALLOW_THREADS
    r = Py_BuildValue("(LO)", (long long)n_side, tail ? Py_True : Py_False);
done:
    bufs_release(&bs);
    return r;
}

static PyObject *
c_draw(PyObject *self, PyObject *const *a, Py_ssize_t na)
{
    /* draw(link, bounds, written, counts, flat, width, cross, min_len, keys, ext) -> n_ok */
    (void)self;
    Bufs bs = {.n = 0, .fn = "draw"};
    Table t;
    const int64_t *flat;
    int64_t *keys, *ext;
    Py_ssize_t m, nk, ne;
    long long width, cross, min_len;
    PyObject *r = NULL;
    if (!nargs_ok(na, 10, bs.fn))
        return NULL;
    if (open_table(&bs, a[0], a[1], a[2], a[3], &t) < 0
        || open_arr(&bs, a[4], "flat", K_I64, 0, 0, (void **)&flat, &m) < 0
        || get_int(a[5], bs.fn, "width", 1, &width) < 0
        || get_int(a[6], bs.fn, "cross", 0, &cross) < 0
        || get_int(a[7], bs.fn, "min_len", 0, &min_len) < 0
        || open_arr(&bs, a[8], "keys", K_I64, 1, 0, (void **)&keys, &nk) < 0
        || open_arr(&bs, a[9], "ext", K_I64, 1, 0, (void **)&ext, &ne) < 0)
        goto done;
    if (ne != nk || m < nk) {
        too_short(bs.fn, ne != nk ? "ext" : "flat", ne != nk ? ne : m, nk);
        goto done;
    }
    if (check_flat(bs.fn, &t, flat, m) < 0)
        goto done;
    int64_t n_ok;
    Py_BEGIN_ALLOW_THREADS
    n_ok = draw_loop(&t, flat, m, width, cross != 0, min_len, keys, ext, nk);
    Py_END_ALLOW_THREADS
    r = PyLong_FromLongLong(n_ok);
done:
    bufs_release(&bs);
    return r;
}

/* Open draw_plan's arguments a[0..16] (link, bounds, written, counts, flat, cross,
 * min_len, keys, ext, then the plan's: see open_plan) into t, p (keys and ext set) and
 * the draws: 0, or -1 with an exception set. */
static int
open_draw_plan(Bufs *bs, PyObject *const *a, Table *t, Plan *p, const int64_t **flat,
               Py_ssize_t *m, long long *cross, long long *min_len)
{
    int64_t *keys, *ext;
    Py_ssize_t nk, ne;
    if (open_table(bs, a[0], a[1], a[2], a[3], t) < 0
        || open_arr(bs, a[4], "flat", K_I64, 0, 0, (void **)flat, m) < 0
        || get_int(a[5], bs->fn, "cross", 0, cross) < 0
        || get_int(a[6], bs->fn, "min_len", 0, min_len) < 0
        || open_arr(bs, a[7], "keys", K_I64, 1, 0, (void **)&keys, &nk) < 0
        || open_arr(bs, a[8], "ext", K_I64, 1, 0, (void **)&ext, &ne) < 0)
        return -1;
    if (ne != nk || *m < nk)
        return too_short(bs->fn, ne != nk ? "ext" : "flat", ne != nk ? ne : *m, nk);
    if (check_flat(bs->fn, t, *flat, *m) < 0 || open_plan(bs, a + 9, t, nk, p) < 0)
        return -1;
    p->keys = keys;
    p->ext = ext;
    return 0;
}

static PyObject *
c_draw_plan(PyObject *self, PyObject *const *a, Py_ssize_t na)
{
    /* draw_plan(link, bounds, written, counts, flat, cross, min_len, keys, ext, term,
     *           trunc, width, burn_in, slots, steps, flags, side)
     *   -> (n_ok, n_side, tail_only); n_side = -1 (no plan) when n_ok < len(keys) */
    (void)self;
    Bufs bs = {.n = 0, .fn = "draw_plan"};
    Table t;
    Plan p;
    const int64_t *flat;
    Py_ssize_t m;
    long long cross, min_len;
    PyObject *r = NULL;
    if (!nargs_ok(na, 17, bs.fn))
        return NULL;
    if (open_draw_plan(&bs, a, &t, &p, &flat, &m, &cross, &min_len) < 0)
        goto done;
    int64_t n_ok, n_side = -1;
    int tail = 0;
    Py_BEGIN_ALLOW_THREADS
    n_ok = draw_loop(&t, flat, m, p.width, cross != 0, min_len, (int64_t *)p.keys,
                     (int64_t *)p.ext, p.nb);
    if (n_ok == p.nb)
        plan_loop(&t, &p, &n_side, &tail);
    Py_END_ALLOW_THREADS
    r = Py_BuildValue("(LLO)", (long long)n_ok, (long long)n_side,
                      tail ? Py_True : Py_False);
done:
    bufs_release(&bs);
    return r;
}

/* ---- lane-major boundary bytes (twin of windows_numba._sync) */
static PyObject *
c_sync(PyObject *self, PyObject *const *a, Py_ssize_t na)
{
    /* sync(link, written, seen, bounds) */
    (void)self;
    Bufs bs = {.n = 0, .fn = "sync"};
    Table t;
    int64_t *seen;
    uint8_t *bounds;
    Py_ssize_t n;
    PyObject *r = NULL;
    if (!nargs_ok(na, 4, bs.fn))
        return NULL;
    /* written is checked as a lane count only: counts are not needed */
    void *p;
    if (open_arr(&bs, a[0], "link", K_I32, 0, 0, &p, &n) < 0)
        goto done;
    t.link = p;
    if (bs.b[0].ndim != 2 || bs.b[0].shape[0] < 1 || bs.b[0].shape[1] < 1) {
        PyErr_Format(PyExc_ValueError, "replaybank._windows.sync: link must be [T, lanes]");
        goto done;
    }
    t.T = bs.b[0].shape[0];
    t.lanes = bs.b[0].shape[1];
    if (open_arr(&bs, a[1], "written", K_I64, 0, 0, &p, &n) < 0)
        goto done;
    t.written = p;
    if (n != t.lanes) {
        too_short(bs.fn, "written", n, t.lanes);
        goto done;
    }
    if (open_arr(&bs, a[2], "seen", K_I64, 1, 0, (void **)&seen, &n) < 0)
        goto done;
    if (n != t.lanes) {
        too_short(bs.fn, "seen", n, t.lanes);
        goto done;
    }
    if (open_arr(&bs, a[3], "bounds", K_U8, 1, 0, (void **)&bounds, &n) < 0)
        goto done;
    if (n != t.T * t.lanes) {
        too_short(bs.fn, "bounds", n, t.T * t.lanes);
        goto done;
    }
    int64_t T = t.T, lanes = t.lanes;
    Py_BEGIN_ALLOW_THREADS
    for (int64_t lane = 0; lane < lanes; lane++) {
        int64_t w = t.written[lane], s = seen[lane];
        if (w == s)
            continue;
        uint8_t *bl = bounds + lane * T;
        if (w < s || w - s >= T - 1 || w < 0) {  /* unknown history, or most rewritten */
            for (int64_t r2 = 0; r2 < T; r2++)
                bl[r2] = t.link[r2 * lanes + lane] != 0;
        } else {  /* writes change links only in rows [s - 1, w) */
            for (int64_t q = s - 1 > 0 ? s - 1 : 0; q < w; q++) {
                int64_t r2 = q % T;
                bl[r2] = t.link[r2 * lanes + lane] != 0;
            }
        }
        seen[lane] = w;
    }
    Py_END_ALLOW_THREADS
    Py_INCREF(Py_None);
    r = Py_None;
done:
    bufs_release(&bs);
    return r;
}

/* ---- slots, links and flags of a window gather (twin of windows_numba._plan) */
static PyObject *
c_window_plan(PyObject *self, PyObject *const *a, Py_ssize_t na)
{
    /* window_plan(link, written, counts, keys, width, slots, lk, ends, first) */
    (void)self;
    Bufs bs = {.n = 0, .fn = "window_plan"};
    Table t;
    const int64_t *keys;
    int64_t *slots;
    int32_t *lk;
    uint8_t *ends, *first;
    Py_ssize_t nk, n;
    long long width;
    PyObject *r = NULL;
    if (!nargs_ok(na, 9, bs.fn))
        return NULL;
    if (open_table(&bs, a[0], Py_None, a[1], a[2], &t) < 0
        || open_arr(&bs, a[3], "keys", K_I64, 0, 0, (void **)&keys, &nk) < 0
        || get_int(a[4], bs.fn, "width", 1, &width) < 0)
        goto done;
    if (check_keys(bs.fn, keys, nk, &t) < 0)
        goto done;
    if (width > WMAX / (nk + 1) / 8) {
        PyErr_Format(PyExc_ValueError, "replaybank._windows.window_plan: width=%lld is too "
                     "large", width);
        goto done;
    }
    int64_t W = width;
    if (open_arr(&bs, a[5], "slots", K_I64, 1, 0, (void **)&slots, &n) < 0)
        goto done;
    if (n != nk * (W + 1)) {
        too_short(bs.fn, "slots", n, nk * (W + 1));
        goto done;
    }
    if (open_arr(&bs, a[6], "lk", K_I32, 1, 0, (void **)&lk, &n) < 0)
        goto done;
    if (n != nk * W) {
        too_short(bs.fn, "lk", n, nk * W);
        goto done;
    }
    if (open_arr(&bs, a[7], "ends", K_BOOL, 1, 0, (void **)&ends, &n) < 0)
        goto done;
    if (n != nk * W) {
        too_short(bs.fn, "ends", n, nk * W);
        goto done;
    }
    if (open_arr(&bs, a[8], "first", K_BOOL, 1, 0, (void **)&first, &n) < 0)
        goto done;
    if (n != nk) {
        too_short(bs.fn, "first", n, nk);
        goto done;
    }
    int64_t T = t.T, lanes = t.lanes;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t b = 0; b < nk; b++) {
        int64_t seq = keys[b] / lanes, lane = keys[b] % lanes;
        int64_t newest = t.written[lane] - 1, row = seq % T;
        for (int64_t j = 0; j <= W; j++) {
            slots[b * (W + 1) + j] = row * lanes + lane;
            if (j < W) {
                int32_t v = t.link[row * lanes + lane];
                lk[b * W + j] = v;
                ends[b * W + j] = v > 0 && seq + j != newest;
            }
            if (++row == T)
                row = 0;
        }
        int64_t prev = seq - 1;
        if (prev < t.written[lane] - t.counts[lane])
            first[b] = 1;
        else
            first[b] = t.link[(prev % T) * lanes + lane] > 0;
    }
    Py_END_ALLOW_THREADS
    Py_INCREF(Py_None);
    r = Py_None;
done:
    bufs_release(&bs);
    return r;
}

/* ---- frame-stack slots (twin of stack_numba._stack) */
static PyObject *
c_stack(PyObject *self, PyObject *const *a, Py_ssize_t na)
{
    /* stack(link, written, counts, cleared, keys, k, out) -> (n_bad, n_side);
     * cleared [lanes] int64: each lane's first step after its last clear (0: never),
     * the steps before it do not exist (a history reaching them is padded, not bad);
     * out [B * (k + 4)]: slots [B, k + 1], then side [B], ok [B], step slot [B] */
    (void)self;
    Bufs bs = {.n = 0, .fn = "stack"};
    Table t;
    const int64_t *keys, *cleared;
    int64_t *out;
    Py_ssize_t nb, n, nc;
    long long k;
    PyObject *r = NULL;
    if (!nargs_ok(na, 7, bs.fn))
        return NULL;
    if (open_table(&bs, a[0], Py_None, a[1], a[2], &t) < 0
        || open_arr(&bs, a[3], "cleared", K_I64, 0, 0, (void **)&cleared, &nc) < 0
        || open_arr(&bs, a[4], "keys", K_I64, 0, 0, (void **)&keys, &nb) < 0
        || get_int(a[5], bs.fn, "k", 1, &k) < 0
        || open_arr(&bs, a[6], "out", K_I64, 1, 0, (void **)&out, &n) < 0)
        goto done;
    if (nc != t.lanes) {
        too_short(bs.fn, "cleared", nc, t.lanes);
        goto done;
    }
    for (int64_t l = 0; l < t.lanes; l++) {
        if (cleared[l] < 0 || cleared[l] > t.written[l] - t.counts[l]) {
            PyErr_Format(PyExc_ValueError, "replaybank._windows.%s: lane %lld has cleared="
                         "%lld; need 0 <= cleared <= written - counts = %lld (a clear "
                         "comes before every live step)", bs.fn, (long long)l,
                         (long long)cleared[l], (long long)(t.written[l] - t.counts[l]));
            goto done;
        }
    }
    if (check_keys(bs.fn, keys, nb, &t) < 0)
        goto done;
    if (k > WMAX / (nb + 1) / 8 || n != nb * (k + 4)) {
        too_short(bs.fn, "out", n, nb * (k + 4));
        goto done;
    }
    int64_t T = t.T, lanes = t.lanes, w = k + 1;
    int64_t o_side = nb * w, o_ok = o_side + nb, o_step = o_ok + nb, n_bad = 0, n_side = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t b = 0; b < nb; b++) {  /* every sample's links requested up front */
        int64_t seq = keys[b] / lanes, lane = keys[b] % lanes;
        PREFETCH(t.link + (seq % T) * lanes + lane);
        PREFETCH(t.link + ((seq + T - (k - 1) % T) % T) * lanes + lane);
    }
    for (Py_ssize_t b = 0; b < nb; b++) {
        int64_t seq = keys[b] / lanes, lane = keys[b] % lanes;
        int64_t lo = t.written[lane] - t.counts[lane];
        int64_t depth = 0, good = 1;
        for (int64_t d = 1; d < k; d++) {
            int64_t cand = seq - d;
            if (cand < lo) {
                if (cand >= cleared[lane])  /* it existed (after the last clear): gone */
                    good = 0;
                break;
            }
            if (t.link[(cand % T) * lanes + lane] != 0)
                break;
            depth++;
        }
        int64_t base = b * w;
        for (int64_t c = 0; c < k; c++) {
            int64_t back = k - 1 - c;
            if (back > depth)
                back = depth;
            out[base + c] = ((seq - back) % T) * lanes + lane;
        }
        int64_t row = seq % T;
        out[base + k] = ((row + 1) % T) * lanes + lane;
        out[o_step + b] = row * lanes + lane;
        int32_t v = t.link[row * lanes + lane];
        out[o_side + b] = (int64_t)v - 1;
        out[o_ok + b] = good;
        n_bad += 1 - good;
        n_side += v > 0;
    }
    Py_END_ALLOW_THREADS
    r = Py_BuildValue("(LL)", (long long)n_bad, (long long)n_side);
done:
    bufs_release(&bs);
    return r;
}

/* ------------------------------------------------------------------ one-step batches
 *
 * take_steps(slots, lanes, link, fields, nexts) -> n_side
 *
 * Every field of a batch of steps and each observation field's next observation, in one
 * call (StepTable.gather_transitions; its numpy path is the oracle). slots [B] int64 are
 * storage slots of the flat table, each in [0, 2n) with n = len(link) (one wrap allowed,
 * as ndarray.take(mode="wrap") does for the slots of live keys), after an optional sixth
 * argument base (>= 0) is subtracted from each; with a true seventh argument (keys) they
 * are item keys (>= 0) instead, each at slot (key // lanes % T) * lanes + key % lanes
 * with T = n / lanes; link [n] int32 is the
 * table's flat link (side slot + 1 where a step's next observation is kept aside, else
 * 0). fields: (src, out) pairs, out[i] = src[slot_i] (src [n, ...]); nexts: (src, side,
 * out) triples, out[i] = side[link[slot_i] - 1] where link[slot_i] > 0, else
 * src[(slot_i + lanes) mod n]. Returns how many next observations came from the side
 * store. Every argument and every index is checked before a byte is written. A link
 * that changed while the rows were copied (a writer in another process relinked the
 * step: its next observation is now the next row) is read again after the copies, and
 * that step's next observations are taken from the next row. */

#define MAXSTEPJOBS 48

/* Open (src, out) or (src, side, out) `t` of `what` job j into job: 0 or -1. */
static int
open_step_job(PyObject *t, Py_ssize_t j, int next, Py_ssize_t n, Py_ssize_t b, Job *job,
              const char *fn, const char *what)
{
    Py_ssize_t want = next ? 3 : 2;
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != want) {
        PyErr_Format(PyExc_TypeError, "replaybank._windows.%s: %s[%zd] must be a "
                     "%s tuple", fn, what, j, next ? "(src, side, out)" : "(src, out)");
        return -1;
    }
    PyObject *src = PyTuple_GET_ITEM(t, 0), *out = PyTuple_GET_ITEM(t, want - 1);
    if (PyObject_GetBuffer(src, &job->src, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    job->held |= 1;
    if (PyObject_GetBuffer(out, &job->out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE
                           | PyBUF_FORMAT) < 0)
        return -1;
    job->held |= 4;
    if (next) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(t, 1), &job->out2,
                               PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            return -1;
        job->held |= 8;
    }
    const char *sf = strip(job->src.format), *of = strip(job->out.format);
    if (job->src.ndim < 1 || job->src.shape[0] != n || strchr(sf, 'O') != NULL
            || strchr(of, 'O') != NULL) {
        PyErr_Format(PyExc_ValueError, "replaybank._windows.%s: %s[%zd]: src must "
                     "be an array of %zd rows (the link's length) without objects", fn, what, j,
                     n);
        return -1;
    }
    job->rows = n;
    job->row = n > 0 ? job->src.len / n : 0;
    if (job->out.len != b * job->row) {
        PyErr_Format(PyExc_ValueError, "replaybank._windows.%s: %s[%zd]: out holds "
                     "%zd bytes, %zd rows of %zd bytes need %zd", fn, what, j, job->out.len, b,
                     job->row, b * job->row);
        return -1;
    }
    if (next) {
        Py_buffer *side = &job->out2;
        const char *df = strip(side->format);
        if (side->ndim < 1 || strchr(df, 'O') != NULL
                || (side->shape[0] > 0 && side->len / side->shape[0] != job->row)) {
            PyErr_Format(PyExc_ValueError, "replaybank._windows.%s: nexts[%zd]: side "
                         "rows must hold %zd bytes, as src's do, without objects", fn, j,
                         job->row);
            return -1;
        }
        job->w1 = side->shape[0];  /* side rows */
        job->o2 = (char *)side->buf;
    }
    job->s = (const char *)job->src.buf;
    job->o = (char *)job->out.buf;
    job->n = b;
    return 0;
}

static PyObject *
c_take_steps(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 6 && nargs != 7 && !nargs_ok(nargs, 5, "take_steps"))
        return NULL;
    Bufs bs = {.n = 0, .fn = "take_steps"};
    Job jobs[MAXSTEPJOBS];
    Py_ssize_t opened = 0, n_side = 0;
    int64_t *ws = NULL;
    PyObject *r = NULL;
    void *p;
    Py_ssize_t b, n;
    long long lanes, base = 0, by_key = 0;
    if (nargs >= 6 && get_int(args[5], "take_steps", "base", 0, &base) < 0)
        return NULL;
    if (nargs == 7 && get_int(args[6], "take_steps", "keys", 0, &by_key) < 0)
        return NULL;
    if (open_arr(&bs, args[0], "slots", K_I64, 0, 0, &p, &b) < 0)
        return NULL;
    const int64_t *slots = p;
    if (open_arr(&bs, args[2], "link", K_I32, 0, 0, &p, &n) < 0)
        goto done;
    const int32_t *link = p;
    if (get_int(args[1], "take_steps", "lanes", 1, &lanes) < 0)
        goto done;
    if (lanes > n) {
        PyErr_Format(PyExc_ValueError, "replaybank._windows.take_steps: lanes=%lld exceeds "
                     "the link's %zd slots", lanes, n);
        goto done;
    }
    if (by_key && n % lanes != 0) {
        PyErr_Format(PyExc_ValueError, "replaybank._windows.take_steps: keys need the link's "
                     "%zd slots to be a whole number of rows of lanes=%lld", n, lanes);
        goto done;
    }
    PyObject *fields = args[3], *nexts = args[4];
    if (!PyTuple_Check(fields) || !PyTuple_Check(nexts)) {
        PyErr_SetString(PyExc_TypeError, "replaybank._windows.take_steps: fields and nexts "
                        "must be tuples");
        goto done;
    }
    Py_ssize_t nf = PyTuple_GET_SIZE(fields), nn = PyTuple_GET_SIZE(nexts);
    if (nf + nn > MAXSTEPJOBS) {
        PyErr_Format(PyExc_ValueError, "replaybank._windows.take_steps: %zd fields and "
                     "nexts, at most %d per call", nf + nn, MAXSTEPJOBS);
        goto done;
    }
    memset(jobs, 0, sizeof(Job) * (size_t)(nf + nn > 0 ? nf + nn : 1));
    Py_ssize_t side_rows = PY_SSIZE_T_MAX;
    for (Py_ssize_t j = 0; j < nf + nn; j++) {
        int next = j >= nf;
        opened = j + 1;
        if (open_step_job(PyTuple_GET_ITEM(next ? nexts : fields, next ? j - nf : j),
                          next ? j - nf : j, next, n, b, &jobs[j], "take_steps",
                          next ? "nexts" : "fields") < 0)
            goto done;
        if (next && jobs[j].w1 < side_rows)
            side_rows = jobs[j].w1;
    }
    ws = PyMem_Malloc(sizeof(int64_t) * (size_t)(2 * b > 0 ? 2 * b : 1));
    if (ws == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* pass 1: wrapped slots, and for next observations each step's next row: a slot of
     * src (>= 0) or side slot s as -1 - s */
    int64_t *nx = ws + b;
    Py_ssize_t bad = -1;
    int32_t bad_link = 0;
    Py_BEGIN_ALLOW_THREADS
    if (by_key) {  /* item keys: slot = (key // lanes % T) * lanes + key % lanes */
        const int64_t L = lanes, T = (int64_t)n / lanes;
        const FastDiv by_l = fastdiv_of(L), by_t = fastdiv_of(T);
        for (Py_ssize_t i = 0; i < b; i++) {
            int64_t k = slots[i] - base;
            if (slots[i] < 0 || k < 0) {
                bad = i;
                break;
            }
            int64_t q = fastdiv_q(k, by_l);
            ws[i] = (q - fastdiv_q(q, by_t) * T) * L + (k - q * L);
        }
    } else {
        for (Py_ssize_t i = 0; i < b; i++) {
            int64_t s = slots[i] - base;  /* base <= 2**63 - 1 and slots[i] >= 0 checked: */
            if (slots[i] < 0 || s < 0 || s >= 2 * (int64_t)n) {  /* no overflow */
                bad = i;
                break;
            }
            ws[i] = s >= n ? s - n : s;
        }
    }
    if (bad < 0 && nn > 0) {
        for (Py_ssize_t i = 0; i < b; i++) {
            int32_t v = link[ws[i]];
            if (v > 0) {
                if ((Py_ssize_t)v > side_rows) {
                    bad = i;
                    bad_link = v;
                    break;
                }
                nx[i] = -(int64_t)v;  /* -1 - (v - 1) */
                n_side++;
            } else if (v < 0) {
                bad = i;
                bad_link = v;
                break;
            } else {
                int64_t t = ws[i] + lanes;
                nx[i] = t >= n ? t - n : t;
            }
        }
    }
    Py_END_ALLOW_THREADS
    if (bad >= 0) {
        if (bad_link == 0)
            PyErr_Format(PyExc_IndexError, "replaybank._windows.take_steps: slot %lld "
                         "(base %lld) is out of bounds for %zd slots (one wrap allowed)",
                         (long long)slots[bad], base, n);
        else
            PyErr_Format(PyExc_IndexError, "replaybank._windows.take_steps: link %d at slot "
                         "%lld points outside the side store's %zd rows", (int)bad_link,
                         (long long)ws[bad], side_rows);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < nf; j++)
        copy_rows(jobs[j].s, ws, jobs[j].o, b, jobs[j].row);
    for (Py_ssize_t j = nf; j < nf + nn; j++) {
        const Job *job = &jobs[j];
        const char *s = job->s, *side = job->o2;
        char *o = job->o;
        Py_ssize_t row = job->row;
        for (Py_ssize_t i = 0; i < b; i++) {
            int64_t k = nx[i];
            if (i + AHEAD < b && nx[i + AHEAD] >= 0)
                prefetch_row(s + nx[i + AHEAD] * row, row);
            memcpy(o + i * row, k >= 0 ? s + k * row : side + (-1 - k) * row, (size_t)row);
        }
    }
    if (n_side > 0) {
        /* A table written by another process (shared memory): a side row is the step's
         * next observation only while the link still names it. A writer relinks a step
         * (link k -> 0, its next observation is now the next row, committed before) and
         * may reuse the freed slot at once, so a link read above may be stale by the
         * copy. Links read again after the copies (acquire: not before them): a changed
         * one takes the next row instead. In one process the links never change here. */
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        for (Py_ssize_t i = 0; i < b; i++) {
            if (nx[i] >= 0 || __atomic_load_n(&link[ws[i]], __ATOMIC_RELAXED) == -nx[i])
                continue;
            int64_t t = ws[i] + lanes;
            t = t >= n ? t - n : t;
            for (Py_ssize_t j = nf; j < nf + nn; j++)
                memcpy(jobs[j].o + i * jobs[j].row, jobs[j].s + t * jobs[j].row,
                       (size_t)jobs[j].row);
            n_side--;
        }
    }
    Py_END_ALLOW_THREADS
    r = PyLong_FromSsize_t(n_side);
done:
    PyMem_Free(ws);
    release(jobs, opened);
    bufs_release(&bs);
    return r;
}

/* ------------------------------------------------------------------ draw, plan and take
 *
 * draw_take(link, bounds, written, counts, flat, cross, min_len, keys, ext, term, trunc,
 *           width, burn_in, slots, steps, flags, side, fields, obs)
 *   -> (n_ok, n_side, tail_only)
 *
 * draw_plan, then (when the plan was written) the rows of the batch: fields are (src,
 * out) pairs gathered at steps, out [B, W, ...]; obs are (src, out) pairs gathered at
 * slots, out [B, W + 1, ...] (the obs and next_obs windows of one gather); every src is
 * [T * lanes, ...], the table's flat rows. The slots come from the plan of the same call,
 * inside [0, T * lanes) by construction, so they are not checked again (take_rows checks
 * each index of a caller's). */
static PyObject *
c_draw_take(PyObject *self, PyObject *const *a, Py_ssize_t na)
{
    (void)self;
    Bufs bs = {.n = 0, .fn = "draw_take"};
    Table t;
    Plan p;
    Job jobs[MAXSTEPJOBS];
    Py_ssize_t opened = 0, nf = 0, no = 0;
    const int64_t *flat;
    Py_ssize_t m;
    long long cross, min_len;
    PyObject *r = NULL;
    if (!nargs_ok(na, 19, bs.fn))
        return NULL;
    if (open_draw_plan(&bs, a, &t, &p, &flat, &m, &cross, &min_len) < 0)
        goto done;
    Py_ssize_t nk = p.nb;
    PyObject *fields = a[17], *obs = a[18];
    if (!PyTuple_Check(fields) || !PyTuple_Check(obs)) {
        PyErr_SetString(PyExc_TypeError, "replaybank._windows.draw_take: fields and obs must "
                        "be tuples of (src, out) pairs");
        goto done;
    }
    nf = PyTuple_GET_SIZE(fields);
    no = PyTuple_GET_SIZE(obs);
    if (nf + no > MAXSTEPJOBS) {
        PyErr_Format(PyExc_ValueError, "replaybank._windows.draw_take: %zd fields and obs, "
                     "at most %d per call", nf + no, MAXSTEPJOBS);
        goto done;
    }
    memset(jobs, 0, sizeof(Job) * (size_t)(nf + no > 0 ? nf + no : 1));
    Py_ssize_t n = (Py_ssize_t)(t.T * t.lanes), w = (Py_ssize_t)p.width;
    for (Py_ssize_t j = 0; j < nf + no; j++) {
        int is_obs = j >= nf;
        opened = j + 1;
        if (open_step_job(PyTuple_GET_ITEM(is_obs ? obs : fields, is_obs ? j - nf : j),
                          is_obs ? j - nf : j, 0, n, nk * (is_obs ? w + 1 : w), &jobs[j],
                          bs.fn, is_obs ? "obs" : "fields") < 0)
            goto done;
    }
    int64_t n_ok, n_side = -1;
    int tail = 0;
    Py_BEGIN_ALLOW_THREADS
    n_ok = draw_loop(&t, flat, m, p.width, cross != 0, min_len, (int64_t *)p.keys,
                     (int64_t *)p.ext, nk);
    if (n_ok == nk) {
        plan_loop(&t, &p, &n_side, &tail);
        for (Py_ssize_t j = 0; j < nf + no; j++)
            copy_rows(jobs[j].s, j < nf ? p.steps : p.slots, jobs[j].o, jobs[j].n,
                      jobs[j].row);
    }
    Py_END_ALLOW_THREADS
    r = Py_BuildValue("(LLO)", (long long)n_ok, (long long)n_side,
                      tail ? Py_True : Py_False);
done:
    release(jobs, opened);
    bufs_release(&bs);
    return r;
}

/* ------------------------------------------------------------------ n-step windows
 *
 * nstep(slots, lanes, link, weights, rewards, last, length, returns)
 *
 * The n-step windows of a batch of steps (NStepView.gather; the oracle is
 * replaybank.ops.nstep: window_lengths and discounted_returns). slots [B] int64 are the
 * first steps' storage slots, each in [0, 2N) with N = len(link) (one wrap allowed, as
 * take_steps); step k of a window is (slot + k * lanes) mod N. A window stops at (and
 * includes) its first step whose next observation is kept aside (link > 0: an episode
 * end, a discontinuity or the lane's newest step), so L = min(n, that step + 1) with
 * n = len(weights). weights [n] float64 are gamma ** k; rewards [N] float32 or float64
 * the flat reward field. Out: last [B] int64 (the slot of step L - 1, wrapped), length
 * [B] int64 (L), returns [B] of the rewards' dtype: the terms (k < L ? r_k * w_k : 0.0)
 * summed from k = 0 upwards in float64 as numpy's cumsum sums them (the first term as it
 * is, each next one added), then stored in the rewards' dtype. Every slot and link is checked before a byte is written. */
static PyObject *
c_nstep(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (!nargs_ok(nargs, 8, "nstep"))
        return NULL;
    Bufs bs = {.n = 0, .fn = "nstep"};
    PyObject *r = NULL;
    void *p;
    Py_ssize_t b, n_link, n_w, n_last, n_len;
    long long lanes;
    Py_buffer rv = {0}, ov = {0};
    int have_rv = 0, have_ov = 0;
    if (open_arr(&bs, args[0], "slots", K_I64, 0, 0, &p, &b) < 0)
        return NULL;
    const int64_t *slots = p;
    if (get_int(args[1], "nstep", "lanes", 1, &lanes) < 0)
        goto done;
    if (open_arr(&bs, args[2], "link", K_I32, 0, 0, &p, &n_link) < 0)
        goto done;
    const int32_t *link = p;
    if (lanes > n_link) {
        PyErr_Format(PyExc_ValueError, "replaybank._windows.nstep: lanes=%lld exceeds the "
                     "link's %zd slots", lanes, n_link);
        goto done;
    }
    if (PyObject_GetBuffer(args[3], &rv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        goto done;
    have_rv = 1;
    if (rv.itemsize != 8 || strip(rv.format)[0] != 'd' || strip(rv.format)[1] != 0
            || rv.len < 8) {
        PyErr_SetString(PyExc_TypeError, "replaybank._windows.nstep: weights must be a "
                        "C-contiguous float64 array of n >= 1 values");
        goto done;
    }
    const double *w = rv.buf;
    n_w = rv.len / 8;
    Py_buffer *rw = &bs.b[bs.n];
    if (PyObject_GetBuffer(args[4], rw, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        goto done;
    bs.n++;
    const char *rf = strip(rw->format);
    int f32 = rw->itemsize == 4 && rf[0] == 'f' && rf[1] == 0;
    int f64 = rw->itemsize == 8 && rf[0] == 'd' && rf[1] == 0;
    if ((!f32 && !f64) || rw->len / rw->itemsize != n_link) {
        PyErr_Format(PyExc_TypeError, "replaybank._windows.nstep: rewards must be a "
                     "C-contiguous float32 or float64 array of the link's %zd slots", n_link);
        goto done;
    }
    if (open_arr(&bs, args[5], "last", K_I64, 1, 0, &p, &n_last) < 0)
        goto done;
    int64_t *last = p;
    if (open_arr(&bs, args[6], "length", K_I64, 1, 0, &p, &n_len) < 0)
        goto done;
    int64_t *length = p;
    if (PyObject_GetBuffer(args[7], &ov, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE
                           | PyBUF_FORMAT) < 0)
        goto done;
    have_ov = 1;
    if (ov.itemsize != rw->itemsize || strip(ov.format)[0] != rf[0]
            || strip(ov.format)[1] != 0) {
        PyErr_Format(PyExc_TypeError, "replaybank._windows.nstep: returns must be a "
                     "C-contiguous writable array of the rewards' dtype ('%s')", rf);
        goto done;
    }
    if (n_last != b || n_len != b || ov.len / ov.itemsize != b) {
        PyErr_Format(PyExc_ValueError, "replaybank._windows.nstep: last, length and returns "
                     "must hold %zd values (one per slot)", b);
        goto done;
    }
    const char *rews = rw->buf;
    char *ret = ov.buf;
    const int64_t N = n_link, step = lanes;
    Py_ssize_t bad = -1;
    int32_t bad_link = 0;
    Py_BEGIN_ALLOW_THREADS
    /* pass 1: check every slot and every link a window reads (the links and rewards of
     * the window SMALL_AHEAD on fetched meanwhile: the windows' rows are random) */
    for (Py_ssize_t i = 0; i < b && bad < 0; i++) {
        if (i + SMALL_AHEAD < b) {
            int64_t a = slots[i + SMALL_AHEAD];
            if (a >= 0 && a < 2 * N) {
                a = a >= N ? a - N : a;
                PREFETCH(link + a);
                PREFETCH(rews + a * rw->itemsize);
            }
        }
        int64_t s = slots[i];
        if (s < 0 || s >= 2 * N) {
            bad = i;
            break;
        }
        s = s >= N ? s - N : s;
        for (Py_ssize_t k = 0; k < n_w; k++) {
            int32_t v = link[s];
            if (v != 0) {
                if (v < 0) {
                    bad = i;
                    bad_link = v;
                }
                break;
            }
            s += step;
            s = s >= N ? s - N : s;
        }
    }
    /* pass 2: lengths, last slots and returns */
    for (Py_ssize_t i = 0; bad < 0 && i < b; i++) {
        int64_t s = slots[i];
        s = s >= N ? s - N : s;
        double g = 0.0;
        Py_ssize_t L = n_w;
        int64_t at = s;
        for (Py_ssize_t k = 0; k < n_w; k++) {
            if (k < L) {
                double x = f32 ? (double)((const float *)rews)[s] : ((const double *)rews)[s];
                /* the product rounded on its own, as numpy's (volatile: never fused into
                 * a multiply-add with the sum) */
                volatile double t = x * w[k];
                g = k ? g + t : t;  /* cumsum: the first term as it is */
                at = s;
                if (link[s] > 0)
                    L = k + 1;
                s += step;
                s = s >= N ? s - N : s;
            } else {
                g += 0.0;  /* as the oracle's masked terms: -0.0 + 0.0 is 0.0 */
            }
        }
        last[i] = at;
        length[i] = L;
        if (f32)
            ((float *)ret)[i] = (float)g;
        else
            ((double *)ret)[i] = g;
    }
    Py_END_ALLOW_THREADS
    if (bad >= 0) {
        if (bad_link == 0)
            PyErr_Format(PyExc_IndexError, "replaybank._windows.nstep: slot %lld is out of "
                         "bounds for %lld slots (one wrap allowed)", (long long)slots[bad],
                         (long long)N);
        else
            PyErr_Format(PyExc_IndexError, "replaybank._windows.nstep: a negative link (%d) "
                         "in the window of slot %lld", (int)bad_link, (long long)slots[bad]);
        goto done;
    }
    Py_INCREF(Py_None);
    r = Py_None;
done:
    if (have_rv)
        PyBuffer_Release(&rv);
    if (have_ov)
        PyBuffer_Release(&ov);
    bufs_release(&bs);
    return r;
}

static PyMethodDef windows_functions[] = {
    {"take_rows", take_rows, METH_O,
     "take_rows(jobs): out[i] = src[idx[i]] for each (src, idx, out) of the tuple jobs; "
     "out[b, j] = src[idx[b, j]], next[b, j] = src[idx[b, j + 1]] for each window pair "
     "(src, idx, out, next)."},
    {"extent", (PyCFunction)(void (*)(void))c_extent, METH_FASTCALL,
     "extent(link, bounds, written, counts, keys, width, cross, out)"},
    {"draw", (PyCFunction)(void (*)(void))c_draw, METH_FASTCALL,
     "draw(link, bounds, written, counts, flat, width, cross, min_len, keys, ext) -> n_ok"},
    {"plan", (PyCFunction)(void (*)(void))c_plan, METH_FASTCALL,
     "plan(link, bounds, written, counts, keys, ext, term, trunc, width, burn_in, slots, "
     "steps, flags, side) -> (n_side, tail_only)"},
    {"draw_plan", (PyCFunction)(void (*)(void))c_draw_plan, METH_FASTCALL,
     "draw_plan(link, bounds, written, counts, flat, cross, min_len, keys, ext, term, "
     "trunc, width, burn_in, slots, steps, flags, side) -> (n_ok, n_side, tail_only)"},
    {"draw_take", (PyCFunction)(void (*)(void))c_draw_take, METH_FASTCALL,
     "draw_take(link, bounds, written, counts, flat, cross, min_len, keys, ext, term, "
     "trunc, width, burn_in, slots, steps, flags, side, fields, obs) -> (n_ok, n_side, "
     "tail_only): draw_plan, then the rows of every field of the planned windows"},
    {"sync", (PyCFunction)(void (*)(void))c_sync, METH_FASTCALL,
     "sync(link, written, seen, bounds)"},
    {"window_plan", (PyCFunction)(void (*)(void))c_window_plan, METH_FASTCALL,
     "window_plan(link, written, counts, keys, width, slots, lk, ends, first)"},
    {"stack", (PyCFunction)(void (*)(void))c_stack, METH_FASTCALL,
     "stack(link, written, counts, cleared, keys, k, out) -> (n_bad, n_side)"},
    {"nstep", (PyCFunction)(void (*)(void))c_nstep, METH_FASTCALL,
     "nstep(slots, lanes, link, weights, rewards, last, length, returns): the n-step "
     "windows of a batch: last slots, lengths and discounted returns"},
    {"take_steps", (PyCFunction)(void (*)(void))c_take_steps, METH_FASTCALL,
     "take_steps(slots, lanes, link, fields, nexts[, base[, keys]]) -> n_side: every field of "
     "a batch of steps and their next observations (fields: (src, out); nexts: (src, side, "
     "out))"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef windowsmodule = {
    PyModuleDef_HEAD_INIT, "_windows",
    "Window plans and row gathers of window batches (see replaybank/_windows.c).", -1, windows_functions,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__windows(void)
{
    return PyModule_Create(&windowsmodule);
}
