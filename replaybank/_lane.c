/* Compiled add/extend for one in-memory lane: replaybank._lane.Appender.
 *
 * An optional accelerator of replaybank.storage.lane_writer.LaneWriter (the Python code
 * there is the reference and the fallback). Appender.add / Appender.extend accept only
 * the plainest calls: C-contiguous numpy arrays of exactly the stored format and shape
 * (or Python scalars for scalar fields), no extras. Anything else returns False before a
 * byte is written and the Python paths take over. What is written is exactly what
 * LaneWriter.add / LaneWriter.extend write: data rows, links, side slots (same free-slot
 * order) and counters; tests/test_fastpath.py compares the whole table state with the
 * general path.
 *
 * Storage is reached through the buffer protocol (no numpy headers needed to build).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define NFIELDS 5 /* obs, action, reward, terminated, truncated */
#define MAXDIM 8

typedef struct {
    Py_buffer store;           /* flat [T, *shape] storage, C-contiguous */
    char fmt[16];              /* buffer format of the dtype (e.g. "f", "?", "l") */
    Py_ssize_t itemsize;
    int ndim;                  /* item ndim */
    Py_ssize_t shape[MAXDIM];  /* item shape */
    Py_ssize_t nbytes;         /* bytes of one step */
    char kind;                 /* scalar fields: 'f', 'i', 'u', 'b'; 0 otherwise */
    long long lo, hi;          /* int range of an int scalar field */
    unsigned long long uhi;    /* range of an unsigned scalar field */
} Field;

typedef struct {
    PyObject_HEAD
    Field f[NFIELDS];
    int nf;                    /* fields initialised (for dealloc) */
    Py_buffer link, written, counts, episodes;
    int nmeta;
    PyObject *table;
    PyObject *ndarray_type;
    PyObject *bool_type;
    Py_ssize_t T;
} Appender;

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

/* An input array of this field with `lead` leading steps (-1: one step, no lead).
 * 1: accepted (view filled, release it); 0: not for this path. */
static int
get_input(Appender *self, Field *f, PyObject *v, Py_ssize_t lead, Py_buffer *view)
{
    if ((PyObject *)Py_TYPE(v) != self->ndarray_type)
        return 0;
    if (PyObject_GetBuffer(v, view, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        return 0;
    }
    int off = lead >= 0 ? 1 : 0;
    int ok = view->ndim == f->ndim + off && view->itemsize == f->itemsize
             && strcmp(view->format ? view->format : "B", f->fmt) == 0
             && PyBuffer_IsContiguous(view, 'C');
    if (ok && off)
        ok = view->shape[0] == lead;
    for (int i = 0; ok && i < f->ndim; i++)
        ok = view->shape[i + off] == f->shape[i];
    if (!ok) {
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

/* One step's value of a field into `dst` (f->nbytes bytes). 1: done; 0: not here; -1: error. */
static int
one_value(Appender *self, Field *f, PyObject *v, char *dst)
{
    if ((PyObject *)Py_TYPE(v) == self->ndarray_type) {
        Py_buffer view;
        if (!get_input(self, f, v, -1, &view))
            return 0;
        memcpy(dst, view.buf, (size_t)f->nbytes);
        PyBuffer_Release(&view);
        return 1;
    }
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
        if (!PyFloat_Check(v)) /* float and numpy float64 (a float subclass) */
            return 0;
        {
            double d = PyFloat_AS_DOUBLE(v);
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
            if (overflow)
                return 0;
            if (f->kind == 'i' ? (x < f->lo || x > f->hi)
                               : (x < 0 || (unsigned long long)x > f->uhi))
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

/* The side store of obs as a buffer (it may have been reallocated). */
static int
side_view(Appender *self, Py_buffer *view)
{
    PyObject *side = PyObject_GetAttr(self->table, s_side);
    if (side == NULL)
        return -1;
    PyObject *arr = PyObject_GetItem(side, s_obs);
    Py_DECREF(side);
    if (arr == NULL)
        return -1;
    int r = PyObject_GetBuffer(arr, view, PyBUF_CONTIG);
    Py_DECREF(arr);
    return r;
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

/* Pop the last free slot; -1 on error. */
static long long
free_pop(PyObject *free)
{
    Py_ssize_t n = PyList_GET_SIZE(free);
    long long slot = PyLong_AsLongLong(PyList_GET_ITEM(free, n - 1));
    if (slot == -1 && PyErr_Occurred())
        return -1;
    if (PyList_SetSlice(free, n - 1, n, NULL) < 0)
        return -1;
    return slot;
}

/* k slots in table._alloc(k) order (popped from the free list, or the side store grows
 * first); 0 ok, -1 error. */
static int
take_slots(Appender *self, PyObject *free, Py_ssize_t k, long long *out)
{
    if (PyList_GET_SIZE(free) >= k) { /* same slots, same order as table._alloc(k) */
        for (Py_ssize_t j = 0; j < k; j++) {
            out[j] = free_pop(free);
            if (out[j] < 0)
                return -1;
        }
        return 0;
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
    for (Py_ssize_t j = 0; j < k; j++) {
        out[j] = PyLong_AsLongLong(PyList_GET_ITEM(lst, j));
        if (out[j] == -1 && PyErr_Occurred()) {
            Py_DECREF(lst);
            return -1;
        }
    }
    Py_DECREF(lst);
    return 0;
}

/* ------------------------------------------------------------------ add */
static PyObject *
Appender_add(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "add(obs, action, reward, next_obs, terminated, truncated, extras)");
        return NULL;
    }
    PyObject *extras = args[6];
    if (!PyDict_CheckExact(extras) || PyDict_GET_SIZE(extras) != 0)
        Py_RETURN_FALSE;
    PyObject *vals[NFIELDS] = {args[0], args[1], args[2], args[4], args[5]};
    PyObject *nobs_obj = args[3];
    Field *fo = &self->f[0];
    Py_buffer ob, nb;
    if (!get_input(self, fo, vals[0], -1, &ob))
        Py_RETURN_FALSE;
    if (!get_input(self, fo, nobs_obj, -1, &nb)) {
        PyBuffer_Release(&ob);
        Py_RETURN_FALSE;
    }
    char small[NFIELDS][64];
    char *src[NFIELDS];
    Py_buffer held[NFIELDS];
    int nheld = 0;
    PyObject *result = NULL;
    src[0] = (char *)ob.buf;
    for (int i = 1; i < NFIELDS; i++) {
        Field *f = &self->f[i];
        if (f->nbytes <= 64 && (PyObject *)Py_TYPE(vals[i]) != self->ndarray_type) {
            int r = one_value(self, f, vals[i], small[i]);
            if (r < 0)
                goto done;
            if (r == 0) {
                result = Py_False;
                goto done;
            }
            src[i] = small[i];
        } else {
            if (!get_input(self, f, vals[i], -1, &held[nheld])) {
                result = Py_False;
                goto done;
            }
            src[i] = (char *)held[nheld].buf;
            nheld++;
        }
    }
    {
        /* decided: write (same order and side-slot use as LaneWriter.add) */
        PyObject *free = PyObject_GetAttr(self->table, s_free);
        if (free == NULL)
            goto done;
        if (!PyList_CheckExact(free)) {
            Py_DECREF(free);
            PyErr_SetString(PyExc_TypeError, "table._free must be a list");
            goto done;
        }
        Py_ssize_t T = self->T;
        int32_t *link = (int32_t *)self->link.buf;
        char *term_s = (char *)self->f[3].store.buf, *trunc_s = (char *)self->f[4].store.buf;
        int64_t w = meta(&self->written)[0], c = meta(&self->counts)[0];
        Py_ssize_t row = (Py_ssize_t)(w % T);
        int err = 0;
        if (c == T && link[row])
            err = free_append(free, link[row] - 1);
        long long relink = 0;
        Py_ssize_t prow = row ? row - 1 : T - 1;
        Py_buffer sv;
        int have_side = 0;
        if (!err && c && T > 1) {
            relink = link[prow];
            if (relink && (term_s[prow] || trunc_s[prow]))
                relink = 0;
            if (relink) {
                if (side_view(self, &sv) < 0) {
                    err = 1;
                } else {
                    have_side = 1;
                    if (memcmp((char *)sv.buf + (relink - 1) * fo->nbytes, src[0],
                               (size_t)fo->nbytes) != 0)
                        relink = 0;
                }
            }
        }
        long long slot = 0;
        if (!err) {
            if (PyList_GET_SIZE(free)) {
                slot = free_pop(free);
                err = slot < 0;
            } else {
                if (have_side) {
                    PyBuffer_Release(&sv);
                    have_side = 0;
                }
                err = take_slots(self, free, 1, &slot) < 0;
            }
        }
        if (!err && !have_side) {
            err = side_view(self, &sv) < 0;
            have_side = !err;
        }
        if (!err) {
            memcpy((char *)sv.buf + slot * fo->nbytes, nb.buf, (size_t)fo->nbytes);
            for (int i = 0; i < NFIELDS; i++) {
                Field *f = &self->f[i];
                memcpy((char *)f->store.buf + row * f->nbytes, src[i], (size_t)f->nbytes);
            }
            link[row] = (int32_t)(slot + 1);
            if (relink) {
                link[prow] = 0;
                err = free_append(free, relink - 1) < 0;
            }
            meta(&self->written)[0] = w + 1;
            if (c < T)
                meta(&self->counts)[0] = c + 1;
            if (src[3][0] || src[4][0])
                meta(&self->episodes)[0] += 1;
        }
        if (have_side)
            PyBuffer_Release(&sv);
        Py_DECREF(free);
        if (!err)
            result = Py_True;
    }
done:
    for (int i = 0; i < nheld; i++)
        PyBuffer_Release(&held[i]);
    PyBuffer_Release(&ob);
    PyBuffer_Release(&nb);
    Py_XINCREF(result);
    return result;
}

/* ------------------------------------------------------------------ extend */
static PyObject *
Appender_extend(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "extend(obs, action, reward, next_obs, terminated, truncated, extras)");
        return NULL;
    }
    PyObject *extras = args[6];
    if (!PyDict_CheckExact(extras) || PyDict_GET_SIZE(extras) != 0)
        Py_RETURN_FALSE;
    PyObject *vals[NFIELDS] = {args[0], args[1], args[2], args[4], args[5]};
    if ((PyObject *)Py_TYPE(args[0]) != self->ndarray_type)
        Py_RETURN_FALSE;
    Py_buffer in[NFIELDS + 1];
    int nin = 0;
    PyObject *result = Py_False;
    long long *slots = NULL;
    Py_ssize_t n;
    {
        Py_buffer probe;
        if (PyObject_GetBuffer(args[0], &probe, PyBUF_RECORDS_RO) < 0) {
            PyErr_Clear();
            Py_RETURN_FALSE;
        }
        n = probe.ndim ? probe.shape[0] : -1;
        PyBuffer_Release(&probe);
    }
    Py_ssize_t T = self->T;
    int64_t w = meta(&self->written)[0], c = meta(&self->counts)[0];
    Py_ssize_t start = (Py_ssize_t)(w % T), end = start + n;
    if (n < 2 || end > T)
        Py_RETURN_FALSE;
    for (int i = 0; i < NFIELDS; i++) {
        if (!get_input(self, &self->f[i], vals[i], n, &in[nin]))
            goto done;
        nin++;
    }
    if (!get_input(self, &self->f[0], args[3], n, &in[nin]))
        goto done;
    nin++;
    {
        Field *fo = &self->f[0];
        Py_ssize_t ib = fo->nbytes;
        const char *obs = in[0].buf, *nobs = in[5].buf;
        const char *term = in[3].buf, *trunc = in[4].buf;
        int32_t *link = (int32_t *)self->link.buf;
        /* continuity: within each run between episode ends, next_obs[i] == obs[i + 1] */
        Py_ssize_t lo = 0, nstops = 0, ends = 0;
        for (Py_ssize_t hi = 0; hi < n; hi++) {
            int done_ = term[hi] || trunc[hi];
            ends += done_;
            if (done_ && hi < n - 1)
                nstops++;
            if (done_ || hi == n - 1) {
                if (hi > lo && memcmp(nobs + lo * ib, obs + (lo + 1) * ib,
                                      (size_t)((hi - lo) * ib)) != 0)
                    goto done; /* out-of-order data: the general path keeps it aside */
                lo = hi + 1;
            }
        }
        Py_ssize_t prow = (c && n < T) ? (start ? start - 1 : T - 1) : -1;
        char *term_s = (char *)self->f[3].store.buf, *trunc_s = (char *)self->f[4].store.buf;
        long long relink = 0;
        Py_buffer sv;
        if (side_view(self, &sv) < 0) {
            result = NULL;
            goto done;
        }
        if (prow >= 0) {
            relink = link[prow];
            if (relink && (term_s[prow] || trunc_s[prow]
                           || memcmp((char *)sv.buf + (relink - 1) * ib, obs, (size_t)ib) != 0))
                relink = 0;
        }
        PyBuffer_Release(&sv);
        /* decided: write (same order and side-slot use as LaneWriter.extend) */
        PyObject *free = PyObject_GetAttr(self->table, s_free);
        if (free == NULL) {
            result = NULL;
            goto done;
        }
        int err = !PyList_CheckExact(free);
        if (err)
            PyErr_SetString(PyExc_TypeError, "table._free must be a list");
        /* 1. evicted steps free their side slots (rows before T - c held no live step) */
        if (!err && c + n > T) {
            for (Py_ssize_t r = start + (Py_ssize_t)(T - c); r < end; r++) {
                if (link[r] && free_append(free, link[r] - 1) < 0) {
                    err = 1;
                    break;
                }
            }
        }
        if (!err) {
            /* 2. data, links of the chunk zeroed */
            for (int i = 0; i < NFIELDS; i++) {
                Field *f = &self->f[i];
                memcpy((char *)f->store.buf + start * f->nbytes, in[i].buf,
                       (size_t)(n * f->nbytes));
            }
            memset(link + start, 0, (size_t)n * sizeof(int32_t));
            /* 3. side slots: the episode ends inside the chunk and its newest step */
            Py_ssize_t k = nstops + 1;
            slots = PyMem_Malloc((size_t)k * sizeof(long long));
            if (slots == NULL) {
                PyErr_NoMemory();
                err = 1;
            } else if (take_slots(self, free, k, slots) < 0) {
                err = 1;
            } else if (side_view(self, &sv) < 0) {
                err = 1;
            } else {
                Py_ssize_t j = 0;
                for (Py_ssize_t r = 0; r < n; r++) {
                    if (r == n - 1 || term[r] || trunc[r]) {
                        memcpy((char *)sv.buf + slots[j] * ib, nobs + r * ib, (size_t)ib);
                        link[start + r] = (int32_t)(slots[j] + 1);
                        j++;
                    }
                }
                PyBuffer_Release(&sv);
            }
        }
        /* 4. the previous newest step continues here: release its slot; counters */
        if (!err && relink) {
            link[prow] = 0;
            err = free_append(free, relink - 1) < 0;
        }
        if (!err) {
            meta(&self->written)[0] = w + n;
            if (c != T)
                meta(&self->counts)[0] = c + n < T ? c + n : T;
            meta(&self->episodes)[0] += ends;
        }
        Py_DECREF(free);
        result = err ? NULL : Py_True;
    }
done:
    PyMem_Free(slots);
    for (int i = 0; i < nin; i++)
        PyBuffer_Release(&in[i]);
    Py_XINCREF(result);
    return result;
}

/* ------------------------------------------------------------------ type */
static void
Appender_dealloc(Appender *self)
{
    for (int i = 0; i < self->nf; i++)
        PyBuffer_Release(&self->f[i].store);
    Py_buffer *m[4] = {&self->link, &self->written, &self->counts, &self->episodes};
    for (int i = 0; i < self->nmeta; i++)
        PyBuffer_Release(m[i]);
    Py_XDECREF(self->table);
    Py_XDECREF(self->ndarray_type);
    Py_XDECREF(self->bool_type);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Appender(table, ndarray, bool_, fields, link, written, counts, episodes)
 * fields: 5 tuples (flat_store, format, item_shape, kind, lo, hi) in the order obs,
 * action, reward, terminated, truncated. */
static int
Appender_init(Appender *self, PyObject *args, PyObject *kwds)
{
    PyObject *table, *nd, *bt, *fields, *link, *written, *counts, *episodes;
    if (!PyArg_ParseTuple(args, "OOOOOOOO", &table, &nd, &bt, &fields, &link, &written,
                          &counts, &episodes))
        return -1;
    (void)kwds;
    if (self->table != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Appender is initialised once");
        return -1;
    }
    if (!PyTuple_Check(fields) || PyTuple_GET_SIZE(fields) != NFIELDS) {
        PyErr_SetString(PyExc_ValueError, "fields: a tuple of 5 field tuples");
        return -1;
    }
    Py_INCREF(table);
    self->table = table;
    Py_INCREF(nd);
    self->ndarray_type = nd;
    Py_INCREF(bt);
    self->bool_type = bt;
    for (int i = 0; i < NFIELDS; i++) {
        Field *f = &self->f[i];
        PyObject *store, *shape;
        const char *fmt, *kind;
        long long lo, hi;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(fields, i), "OsOsLL", &store, &fmt, &shape,
                              &kind, &lo, &hi))
            return -1;
        if (strlen(fmt) >= sizeof(f->fmt) || !PyTuple_Check(shape)
            || PyTuple_GET_SIZE(shape) > MAXDIM) {
            PyErr_SetString(PyExc_ValueError, "Appender: unsupported field format or shape");
            return -1;
        }
        if (get_store(store, &f->store) < 0)
            return -1;
        self->nf = i + 1;
        strcpy(f->fmt, fmt);
        f->itemsize = f->store.itemsize;
        f->ndim = (int)PyTuple_GET_SIZE(shape);
        f->nbytes = f->itemsize;
        for (int d = 0; d < f->ndim; d++) {
            f->shape[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
            if (f->shape[d] < 0 && PyErr_Occurred())
                return -1;
            f->nbytes *= f->shape[d];
        }
        f->kind = kind[0];
        f->lo = lo;
        f->hi = hi;
        f->uhi = (unsigned long long)hi;
    }
    PyObject *ms[4] = {link, written, counts, episodes};
    Py_buffer *mv[4] = {&self->link, &self->written, &self->counts, &self->episodes};
    for (int i = 0; i < 4; i++) {
        if (get_store(ms[i], mv[i]) < 0)
            return -1;
        self->nmeta = i + 1;
        if (mv[i]->itemsize != (i == 0 ? 4 : 8)) {
            PyErr_SetString(PyExc_ValueError, "Appender: link int32, counters int64");
            return -1;
        }
    }
    self->T = self->link.len / 4;
    return 0;
}

static PyMethodDef Appender_methods[] = {
    {"add", (PyCFunction)(void (*)(void))Appender_add, METH_FASTCALL,
     "add(obs, action, reward, next_obs, terminated, truncated, extras) -> bool"},
    {"extend", (PyCFunction)(void (*)(void))Appender_extend, METH_FASTCALL,
     "extend(obs, action, reward, next_obs, terminated, truncated, extras) -> bool"},
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
    PyModuleDef_HEAD_INIT, "_lane", "Compiled add/extend of one in-memory lane.", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__lane(void)
{
    s_free = PyUnicode_InternFromString("_free");
    s_side = PyUnicode_InternFromString("side");
    s_obs = PyUnicode_InternFromString("obs");
    s_alloc = PyUnicode_InternFromString("_alloc");
    if (!s_free || !s_side || !s_obs || !s_alloc)
        return NULL;
    if (PyType_Ready(&AppenderType) < 0)
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
    return m;
}
