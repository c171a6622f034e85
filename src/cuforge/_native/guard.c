/*
 * cuforge._native._guard -- release calls that cannot break a stream capture.
 *
 * CUDA prohibits "potentially unsafe" calls (synchronous frees, graph and
 * library destruction, ...) on a thread that is bound by a stream capture in
 * global or thread-local mode, and such a call invalidates the capture.  The
 * Python side (cuforge.runtime.capture_guard) defers releases while a capture
 * cuforge began forbids them; for captures cuforge cannot see (begun by another
 * library) every release made here runs with the calling thread's capture
 * interaction mode switched to RELAXED for the one call, which CUDA documents
 * as lifting that prohibition for this thread, and restores the mode after.
 *
 * relaxed_call(entry, a0[, a1]) -> CUresult
 *     entry(a0) or entry(a0, a1), pointer-sized arguments, in relaxed mode.
 * free_on_stream(entry, ptr, stream) -> CUresult, or -1 when ``stream`` is
 *     capturing (or cannot be queried): the stream-ordered free ``entry(ptr,
 *     stream)`` would be recorded into that capture, so the caller defers it.
 * stream_capturing(stream) -> 0 (no capture), 1 (capturing or invalidated
 *     capture), -CUresult when the query itself fails (e.g. the legacy stream
 *     while a blocking stream captures: an implicit capture).
 *
 * set_entries(exchange, is_capturing) installs cuThreadExchangeStreamCaptureMode
 * and cuStreamIsCapturing (addresses from cuGetProcAddress) once.  The GIL is
 * released around driver calls, as cuda-bindings does.  No CUDA header is
 * included: the signatures below are the ABI.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef int (*exchange_fn)(int *mode);
typedef int (*is_capturing_fn)(void *stream, int *status);
typedef int (*call1_fn)(void *a0);
typedef int (*call2_fn)(void *a0, void *a1);

enum { MODE_RELAXED = 2 }; /* CU_STREAM_CAPTURE_MODE_RELAXED */

static exchange_fn exchange_entry = NULL;
static is_capturing_fn is_capturing_entry = NULL;

static int as_ptr(PyObject *obj, void **out) {
    *out = PyLong_AsVoidPtr(obj);
    return (*out == NULL && PyErr_Occurred()) ? -1 : 0;
}

/* Runs without the GIL. */
static int call_relaxed(void *entry, int nargs, void *a0, void *a1) {
    int mode = MODE_RELAXED;
    int switched = exchange_entry != NULL && exchange_entry(&mode) == 0;
    int result = nargs == 1 ? ((call1_fn)entry)(a0) : ((call2_fn)entry)(a0, a1);
    if (switched) exchange_entry(&mode); /* mode now holds the thread's previous one */
    return result;
}

/* Runs without the GIL: 0 none, 1 capturing/invalidated, -err on failure. */
static int query_stream(void *stream) {
    if (is_capturing_entry == NULL) return -999; /* unknown: callers treat as capturing */
    int status = 0;
    int err = is_capturing_entry(stream, &status);
    if (err != 0) return -err;
    return status != 0;
}

static PyObject *set_entries(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *ex, *isc;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_entries(exchange, is_capturing)");
        return NULL;
    }
    if (as_ptr(args[0], &ex) || as_ptr(args[1], &isc)) return NULL;
    exchange_entry = (exchange_fn)ex;
    is_capturing_entry = (is_capturing_fn)isc;
    Py_RETURN_NONE;
}

static PyObject *relaxed_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *entry, *a0 = NULL, *a1 = NULL;
    if (nargs != 2 && nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "relaxed_call(entry, a0[, a1])");
        return NULL;
    }
    if (as_ptr(args[0], &entry) || as_ptr(args[1], &a0)) return NULL;
    if (nargs == 3 && as_ptr(args[2], &a1)) return NULL;
    if (entry == NULL) {
        PyErr_SetString(PyExc_ValueError, "relaxed_call: no driver entry point");
        return NULL;
    }
    int result;
    Py_BEGIN_ALLOW_THREADS
    result = call_relaxed(entry, (int)nargs - 1, a0, a1);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(result);
}

static PyObject *free_on_stream(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *entry, *ptr, *stream;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "free_on_stream(entry, ptr, stream)");
        return NULL;
    }
    if (as_ptr(args[0], &entry) || as_ptr(args[1], &ptr) || as_ptr(args[2], &stream))
        return NULL;
    if (entry == NULL) {
        PyErr_SetString(PyExc_ValueError, "free_on_stream: no driver entry point");
        return NULL;
    }
    int result;
    Py_BEGIN_ALLOW_THREADS
    result = query_stream(stream) == 0 ? call_relaxed(entry, 2, ptr, stream) : -1;
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(result);
}

static PyObject *stream_capturing(PyObject *self, PyObject *arg) {
    (void)self;
    void *stream;
    if (as_ptr(arg, &stream)) return NULL;
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = query_stream(stream);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(r);
}

static PyMethodDef methods[] = {
    {"set_entries", (PyCFunction)(void (*)(void))set_entries, METH_FASTCALL,
     "set_entries(exchange, is_capturing): install the two driver entry points."},
    {"relaxed_call", (PyCFunction)(void (*)(void))relaxed_call, METH_FASTCALL,
     "relaxed_call(entry, a0[, a1]) -> CUresult, with this thread in relaxed capture mode."},
    {"free_on_stream", (PyCFunction)(void (*)(void))free_on_stream, METH_FASTCALL,
     "free_on_stream(entry, ptr, stream) -> CUresult, or -1 if the stream is capturing."},
    {"stream_capturing", stream_capturing, METH_O,
     "stream_capturing(stream) -> 0 none, 1 capturing, -CUresult if the query fails."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cuforge._native._guard",
    "Driver release calls that cannot invalidate a stream capture.", -1, methods,
};

PyMODINIT_FUNC PyInit__guard(void) { return PyModule_Create(&module); }
