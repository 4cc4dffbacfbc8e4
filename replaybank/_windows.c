/* The compiled row gather of window batches: replaybank._windows.
 *
 * A sequence batch is a few gathers of whole rows (every field of every step of B
 * windows) and a frame-stack batch is one more; numpy's ndarray.take copies one field per
 * call. take_rows copies the rows of every field of a batch in one call, with the rows a
 * few steps ahead prefetched, so the cache and TLB misses of consecutive rows (one page
 * apart in a multi-lane table) overlap.
 *
 *   take_rows(jobs)   jobs: a tuple of (src, idx, out) triples; for each,
 *                     out[i] = src[idx[i]] (rows of src along its first axis)
 *
 * Its numpy oracle is replaybank/ops/windows.py, take_rows (ndarray.take per job); the
 * tests compare them on random cases. replaybank/ops/windows_c.py is the module that
 * replaybank.ops.jit.pick_kernel loads; callers never reach this module directly.
 *
 * Arrays come through the buffer protocol (no numpy headers are needed to build). Every
 * argument of every job is checked before any byte is copied: src, idx and out must be
 * C-contiguous, idx int64, out writable and exactly len(idx) rows of src's row size, src
 * not an object array, and every index in [0, len(src)); a wrong call raises instead of
 * reading or writing out of bounds. The copies run without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAXJOBS 64      /* fields per call (a batch has a handful) */
#define AHEAD 8         /* rows prefetched ahead of the copy */
#define PF_BYTES 256    /* bytes of each row prefetched (the hardware streams the rest) */

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch((p), 0, 3)
#else
#define PREFETCH(p) ((void)0)
#endif

typedef struct {
    Py_buffer src, idx, out;
    int held;            /* bit 0 src, 1 idx, 2 out */
    const char *s;
    const int64_t *ix;
    char *o;
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
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 3) {
        PyErr_Format(PyExc_TypeError, "replaybank._windows.take_rows: job %zd must be a "
                     "(src, idx, out) tuple", j);
        return -1;
    }
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
    if (job->out.len != job->n * job->row) {
        PyErr_Format(PyExc_ValueError, "replaybank._windows.take_rows: job %zd: out holds "
                     "%zd bytes, %zd rows of %zd bytes need %zd", j, job->out.len, job->n,
                     job->row, job->n * job->row);
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

static void
copy_job(const Job *job)
{
    const char *s = job->s;
    const int64_t *ix = job->ix;
    char *o = job->o;
    Py_ssize_t n = job->n, row = job->row;
    switch (row) {  /* one-number rows: a typed load and store */
    case 1:
        for (Py_ssize_t i = 0; i < n; i++)
            o[i] = s[ix[i]];
        return;
    case 4:
        for (Py_ssize_t i = 0; i < n; i++)
            memcpy(o + 4 * i, s + 4 * ix[i], 4);
        return;
    case 8:
        for (Py_ssize_t i = 0; i < n; i++)
            memcpy(o + 8 * i, s + 8 * ix[i], 8);
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

static PyMethodDef windows_functions[] = {
    {"take_rows", take_rows, METH_O,
     "take_rows(jobs): out[i] = src[idx[i]] for each (src, idx, out) of the tuple jobs."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef windowsmodule = {
    PyModuleDef_HEAD_INIT, "_windows",
    "Row gathers of window batches (see replaybank/_windows.c).", -1, windows_functions,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__windows(void)
{
    return PyModule_Create(&windowsmodule);
}
