/* Compiled add/extend for in-memory step tables: replaybank._lane.Appender.
 *
 * An optional accelerator (see replaybank/storage/writers/compiled.py): it takes the
 * decisions of the write plan (replaybank/storage/writers/plan.py) in C; the reference
 * writer (writers/reference.py) and LaneWriter (writers/lean.py) are its twins. Appender.add / Appender.extend
 * accept only the plainest calls: every lane at once with the lanes in step, C-contiguous
 * numpy arrays of exactly the stored format and shape (or Python scalars for the scalar
 * fields of a one-lane table), extras (a dict whose keys are exactly the table's extra
 * fields, at most MAXEXTRA of them) held to the same rule, no wrap-around inside a chunk;
 * Appender.add_lanes also takes any subset of lanes, in step or not. Anything else
 * returns False before a byte is written and the Python paths take over. A rows table
 * (ReplayBuffer(next_obs=False): no observation fields, nothing kept aside but the side
 * slots its links point at) is written by Appender.rows_add / rows_add_lanes / rows_extend,
 * which take every field's value in one tuple, in field order. What is written
 * is exactly what the reference writer writes: data rows, links, side slots (same
 * free-slot order) and counters; tests/test_fastpath.py compares the whole table state
 * with the general path.
 *
 * Layout: every field is a flat [T * L, *shape] C-contiguous array (row-major [T, L]);
 * the step of lane l in row r is item r * L + l. Storage is reached through the buffer
 * protocol (no numpy headers needed to build).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <signal.h>

#define NSTD 5      /* obs, action, reward, terminated, truncated: f[0..NSTD) */
#define MAXEXTRA 16 /* extra fields (f[NSTD..nf)); tables with more take the Python paths */
#define MAXOBS 16   /* fields of a dict observation (obs/<key>); more: the Python paths */
#define MAXFIELDS (NSTD + MAXEXTRA + MAXOBS - 1)
#define MAXDIM 8
#define STACK_ITEMS 512 /* steps x lanes written without a heap allocation */

typedef struct {
    Py_buffer store;           /* flat [T * L, *shape] storage, C-contiguous */
    char fmt[16];              /* buffer format of the dtype (e.g. "f", "?", "l") */
    Py_ssize_t itemsize;
    int ndim;                  /* item ndim */
    Py_ssize_t shape[MAXDIM];  /* item shape */
    Py_ssize_t nbytes;         /* bytes of one step of one lane */
    char kind;                 /* scalar fields: 'f', 'i', 'u', 'b'; '-' otherwise */
    int isbool;                /* bool dtype: inputs must hold canonical 0/1 bytes */
    long long lo, hi;          /* range of an int scalar field */
    PyObject *name;            /* extra fields: the key in the extras dict (interned str) */
} Field;

/* The state of a buffer's call guard (replaybank/buffers/guard.py subclasses this type),
 * read here so that the compiled add/extend check it without a Python call. While only the
 * owner thread calls the buffer, a compiled write raises `busy` around itself (a second
 * thread switching the guard to shared mode waits for it to drop); in shared mode only the
 * thread holding the guard's lock (`holder`) may write. Any other caller is refused
 * (False), and the buffer's guarded Python path takes the call. */
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
    .tp_name = "replaybank._lane.GuardState",
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
    int rows;                  /* a rows table: only the rows_* methods write */
    int oi[MAXOBS];            /* obs field p is f[oi[p]] */
    PyObject *okey[MAXOBS];    /* dict obs: the key of obs field p in obs / next_obs (NULL:
                                  a flat obs, the value itself) */
    PyObject *oside[MAXOBS];   /* the side store array of obs field p (interned str) */
    PyObject *xkey[MAXEXTRA];  /* the extras' keys (borrowed: f[NSTD + i].name) */
    Py_buffer link, written, counts, episodes;
    int nmeta;
    PyObject *table;  /* the SideStore: .arrays["obs"], .free, .alloc(k) */
    PyObject *ndarray_type;
    PyObject *bool_type;
    Py_ssize_t T, L;
    int durable;               /* files (memmap): the crash-safe write order, see below */
    Py_buffer start;           /* durable: int64 [L] seq of each lane's oldest live step */
    int has_start;
    Py_ssize_t max_evict;      /* durable: extends evicting more steps take the Python path */
    GuardState *guard;         /* the owning buffer's call guard, or NULL */
    int ready;                 /* __init__ succeeded (the methods refuse other objects) */
} Appender;

/* Durable tables (memmap files) keep a reader's view consistent at every instant: a
 * reader that opens the files after a kill derives counts = written - start, so each
 * single 8-byte store moves one end of a lane's live window [start, written): evicted
 * steps leave first (start advances), then side slots, data and links are written
 * outside the window, then the previous newest step is relinked, then written advances
 * (the commit); counts and episodes follow as mirrors. Files without a start array
 * (written by older versions) keep the older order: counts drop first. */

/* Test hook (REPLAYBANK_KILL_AT=<n>, read once at import): the process kills itself with
 * SIGKILL just before the n-th durable store (this counter is shared with the Python
 * writers through store_point()). Zero cost when unset: one predictable branch per
 * durable store. */
static long long kill_at = 0, stores_done = 0;

static void
store_point(void)
{
    if (kill_at && ++stores_done == kill_at) {
        fflush(NULL);
        raise(SIGKILL);
    }
}

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
            store_point();           \
            RELEASE_FENCE();         \
        }                            \
    } while (0)

static PyObject *s_free, *s_side, *s_obs, *s_alloc;

/* ------------------------------------------------------------------ helpers */
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

/* An input array of this field with leading dims lead[0..nlead). 1: accepted (view
 * filled: release it); 0: not for this path. */
static int
get_input(Appender *self, Field *f, PyObject *v, const Py_ssize_t *lead, int nlead,
          Py_buffer *view)
{
    if ((PyObject *)Py_TYPE(v) != self->ndarray_type)
        return 0;
    if (PyObject_GetBuffer(v, view, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        return 0;
    }
    int ok = view->ndim == f->ndim + nlead && view->itemsize == f->itemsize
             && strcmp(view->format ? view->format : "B", f->fmt) == 0
             && PyBuffer_IsContiguous(view, 'C');
    for (int i = 0; ok && i < nlead; i++)
        ok = view->shape[i] == lead[i];
    for (int i = 0; ok && i < f->ndim; i++)
        ok = view->shape[i + nlead] == f->shape[i];
    if (ok && f->isbool) { /* a bool byte other than 0/1: the Python paths store 0/1 */
        const unsigned char *b = (const unsigned char *)view->buf;
        unsigned char any = 0;
        for (Py_ssize_t i = 0; i < view->len; i++)
            any |= b[i] & 0xFE;
        ok = !any;
    }
    if (!ok) {
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

/* A Python scalar for a scalar field, into dst (f->nbytes bytes). 1: done; 0: not here;
 * -1: error. */
static int
scalar_value(Appender *self, Field *f, PyObject *v, char *dst)
{
    switch (f->kind) {
    case 'b':
        if (v == Py_True || v == Py_False) {
            *dst = (char)(v == Py_True);
            return 1;
        }
        if ((PyObject *)Py_TYPE(v) == self->bool_type) {
            int t = PyObject_IsTrue(v);
            if (t < 0)
                return -1;
            *dst = (char)t;
            return 1;
        }
        return 0;
    case 'f':
        {
            double d;
            if (PyFloat_Check(v)) { /* float and numpy float64 (a float subclass) */
                d = PyFloat_AS_DOUBLE(v);
            } else if (PyLong_CheckExact(v)) { /* an int reward: exact below 2**53 */
                int overflow = 0;
                long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
                if (x == -1 && PyErr_Occurred())
                    return -1;
                if (overflow || x > (1LL << 53) || x < -(1LL << 53))
                    return 0;
                d = (double)x;
            } else {
                return 0;
            }
            if (f->itemsize == 4) {
                float x = (float)d;
                memcpy(dst, &x, 4);
            } else if (f->itemsize == 8) {
                memcpy(dst, &d, 8);
            } else {
                return 0;
            }
        }
        return 1;
    case 'i':
    case 'u':
        if (!PyLong_CheckExact(v))
            return 0;
        {
            int overflow = 0;
            long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
            if (x == -1 && PyErr_Occurred())
                return -1;
            if (overflow || x < f->lo || x > f->hi)
                return 0;
            switch (f->itemsize) {
            case 1: { int8_t y = (int8_t)x; memcpy(dst, &y, 1); break; }
            case 2: { int16_t y = (int16_t)x; memcpy(dst, &y, 2); break; }
            case 4: { int32_t y = (int32_t)x; memcpy(dst, &y, 4); break; }
            case 8: { int64_t y = (int64_t)x; memcpy(dst, &y, 8); break; }
            default: return 0;
            }
        }
        return 1;
    default:
        return 0;
    }
}

static inline int64_t *
meta(Py_buffer *b)
{
    return (int64_t *)b->buf;
}

/* Every lane has the same written and counts (the lanes are in step). */
static int
in_step(Appender *self)
{
    const int64_t *w = meta(&self->written), *c = meta(&self->counts);
    for (Py_ssize_t l = 1; l < self->L; l++)
        if (w[l] != w[0] || c[l] != c[0])
            return 0;
    return 1;
}

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
    return 0;
}

static void
release_sides(Appender *self, Py_buffer *sv)
{
    for (int p = 0; p < self->nob; p++)
        PyBuffer_Release(&sv[p]);
}

/* Whether side slot `slot` lies inside every obs field's side array. */
static int
slot_inside(Appender *self, const Py_buffer *sv, long long slot)
{
    for (int p = 0; p < self->nob; p++)
        if (slot < 0 || slot >= sv[p].len / self->f[self->oi[p]].nbytes)
            return 0;
    return 1;
}

/* Next observations nsrc (items [j, j + count)) equal the obs of items [j + L, j + L +
 * count) bitwise, in every obs field (src: the fields' sources, nsrc: the next obs of
 * each obs field). */
static int
next_is_obs(Appender *self, char *const *src, const char *const *nsrc, Py_ssize_t j,
            Py_ssize_t count)
{
    const Py_ssize_t L = self->L;
    for (int p = 0; p < self->nob; p++) {
        const Py_ssize_t ib = self->f[self->oi[p]].nbytes;
        if (memcmp(nsrc[p] + j * ib, src[self->oi[p]] + (j + L) * ib, (size_t)(count * ib)))
            return 0;
    }
    return 1;
}

/* A link or free slot outside the side store: raise instead of touching memory. */
static int
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

/* Does the step at flat index `at` (a lane's previous newest step) continue into a new
 * step whose obs is item `j` of the sources src: not an episode end, and its kept next
 * observation equals that obs bitwise in every obs field? Returns its link (to release)
 * when it does, 0 when not, -1 on error. Opens the side views `sv` at first use
 * (*have_side). */
static long long
continues_into(Appender *self, Py_ssize_t at, char *const *src, Py_ssize_t j, Py_buffer *sv,
               int *have_side)
{
    long long p = ((const int32_t *)self->link.buf)[at];
    if (!p || ((const char *)self->f[3].store.buf)[at]
        || ((const char *)self->f[4].store.buf)[at])
        return 0;
    if (!*have_side) {
        if (side_view(self, sv) < 0)
            return -1;
        *have_side = 1;
    }
    if (!slot_inside(self, sv, p - 1)) {
        corrupt(p);
        return -1;
    }
    for (int q = 0; q < self->nob; q++) {
        const Py_ssize_t ib = self->f[self->oi[q]].nbytes;
        if (memcmp((char *)sv[q].buf + (p - 1) * ib, src[self->oi[q]] + j * ib, (size_t)ib))
            return 0;
    }
    return p;
}

/* ------------------------------------------------------------------ the write
 * n steps of all L lanes, rows [start, start + n) (no wrap), inputs validated:
 * src[i] points at field i's [n, L, *shape] bytes (i < nf: the extras and obs fields
 * too), nsrc[p] at obs field p's next_obs [n, L, *shape].
 * Same steps and order as the write plan (writers/plan.py). Returns 0, or -1 with an exception set
 * (only on memory errors; the table may then be partly written). */
static int
write_steps(Appender *self, char *const *src, const char *const *nsrc, Py_ssize_t n)
{
    const Py_ssize_t T = self->T, L = self->L;
    const char *term = src[3], *trunc = src[4];
    int32_t *link = (int32_t *)self->link.buf;
    int64_t w = meta(&self->written)[0], c = meta(&self->counts)[0];
    Py_ssize_t start = (Py_ssize_t)(w % T), end = start + n, nl = n * L;
    int err = 0;
    Py_buffer sv[MAXOBS];
    /* small calls (an add of a few lanes) use the stack, larger ones the heap */
    Py_ssize_t pos_s[STACK_ITEMS];
    long long relink_s[STACK_ITEMS], slots_s[STACK_ITEMS], ends_s[STACK_ITEMS];
    int heap = nl > STACK_ITEMS;
    /* pos: the steps (j = i * L + l) whose next observation is kept aside, in order */
    Py_ssize_t *pos = heap ? PyMem_Malloc((size_t)nl * sizeof(Py_ssize_t)) : pos_s;
    long long *relink = heap ? PyMem_Malloc((size_t)L * sizeof(long long)) : relink_s;
    long long *slots = heap ? PyMem_Malloc((size_t)nl * sizeof(long long)) : slots_s;
    long long *lane_ends = heap ? PyMem_Malloc((size_t)L * sizeof(long long)) : ends_s;
    PyObject *free = get_free(self);
    if (pos == NULL || relink == NULL || slots == NULL || lane_ends == NULL || free == NULL) {
        if (free != NULL)
            PyErr_NoMemory();
        err = 1;
        goto out;
    }
    /* which next observations are kept aside: done steps, steps whose next_obs is not
     * the next step's obs (bitwise), and the last step of each lane */
    Py_ssize_t k = 0;
    Py_ssize_t run_end = 0;       /* rows [i, run_end) are known to continue row to row */
    Py_ssize_t scanned = 0;       /* rows before this were already part of a run check */
    for (Py_ssize_t l = 0; l < L; l++)
        lane_ends[l] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i >= scanned) {
            /* the run of rows before the next row where some lane's episode ends: one
             * comparison for all of it (the common case: it continues) */
            Py_ssize_t hi = i;
            while (hi < n - 1) {
                int ends = 0;
                for (Py_ssize_t l = 0; l < L && !ends; l++)
                    ends = term[hi * L + l] || trunc[hi * L + l];
                if (ends)
                    break;
                hi++;
            }
            scanned = hi > i ? hi : i + 1;
            if (hi > i && next_is_obs(self, src, nsrc, i * L, (hi - i) * L))
                run_end = hi;
        }
        if (i < run_end) { /* a continuing run: no ends, nothing kept aside */
            i = run_end - 1;
            continue;
        }
        int same_block = i < n - 1 && next_is_obs(self, src, nsrc, i * L, L);
        for (Py_ssize_t l = 0; l < L; l++) {
            Py_ssize_t j = i * L + l;
            int done = term[j] || trunc[j];
            lane_ends[l] += done;
            if (i == n - 1 || done
                || (!same_block && !next_is_obs(self, src, nsrc, j, 1)))
                pos[k++] = j;
        }
    }
    /* 1. evict: old steps in the rows written now leave the ring and free their slots
     *    (rows before start + T - c held no live step); on files, counts drop first, so
     *    that a process killed in the middle never shows a half-written row as live */
    if (c + n > T) {
        if (self->durable) {
            int64_t kept = c - (c + n - T) > 0 ? c - (c + n - T) : 0;
            if (self->has_start) {
                DURABLE_STORE(self);
                for (Py_ssize_t l = 0; l < L; l++)
                    meta(&self->start)[l] = w - kept;
            }
            DURABLE_STORE(self);
            for (Py_ssize_t l = 0; l < L; l++)
                meta(&self->counts)[l] = kept;
        }
        for (Py_ssize_t j = (start + (Py_ssize_t)(T - c)) * L; !err && j < end * L; j++)
            if (link[j])
                err = free_append(free, link[j] - 1) < 0;
    }
    /* 2. does each lane's previous newest step continue into this chunk? */
    int any_relink = 0, have_side = 0;
    for (Py_ssize_t l = 0; l < L; l++)
        relink[l] = 0;
    if (!err && c && n < T) {
        Py_ssize_t prow = start ? start - 1 : T - 1;
        for (Py_ssize_t l = 0; l < L; l++) {
            long long p = continues_into(self, prow * L + l, src, l, sv, &have_side);
            if (p < 0) {
                err = 1;
                break;
            }
            relink[l] = p;
            any_relink |= p > 0;
        }
    }
    /* 3. side slots of the kept next observations, in row-major order (taking more slots
     *    than are free grows the side store: a new array) */
    if (!err) {
        int grows = PyList_GET_SIZE(free) < k;
        if (grows && have_side) {
            release_sides(self, sv);
            have_side = 0;
        }
        err = take_slots(self, free, k, slots) < 0;
    }
    if (!err && !have_side) {
        err = side_view(self, sv) < 0;
        have_side = !err;
    }
    if (err && have_side) {
        release_sides(self, sv);
        have_side = 0;
    }
    if (!err) {
        for (Py_ssize_t j = 0; j < k; j++)
            if (!slot_inside(self, sv, slots[j])) {
                err = corrupt(slots[j] + 1);
                release_sides(self, sv);
                goto out;
            }
    }
    if (!err) {
        DURABLE_STORE(self);
        memset(link + start * L, 0, (size_t)nl * sizeof(int32_t));
        DURABLE_STORE(self);
        for (Py_ssize_t s = 0; s < k; s++) {
            Py_ssize_t j = pos[s];
            for (int q = 0; q < self->nob; q++) {
                const Py_ssize_t ib = self->f[self->oi[q]].nbytes;
                memcpy((char *)sv[q].buf + slots[s] * ib, nsrc[q] + j * ib, (size_t)ib);
            }
            link[start * L + j] = (int32_t)(slots[s] + 1);
        }
        release_sides(self, sv);
        /* 4. data, then the commit (written advances: a reader's counts = written -
         * start), then release the continued steps' slots (no longer the newest), then
         * the mirrors */
        for (int i = 0; i < self->nf; i++) {
            Field *f = &self->f[i];
            DURABLE_STORE(self);
            /* memmove: an input may even be a view of the storage itself */
            memmove((char *)f->store.buf + start * L * f->nbytes, src[i],
                    (size_t)(nl * f->nbytes));
        }
        int64_t nc = c + n < T ? c + n : T;
        DURABLE_STORE(self);
        for (Py_ssize_t l = 0; l < L; l++)
            meta(&self->written)[l] = w + n;
        if (any_relink) {
            Py_ssize_t prow = start ? start - 1 : T - 1;
            DURABLE_STORE(self);
            for (Py_ssize_t l = 0; !err && l < L; l++) {
                if (relink[l]) {
                    link[prow * L + l] = 0;
                    err = free_append(free, relink[l] - 1) < 0;
                }
            }
        }
        DURABLE_STORE(self);
        for (Py_ssize_t l = 0; l < L; l++)
            meta(&self->counts)[l] = nc;
        DURABLE_STORE(self);
        for (Py_ssize_t l = 0; l < L; l++)
            meta(&self->episodes)[l] += lane_ends[l];
    }
out:
    Py_XDECREF(free);
    if (heap) {
        PyMem_Free(pos);
        PyMem_Free(relink);
        PyMem_Free(slots);
        PyMem_Free(lane_ends);
    }
    return err ? -1 : 0;
}

/* ------------------------------------------------------------------ one step, any lanes
 * One step of m distinct lanes lanes[0..m) in any order, whose lanes need not be in
 * step: src[i] points at field i's [m, *shape] bytes (i < nf), nsrc[p] at obs field
 * p's next_obs [m, *shape].
 * Same steps and order as the general StepTable.write with n = 1 (table_write.write):
 * evictions free their side slots (lane order), each lane's previous newest step is
 * checked for continuity, m side slots are taken (SideStore.alloc order), then data, links,
 * relinks and counters. Returns 0, or -1 with an exception set. */
static int
write_each(Appender *self, char *const *src, const char *const *nsrc, const int64_t *lanes,
           Py_ssize_t m)
{
    const Py_ssize_t T = self->T, L = self->L;
    const char *term = src[3], *trunc = src[4];
    int32_t *link = (int32_t *)self->link.buf;
    int64_t *wr = meta(&self->written), *cn = meta(&self->counts), *ep = meta(&self->episodes);
    int err = 0, have_side = 0;
    Py_buffer sv[MAXOBS];
    long long relink_s[STACK_ITEMS], slots_s[STACK_ITEMS];
    int heap = m > STACK_ITEMS;
    long long *relink = heap ? PyMem_Malloc((size_t)m * sizeof(long long)) : relink_s;
    long long *slots = heap ? PyMem_Malloc((size_t)m * sizeof(long long)) : slots_s;
    PyObject *free = get_free(self);
    if (relink == NULL || slots == NULL || free == NULL) {
        if (free != NULL)
            PyErr_NoMemory();
        err = 1;
        goto out;
    }
    /* 1. evict: a full lane's oldest step (in the row written now) frees its slot (on
     *    files its count drops first, as in write_steps) */
    for (Py_ssize_t j = 0; !err && j < m; j++) {
        int64_t lane = lanes[j];
        Py_ssize_t at = (Py_ssize_t)(wr[lane] % T) * L + (Py_ssize_t)lane;
        if (cn[lane] == T && link[at])
            err = free_append(free, link[at] - 1) < 0;
        if (cn[lane] == T && self->durable) {
            if (self->has_start) {
                DURABLE_STORE(self);
                meta(&self->start)[lane] = wr[lane] - (T - 1);
            }
            DURABLE_STORE(self);
            cn[lane] = T - 1;
        }
    }
    /* 2. does each lane's previous newest step continue into this one? */
    for (Py_ssize_t j = 0; !err && j < m; j++) {
        int64_t lane = lanes[j];
        relink[j] = 0;
        if (cn[lane] == 0 || T < 2)
            continue;
        Py_ssize_t at = (Py_ssize_t)((wr[lane] - 1) % T) * L + (Py_ssize_t)lane;
        long long p = continues_into(self, at, src, j, sv, &have_side);
        if (p < 0) {
            err = 1;
            break;
        }
        relink[j] = p;
    }
    /* 3. one side slot per lane (taking more than are free grows the side store) */
    if (!err) {
        if (have_side && PyList_GET_SIZE(free) < m) {
            release_sides(self, sv);
            have_side = 0;
        }
        err = take_slots(self, free, m, slots) < 0;
    }
    if (!err && !have_side) {
        err = side_view(self, sv) < 0;
        have_side = !err;
    }
    for (Py_ssize_t j = 0; !err && j < m; j++)
        if (!slot_inside(self, sv, slots[j]))
            err = corrupt(slots[j] + 1);
    if (err) {
        if (have_side)
            release_sides(self, sv);
        goto out;
    }
    /* 4. next observations, data and links, then per lane the commit (written), the
     * relink of its previous newest step, and the mirrors */
    for (Py_ssize_t j = 0; j < m; j++) {
        int64_t lane = lanes[j];
        Py_ssize_t at = (Py_ssize_t)(wr[lane] % T) * L + (Py_ssize_t)lane;
        for (int q = 0; q < self->nob; q++) {
            const Py_ssize_t ib = self->f[self->oi[q]].nbytes;
            DURABLE_STORE(self);
            memcpy((char *)sv[q].buf + slots[j] * ib, nsrc[q] + j * ib, (size_t)ib);
        }
        for (int i = 0; i < self->nf; i++) {
            Field *f = &self->f[i];
            DURABLE_STORE(self);
            memmove((char *)f->store.buf + at * f->nbytes, src[i] + j * f->nbytes,
                    (size_t)f->nbytes);
        }
        DURABLE_STORE(self);
        link[at] = (int32_t)(slots[j] + 1);
    }
    release_sides(self, sv);
    for (Py_ssize_t j = 0; j < m; j++) {
        int64_t lane = lanes[j];
        DURABLE_STORE(self);
        wr[lane] += 1;
        if (relink[j] && !err) { /* the previous newest step: wr - 2 now */
            DURABLE_STORE(self);
            link[(Py_ssize_t)((wr[lane] - 2) % T) * L + (Py_ssize_t)lane] = 0;
            err = free_append(free, relink[j] - 1) < 0;
        }
        DURABLE_STORE(self);
        cn[lane] = cn[lane] < T ? cn[lane] + 1 : T;
        DURABLE_STORE(self);
        ep[lane] += term[j] || trunc[j];
    }
out:
    Py_XDECREF(free);
    if (heap) {
        PyMem_Free(relink);
        PyMem_Free(slots);
    }
    return err ? -1 : 0;
}

/* The values of the plain dict d under keys[0..nk), as new references in out[0..nk)
 * (release them with drop_refs). 1: d's keys are exactly these; 0: not (an unknown or
 * missing key, or not a dict: the general path names it). The lookups come first in a
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
            PyErr_Clear(); /* missing, or a key's __eq__ raised: the general path */
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

/* The values of the extras dict in extra-field order (see get_keys). */
static int
get_extras(Appender *self, PyObject *extras, PyObject **out)
{
    return get_keys(extras, self->xkey, self->nx, out);
}

/* The values of every obs field in a call's obs and next_obs, as new references in
 * ov[0..nob) and nv[0..nob) (release both with drop_refs): a flat obs is the value
 * itself (checked later), a dict obs a plain dict with exactly the obs keys. 1: found;
 * 0: not for this path. */
static int
get_obs(Appender *self, PyObject *obs, PyObject *next, PyObject **ov, PyObject **nv)
{
    if (self->okey[0] == NULL) {
        Py_INCREF(obs);
        Py_INCREF(next);
        ov[0] = obs;
        nv[0] = next;
        return 1;
    }
    if (!get_keys(obs, self->okey, self->nob, ov))
        return 0;
    if (!get_keys(next, self->okey, self->nob, nv)) {
        for (int p = 0; p < self->nob; p++)
            Py_DECREF(ov[p]);
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
 * extras): every field's value in field order into vals[0..nf), each obs field's next
 * observation into nv[0..nob) (new references to the extras' and obs values in vals, ov
 * and nv: release them with release_call). 1: found; 0: not for this path (a rows
 * table, or extras / obs of other keys). */
static int
call_values(Appender *self, PyObject *const *args, PyObject **vals, PyObject **ov,
            PyObject **nv)
{
    if (self->rows || !get_extras(self, args[6], vals + NSTD))
        return 0;
    if (!get_obs(self, args[0], args[3], ov, nv)) {
        drop_refs(vals + NSTD, self->nx);
        return 0;
    }
    for (int p = 0; p < self->nob; p++)
        vals[self->oi[p]] = ov[p];
    vals[1] = args[1];
    vals[2] = args[2];
    vals[3] = args[4];
    vals[4] = args[5];
    return 1;
}

static void
release_call(Appender *self, PyObject **vals, PyObject **ov, PyObject **nv)
{
    drop_refs(vals + NSTD, self->nx);
    drop_refs(ov, self->nob);
    drop_refs(nv, self->nob);
}

/* ------------------------------------------------------------------ add */
/* One step of every lane (in step): vals[0..nf) the fields' values in field order,
 * nv[0..nob) each obs field's next observation. A new reference to True (written) or
 * False (not for this path), or NULL with an exception set. */
static PyObject *
add_values(Appender *self, PyObject *const *vals, PyObject *const *nv)
{
    const int nf = self->nf, nob = self->nob;
    PyObject *result = Py_False;
    Py_buffer held[MAXFIELDS + MAXOBS];
    const char *nsrc[MAXOBS];
    int nheld = 0;
    if (!in_step(self))
        goto done;
    const Py_ssize_t L = self->L;
    int nlead = L == 1 ? 0 : 1; /* one env: no leading dim, or a lane dim of 1 */
    char small[MAXFIELDS][16];
    char *src[MAXFIELDS];
    if (!get_input(self, &self->f[0], vals[0], &L, nlead, &held[0])) {
        if (L != 1 || !get_input(self, &self->f[0], vals[0], &L, 1, &held[0]))
            goto done;
        nlead = 1;
    }
    src[0] = (char *)held[nheld++].buf;
    for (int i = 1; i < nf; i++) {
        Field *f = &self->f[i];
        if (!nlead && f->kind != '-' && (PyObject *)Py_TYPE(vals[i]) != self->ndarray_type) {
            int r = scalar_value(self, f, vals[i], small[i]);
            if (r <= 0) {
                result = r < 0 ? NULL : Py_False;
                goto done;
            }
            src[i] = small[i];
            continue;
        }
        if (!get_input(self, f, vals[i], &L, nlead, &held[nheld]))
            goto done;
        src[i] = (char *)held[nheld++].buf;
    }
    for (int p = 0; p < nob; p++) {
        if (!get_input(self, &self->f[self->oi[p]], nv[p], &L, nlead, &held[nheld]))
            goto done;
        nsrc[p] = (const char *)held[nheld++].buf;
    }
    result = write_steps(self, src, nsrc, 1) < 0 ? NULL : Py_True;
done:
    for (int i = 0; i < nheld; i++)
        PyBuffer_Release(&held[i]);
    Py_XINCREF(result);
    return result;
}

static PyObject *
Appender_add_body(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "add(obs, action, reward, next_obs, terminated, truncated, extras)");
        return NULL;
    }
    PyObject *vals[MAXFIELDS], *ov[MAXOBS], *nv[MAXOBS];
    if (!call_values(self, args, vals, ov, nv))
        Py_RETURN_FALSE;
    PyObject *result = add_values(self, vals, nv);
    release_call(self, vals, ov, nv);
    return result;
}

/* A rows table's call values: a tuple of exactly nf values (borrowed), or NULL. */
static PyObject *const *
row_values(Appender *self, PyObject *t)
{
    if (!self->rows || !PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != self->nf)
        return NULL;
    return PySequence_Fast_ITEMS(t);
}

/* rows_add(values): one step of every lane of a rows table, values in field order. */
static PyObject *
Appender_rows_add_body(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "rows_add(values)");
        return NULL;
    }
    PyObject *const *vals = row_values(self, args[0]);
    if (vals == NULL)
        Py_RETURN_FALSE;
    return add_values(self, vals, NULL);
}

/* ------------------------------------------------------------------ add_lanes
 * add_lanes(lanes, obs, action, reward, next_obs, terminated, truncated, extras): one step
 * of the lanes `lanes` (a list, tuple or 1-D array of distinct ints in [0, L); None: every
 * lane), values [m, *shape] of exactly the stored format, the lanes in step or not. */
static int
parse_lanes(Appender *self, PyObject *arg, int64_t *out, Py_ssize_t *m)
{
    const Py_ssize_t L = self->L;
    if (arg == Py_None) {
        for (Py_ssize_t l = 0; l < L; l++)
            out[l] = l;
        *m = L;
        return 1;
    }
    if (!PyList_CheckExact(arg) && !PyTuple_CheckExact(arg)
        && (PyObject *)Py_TYPE(arg) != self->ndarray_type)
        return 0;
    PyObject *seq = PySequence_Fast(arg, "lanes");
    if (seq == NULL) {
        PyErr_Clear();
        return 0;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int ok = n >= 1 && n <= L;
    char seen_s[STACK_ITEMS];
    char *seen = L > STACK_ITEMS ? PyMem_Calloc((size_t)L, 1) : seen_s;
    if (seen == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    if (L <= STACK_ITEMS)
        memset(seen, 0, (size_t)L);
    for (Py_ssize_t j = 0; ok && j < n; j++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, j);
        if (PyBool_Check(item) || (PyObject *)Py_TYPE(item) == self->bool_type) {
            ok = 0;
            break;
        }
        PyObject *idx = PyNumber_Index(item);
        if (idx == NULL) {
            PyErr_Clear();
            ok = 0;
            break;
        }
        long long v = PyLong_AsLongLong(idx);
        Py_DECREF(idx);
        if (v == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            ok = 0;
            break;
        }
        ok = v >= 0 && v < L && !seen[v];
        if (ok) {
            seen[v] = 1;
            out[j] = v;
        }
    }
    if (L > STACK_ITEMS)
        PyMem_Free(seen);
    Py_DECREF(seq);
    *m = n;
    return ok;
}

/* One step of the lanes `lanes_arg` (see parse_lanes): vals, nv as in add_values. */
static PyObject *
lanes_values(Appender *self, PyObject *lanes_arg, PyObject *const *vals, PyObject *const *nv)
{
    const int nf = self->nf, nob = self->nob;
    const Py_ssize_t L = self->L;
    int64_t lanes_s[STACK_ITEMS];
    int64_t *lanes = L > STACK_ITEMS ? PyMem_Malloc((size_t)L * sizeof(int64_t)) : lanes_s;
    if (lanes == NULL)
        return PyErr_NoMemory();
    Py_ssize_t m = 0;
    PyObject *result = Py_False;
    Py_buffer held[MAXFIELDS + MAXOBS];
    const char *nsrc[MAXOBS];
    int nheld = 0;
    char *src[MAXFIELDS];
    int r = parse_lanes(self, lanes_arg, lanes, &m);
    if (r <= 0) {
        result = r < 0 ? NULL : Py_False;
        goto done;
    }
    for (int i = 0; i < nf; i++) {
        if (!get_input(self, &self->f[i], vals[i], &m, 1, &held[nheld]))
            goto done;
        src[i] = (char *)held[nheld++].buf;
    }
    for (int p = 0; p < nob; p++) {
        if (!get_input(self, &self->f[self->oi[p]], nv[p], &m, 1, &held[nheld]))
            goto done;
        nsrc[p] = (const char *)held[nheld++].buf;
    }
    int ordered = m == L;
    for (Py_ssize_t j = 0; ordered && j < m; j++)
        ordered = lanes[j] == j;
    /* every lane, in order and in step: the plan's all-lanes, in-step case */
    r = ordered && in_step(self) ? write_steps(self, src, nsrc, 1)
                                 : write_each(self, src, nsrc, lanes, m);
    result = r < 0 ? NULL : Py_True;
done:
    for (int i = 0; i < nheld; i++)
        PyBuffer_Release(&held[i]);
    if (L > STACK_ITEMS)
        PyMem_Free(lanes);
    Py_XINCREF(result);
    return result;
}

static PyObject *
Appender_add_lanes_body(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "add_lanes(lanes, obs, action, reward, next_obs, "
                                         "terminated, truncated, extras)");
        return NULL;
    }
    PyObject *vals[MAXFIELDS], *ov[MAXOBS], *nv[MAXOBS];
    if (!call_values(self, args + 1, vals, ov, nv))
        Py_RETURN_FALSE;
    PyObject *result = lanes_values(self, args[0], vals, nv);
    release_call(self, vals, ov, nv);
    return result;
}

/* rows_add_lanes(lanes, values): one step of the lanes `lanes` of a rows table. */
static PyObject *
Appender_rows_add_lanes_body(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "rows_add_lanes(lanes, values)");
        return NULL;
    }
    PyObject *const *vals = row_values(self, args[1]);
    if (vals == NULL)
        Py_RETURN_FALSE;
    return lanes_values(self, args[0], vals, NULL);
}

/* ------------------------------------------------------------------ extend */
/* n steps of every lane (in step): vals[0..nf) the fields' [n, ...] values in field
 * order, nv[0..nob) each obs field's next observations; as add_values. */
static PyObject *
extend_values(Appender *self, PyObject *const *vals, PyObject *const *nv)
{
    const int nf = self->nf, nob = self->nob;
    const Py_ssize_t T = self->T, L = self->L;
    Py_ssize_t n;
    int nlead = L == 1 ? 1 : 2; /* one env: [n, *shape], or with a lane dim of 1 */
    Py_buffer in[MAXFIELDS + MAXOBS];
    char *src[MAXFIELDS];
    const char *nsrc[MAXOBS];
    int nin = 0;
    PyObject *result = Py_False;
    if (!in_step(self) || (PyObject *)Py_TYPE(vals[0]) != self->ndarray_type)
        goto done;
    {
        Py_buffer probe;
        if (PyObject_GetBuffer(vals[0], &probe, PyBUF_RECORDS_RO) < 0) {
            PyErr_Clear();
            goto done;
        }
        n = probe.ndim ? probe.shape[0] : 0;
        if (L == 1 && probe.ndim == self->f[0].ndim + 2)
            nlead = 2;
        PyBuffer_Release(&probe);
    }
    Py_ssize_t start = (Py_ssize_t)(meta(&self->written)[0] % T);
    if (n < 1 || start + n > T) /* empty or wrapping chunks: the Python paths */
        goto done;
    if (self->durable && meta(&self->counts)[0] + n > T && n > self->max_evict)
        goto done; /* files: long evicting writes go in chunks (the Python paths) */
    const Py_ssize_t lead[2] = {n, L};
    for (int i = 0; i < nf + nob; i++) {
        Field *f = &self->f[i < nf ? i : self->oi[i - nf]];
        if (!get_input(self, f, i < nf ? vals[i] : nv[i - nf], lead, nlead, &in[nin]))
            goto done;
        nin++;
    }
    for (int i = 0; i < nf; i++)
        src[i] = (char *)in[i].buf;
    for (int p = 0; p < nob; p++)
        nsrc[p] = (const char *)in[nf + p].buf;
    result = write_steps(self, src, nsrc, n) < 0 ? NULL : Py_True;
done:
    for (int i = 0; i < nin; i++)
        PyBuffer_Release(&in[i]);
    Py_XINCREF(result);
    return result;
}

static PyObject *
Appender_extend_body(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "extend(obs, action, reward, next_obs, terminated, truncated, extras)");
        return NULL;
    }
    PyObject *vals[MAXFIELDS], *ov[MAXOBS], *nv[MAXOBS];
    if ((!self->rows && self->okey[0] == NULL
         && (PyObject *)Py_TYPE(args[0]) != self->ndarray_type)
        || !call_values(self, args, vals, ov, nv))
        Py_RETURN_FALSE;
    PyObject *result = extend_values(self, vals, nv);
    release_call(self, vals, ov, nv);
    return result;
}

/* rows_extend(values): n steps of every lane of a rows table, values in field order. */
static PyObject *
Appender_rows_extend_body(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "rows_extend(values)");
        return NULL;
    }
    PyObject *const *vals = row_values(self, args[0]);
    if (vals == NULL)
        Py_RETURN_FALSE;
    return extend_values(self, vals, NULL);
}

/* ------------------------------------------------------------------ type */
static void
Appender_dealloc(Appender *self)
{
    for (int i = 0; i < self->nf; i++) {
        PyBuffer_Release(&self->f[i].store);
        Py_XDECREF(self->f[i].name);
    }
    Py_buffer *m[4] = {&self->link, &self->written, &self->counts, &self->episodes};
    for (int i = 0; i < self->nmeta; i++)
        PyBuffer_Release(m[i]);
    if (self->has_start)
        PyBuffer_Release(&self->start);
    Py_XDECREF(self->table);
    Py_XDECREF(self->ndarray_type);
    Py_XDECREF(self->bool_type);
    Py_XDECREF(self->guard);
    for (int p = 0; p < self->nob; p++) {
        Py_XDECREF(self->okey[p]);
        Py_XDECREF(self->oside[p]);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Appender(side_store, ndarray, bool_, fields, link, written, counts, episodes, lanes,
 *          durable=False, start=None, max_evict=0, guard=None, obs_keys=None, rows=False)
 * fields: 5 tuples (flat_store, format, item_shape, kind, lo, hi) in the order obs (a dict
 * observation: its first field), action, reward, terminated, truncated, then one
 * (flat_store, format, item_shape, kind, lo, hi, name) per extra field (at most MAXEXTRA,
 * distinct str names: the keys of the extras dict, which must then hold exactly these
 * keys), then (a dict observation) one (flat_store, format, item_shape, "-", 0, 0) per
 * further obs field; obs_keys: None (a flat obs: the side store array "obs"), or one
 * (key, side_array_name) str pair per obs field (at most MAXOBS, distinct keys: obs and
 * next_obs must then be plain dicts with exactly these keys); link: flat int32 [T * lanes];
 * written, counts, episodes, start: int64 [lanes]; durable: the crash-safe order;
 * max_evict: the most steps a durable extend may evict in one call; guard: the owning
 * buffer's GuardState (add/extend/add_lanes refuse other threads' calls); rows: a rows
 * table (obs_keys None; the 5 "standard" field tuples are then any 3 of its fields followed
 * by terminated and truncated, f[0] the one that shows the leading dims; no side data),
 * written only by the rows_* methods. Zero-size fields are refused (the Python paths
 * serve them). */
static int
Appender_init(Appender *self, PyObject *args, PyObject *kwds)
{
    PyObject *table, *nd, *bt, *fields, *link, *written, *counts, *episodes;
    PyObject *start = Py_None, *guard = Py_None, *obs_keys = Py_None;
    Py_ssize_t lanes, max_evict = 0;
    int durable = 0, rows = 0;
    (void)kwds;
    if (!PyArg_ParseTuple(args, "OOOOOOOOn|pOnOOp", &table, &nd, &bt, &fields, &link, &written,
                          &counts, &episodes, &lanes, &durable, &start, &max_evict, &guard,
                          &obs_keys, &rows))
        return -1;
    if (rows && obs_keys != Py_None) {
        PyErr_SetString(PyExc_ValueError, "Appender: a rows table has no obs_keys");
        return -1;
    }
    if (guard != Py_None && !PyObject_TypeCheck(guard, &GuardStateType)) {
        PyErr_SetString(PyExc_TypeError, "Appender: guard must be a GuardState or None");
        return -1;
    }
    if (self->table != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Appender is initialised once");
        return -1;
    }
    if (!PyTuple_Check(fields) || PyTuple_GET_SIZE(fields) < NSTD
        || PyTuple_GET_SIZE(fields) > MAXFIELDS || lanes < 1 || lanes > PY_SSIZE_T_MAX / 8) {
        PyErr_SetString(PyExc_ValueError, "fields: a tuple of 5 standard field tuples and at "
                                          "most 16 extra field tuples; lanes >= 1");
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
        PyErr_SetString(PyExc_ValueError, "Appender: at most 16 extra fields");
        return -1;
    }
    Py_INCREF(table);
    self->table = table;
    self->nx = nx;
    self->rows = rows;
    if (rows) {
        self->nob = 0;
    } else if (obs_keys == Py_None) {
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
    Py_INCREF(bt);
    self->bool_type = bt;
    self->L = lanes;
    self->durable = durable;
    self->max_evict = max_evict;
    for (int i = 0; i < nfields; i++) {
        Field *f = &self->f[i];
        PyObject *store, *shape, *name = NULL;
        const char *fmt, *kind;
        long long lo, hi;
        PyObject *spec = PyTuple_GET_ITEM(fields, i);
        if (!PyTuple_Check(spec)) {
            PyErr_SetString(PyExc_TypeError, "Appender: each field is a tuple");
            return -1;
        }
        if (!PyArg_ParseTuple(spec, "OsOsLL|O", &store, &fmt, &shape, &kind, &lo, &hi, &name))
            return -1;
        const int extra = i >= NSTD && i < NSTD + nx;
        if (extra != (name != NULL) || (name != NULL && !PyUnicode_CheckExact(name))) {
            PyErr_SetString(PyExc_ValueError, "Appender: extra fields (and only they) end "
                                              "with their name, a str");
            return -1;
        }
        for (int j = NSTD; name != NULL && j < i; j++) {
            if (PyUnicode_Compare(name, self->f[j].name) == 0) {
                PyErr_SetString(PyExc_ValueError, "Appender: extra field names must differ");
                return -1;
            }
        }
        if (strlen(fmt) >= sizeof(f->fmt) || strlen(kind) != 1 || !PyTuple_Check(shape)
            || PyTuple_GET_SIZE(shape) > MAXDIM) {
            PyErr_SetString(PyExc_ValueError, "Appender: unsupported field format or shape");
            return -1;
        }
        if (get_store(store, &f->store) < 0)
            return -1;
        self->nf = i + 1;
        if (name != NULL) {
            Py_INCREF(name);
            PyUnicode_InternInPlace(&name);
            f->name = name;
            self->xkey[i - NSTD] = name;
        }
        strcpy(f->fmt, fmt);
        f->itemsize = f->store.itemsize;
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
        f->kind = kind[0];
        if (i >= NSTD + nx && f->kind != '-') {
            PyErr_SetString(PyExc_ValueError, "Appender: obs fields take arrays only (kind -)");
            return -1;
        }
        f->isbool = strcmp(fmt, "?") == 0;
        f->lo = lo;
        f->hi = hi;
        if (f->nbytes == 0) { /* nothing to copy, and no slot size to bound a link by */
            PyErr_SetString(PyExc_ValueError, "Appender: zero-size fields take the Python paths");
            return -1;
        }
        if (f->kind != '-' && f->nbytes > 8) {
            PyErr_SetString(PyExc_ValueError, "Appender: scalar fields of at most 8 bytes");
            return -1;
        }
    }
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
    if (self->f[3].nbytes != 1 || self->f[4].nbytes != 1 || self->f[3].kind != 'b'
        || self->f[4].kind != 'b') {
        PyErr_SetString(PyExc_ValueError, "Appender: terminated/truncated must be bool scalars");
        return -1;
    }
    self->ready = 1;
    return 0;
}

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

static PyMethodDef lane_functions[] = {
    {"arm", lane_arm, METH_O, "Test hook: kill before the n-th durable store from now (0: off)."},
    {"store_point", lane_store_point, METH_NOARGS,
     "Test hook: count one durable store (REPLAYBANK_KILL_AT kills before the n-th)."},
    {"kill_at", lane_kill_at, METH_NOARGS, "REPLAYBANK_KILL_AT as read at import (0: unset)."},
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
            Py_RETURN_FALSE;                                                       \
        PyObject *r = name##_body(self, args, nargs);                              \
        if (g > 0)                                                                 \
            self->guard->busy = 0;                                                 \
        return r;                                                                  \
    }
GUARDED(Appender_add)
GUARDED(Appender_add_lanes)
GUARDED(Appender_extend)
GUARDED(Appender_rows_add)
GUARDED(Appender_rows_add_lanes)
GUARDED(Appender_rows_extend)

static PyMethodDef Appender_methods[] = {
    {"add", (PyCFunction)(void (*)(void))Appender_add, METH_FASTCALL,
     "add(obs, action, reward, next_obs, terminated, truncated, extras) -> bool"},
    {"add_lanes", (PyCFunction)(void (*)(void))Appender_add_lanes, METH_FASTCALL,
     "add_lanes(lanes, obs, action, reward, next_obs, terminated, truncated, extras) -> bool"},
    {"extend", (PyCFunction)(void (*)(void))Appender_extend, METH_FASTCALL,
     "extend(obs, action, reward, next_obs, terminated, truncated, extras) -> bool"},
    {"rows_add", (PyCFunction)(void (*)(void))Appender_rows_add, METH_FASTCALL,
     "rows_add(values) -> bool: one step of every lane of a rows table"},
    {"rows_add_lanes", (PyCFunction)(void (*)(void))Appender_rows_add_lanes, METH_FASTCALL,
     "rows_add_lanes(lanes, values) -> bool: one step of some lanes of a rows table"},
    {"rows_extend", (PyCFunction)(void (*)(void))Appender_rows_extend, METH_FASTCALL,
     "rows_extend(values) -> bool: n steps of every lane of a rows table"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject AppenderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "replaybank._lane.Appender",
    .tp_doc = "Compiled add/extend of one in-memory lane (see LaneWriter).",
    .tp_basicsize = sizeof(Appender),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Appender_init,
    .tp_dealloc = (destructor)Appender_dealloc,
    .tp_methods = Appender_methods,
};

static struct PyModuleDef lanemodule = {
    PyModuleDef_HEAD_INIT, "_lane", "Compiled add/extend of in-memory step tables.", -1,
    lane_functions, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__lane(void)
{
    const char *kill = getenv("REPLAYBANK_KILL_AT");
    kill_at = kill != NULL ? strtoll(kill, NULL, 10) : 0;
    if (kill_at < 0)
        kill_at = 0;
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
    Py_INCREF(&AppenderType);
    if (PyModule_AddObject(m, "Appender", (PyObject *)&AppenderType) < 0) {
        Py_DECREF(&AppenderType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&GuardStateType);
    if (PyModule_AddObject(m, "GuardState", (PyObject *)&GuardStateType) < 0) {
        Py_DECREF(&GuardStateType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
