/*
 * cuforge._native._launch -- the kernel launch call without per-call conversions.
 *
 * launch(entry, function, gx, gy, gz, bx, by, bz, shmem, stream, params) calls
 * the driver's cuLaunchKernel through ``entry``, the address cuGetProcAddress
 * returned for it, and returns the CUresult as an int.  Every argument is a
 * plain int (handles and the kernelParams array as addresses), so a launch
 * costs one vectorcall and one driver call; the GIL is released around the
 * driver call, as cuda-bindings does, because a full launch queue blocks.
 *
 * add_kernel_node(entry, graph, dep, kernel, ctx, dims, params) does the same for a
 * graph kernel node: it calls cuGraphAddKernelNode (the v12000 entry point, which
 * takes CUDA_KERNEL_NODE_PARAMS_v2) with at most one dependency and returns
 * (CUresult, node address).  ``dims`` is the 7-tuple (gx, gy, gz, bx, by, bz,
 * shmem); ``kernel`` is a CUkernel, run in context ``ctx`` (0: the current one).  The driver copies
 * the parameter struct and the argument values during the call.
 *
 * graph_launch(launch_entry, record_entry, exec, stream, event) calls cuGraphLaunch
 * and then, if it succeeded and event is not 0, cuEventRecord(event, stream): an
 * executable graph's launch and the event that tells when it is idle in one call.
 * Returns 0, the launch's CUresult, or minus the record's CUresult.
 *
 * launch_args(entry, function, dims, stream, codes, types, args) and
 * add_kernel_node_args(entry, graph, dep, kernel, ctx, dims, codes, types, args) are
 * the same calls with the kernel arguments packed here, from the argument tuple, by
 * ``codes`` (one byte per argument, see pack_args below): no Python-level packing
 * and no parameter memory outlives the call (the driver copies the values).  They
 * return -2 when ``types`` (a tuple, or None to skip the check) is not exactly the
 * tuple of the arguments' types -- the caller's cached plan is for other types --
 * and -1 for "not packable here" (closed Buffer, a value out of its type's range,
 * ...), both with no exception set: the caller then takes its general path, which
 * reports problems properly.  add_kernel_node_args also returns the tuple of the
 * Buffer arguments' allocations (what the node must keep alive).
 *
 * No CUDA header is included: the signatures and the struct below are the ABI.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_ARGS 64

typedef int (*launch_kernel_fn)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                unsigned by, unsigned bz, unsigned shmem, void *stream,
                                void **params, void **extra);

typedef struct {
    void *func;
    unsigned grid[3];
    unsigned block[3];
    unsigned shmem;
    void **kernel_params;
    void **extra;
    void *kern;
    void *ctx;
} kernel_node_params_v2;

typedef int (*add_kernel_node_fn)(void **node, void *graph, void *const *deps, size_t ndeps,
                                  const kernel_node_params_v2 *params);

static int as_uint(PyObject *obj, unsigned *out) {
    unsigned long v = PyLong_AsUnsignedLong(obj);
    if (v == (unsigned long)-1 && PyErr_Occurred()) return -1;
    if (v > 0xFFFFFFFFUL) {
        PyErr_SetString(PyExc_OverflowError, "launch dimension does not fit 32 bits");
        return -1;
    }
    *out = (unsigned)v;
    return 0;
}

static int as_ptr(PyObject *obj, void **out) {
    *out = PyLong_AsVoidPtr(obj);
    return (*out == NULL && PyErr_Occurred()) ? -1 : 0;
}

static PyObject *str_alloc = NULL, *str_ptr = NULL;

/* Pack args by codes into slots (8 bytes each) and params; returns 0, or -1 when
 * the general path must handle them (no exception left set).  With held != NULL,
 * the Buffer arguments' allocations are collected into a new tuple. */
static int pack_args(const char *codes, Py_ssize_t n, PyObject *types, PyObject *args,
                     uint64_t *slots, void **params, PyObject **held) {
    PyObject *allocs[MAX_ARGS];
    Py_ssize_t nalloc = 0;
    if (n > MAX_ARGS || PyTuple_GET_SIZE(args) != n) return -1;
    if (types != Py_None) {
        if (!PyTuple_Check(types) || PyTuple_GET_SIZE(types) != n) return -2;
        for (Py_ssize_t i = 0; i < n; i++)
            if ((PyObject *)Py_TYPE(PyTuple_GET_ITEM(args, i)) != PyTuple_GET_ITEM(types, i))
                return -2;
    }
    if (str_alloc == NULL) {
        str_alloc = PyUnicode_InternFromString("_alloc");
        str_ptr = PyUnicode_InternFromString("_ptr");
        if (str_alloc == NULL || str_ptr == NULL) goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyTuple_GET_ITEM(args, i);
        void *slot = &slots[i];
        slots[i] = 0;
        params[i] = slot;
        char c = codes[i];
        if (c == 'P') { /* a cuforge Buffer: its pointer, if not closed */
            PyObject *alloc = PyObject_GetAttr(a, str_alloc);
            if (alloc == NULL) goto fail;
            if (alloc == Py_None) {
                Py_DECREF(alloc);
                goto fail;
            }
            PyObject *p = PyObject_GetAttr(a, str_ptr);
            if (p == NULL) {
                Py_DECREF(alloc);
                goto fail;
            }
            unsigned long long v = PyLong_AsUnsignedLongLong(p);
            Py_DECREF(p);
            if (v == (unsigned long long)-1 && PyErr_Occurred()) {
                Py_DECREF(alloc);
                goto fail;
            }
            slots[i] = v;
            if (held != NULL) allocs[nalloc++] = alloc; /* reference kept */
            else Py_DECREF(alloc);
        } else if (c == 'd' || c == 'f') {
            double d = PyFloat_AsDouble(a);
            if (d == -1.0 && PyErr_Occurred()) goto fail;
            if (c == 'd') {
                memcpy(slot, &d, sizeof d);
            } else {
                if (isfinite(d) && fabs(d) > FLT_MAX) goto fail;
                float f = (float)d;
                memcpy(slot, &f, sizeof f);
            }
        } else if (c == '?') {
            int t = PyObject_IsTrue(a);
            if (t < 0) goto fail;
            *(unsigned char *)slot = (unsigned char)t;
        } else if (c == 'Q') {
            PyObject *idx = PyNumber_Index(a);
            if (idx == NULL) goto fail;
            unsigned long long v = PyLong_AsUnsignedLongLong(idx);
            Py_DECREF(idx);
            if (v == (unsigned long long)-1 && PyErr_Occurred()) goto fail;
            slots[i] = v;
        } else { /* signed or narrower integers */
            PyObject *idx = PyNumber_Index(a);
            if (idx == NULL) goto fail;
            long long v = PyLong_AsLongLong(idx);
            Py_DECREF(idx);
            if (v == -1 && PyErr_Occurred()) goto fail;
            switch (c) {
            case 'q': memcpy(slot, &v, 8); break;
            case 'i': if (v < INT32_MIN || v > INT32_MAX) goto fail;
                      { int32_t x = (int32_t)v; memcpy(slot, &x, 4); } break;
            case 'I': if (v < 0 || v > (long long)UINT32_MAX) goto fail;
                      { uint32_t x = (uint32_t)v; memcpy(slot, &x, 4); } break;
            case 'h': if (v < INT16_MIN || v > INT16_MAX) goto fail;
                      { int16_t x = (int16_t)v; memcpy(slot, &x, 2); } break;
            case 'H': if (v < 0 || v > UINT16_MAX) goto fail;
                      { uint16_t x = (uint16_t)v; memcpy(slot, &x, 2); } break;
            case 'b': if (v < INT8_MIN || v > INT8_MAX) goto fail;
                      { int8_t x = (int8_t)v; memcpy(slot, &x, 1); } break;
            case 'B': if (v < 0 || v > UINT8_MAX) goto fail;
                      { uint8_t x = (uint8_t)v; memcpy(slot, &x, 1); } break;
            default: goto fail;
            }
        }
    }
    if (held != NULL) {
        PyObject *t = PyTuple_New(nalloc);
        if (t == NULL) goto fail;
        for (Py_ssize_t j = 0; j < nalloc; j++) PyTuple_SET_ITEM(t, j, allocs[j]);
        *held = t;
    }
    return 0;
fail:
    PyErr_Clear();
    for (Py_ssize_t j = 0; j < nalloc; j++) Py_DECREF(allocs[j]);
    return -1;
}

static int parse_dims(PyObject *dims, unsigned out[7]) {
    if (!PyTuple_Check(dims) || PyTuple_GET_SIZE(dims) != 7) {
        PyErr_SetString(PyExc_TypeError, "dims must be a 7-tuple of ints");
        return -1;
    }
    for (int i = 0; i < 7; i++)
        if (as_uint(PyTuple_GET_ITEM(dims, i), &out[i])) return -1;
    return 0;
}

static PyObject *launch_args(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7 || !PyBytes_Check(args[4]) || !PyTuple_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError, "launch_args(entry, function, dims, stream, "
                                         "codes: bytes, types, args: tuple)");
        return NULL;
    }
    void *entry, *func, *stream;
    unsigned dims[7];
    if (as_ptr(args[0], &entry) || as_ptr(args[1], &func) || parse_dims(args[2], dims) ||
        as_ptr(args[3], &stream))
        return NULL;
    if (entry == NULL) {
        PyErr_SetString(PyExc_ValueError, "no cuLaunchKernel entry point");
        return NULL;
    }
    uint64_t slots[MAX_ARGS];
    void *params[MAX_ARGS];
    int packed = pack_args(PyBytes_AS_STRING(args[4]), PyBytes_GET_SIZE(args[4]), args[5],
                           args[6], slots, params, NULL);
    if (packed) return PyLong_FromLong(packed);
    int result;
    Py_BEGIN_ALLOW_THREADS
    result = ((launch_kernel_fn)entry)(func, dims[0], dims[1], dims[2], dims[3], dims[4],
                                       dims[5], dims[6], stream, params, NULL);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(result);
}

static PyObject *add_kernel_node_args(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 9 || !PyBytes_Check(args[6]) || !PyTuple_Check(args[8])) {
        PyErr_SetString(PyExc_TypeError, "add_kernel_node_args(entry, graph, dep, kernel, ctx, "
                                         "dims, codes: bytes, types, args: tuple)");
        return NULL;
    }
    void *entry, *graph, *dep, *kern, *ctx;
    unsigned dims[7];
    if (as_ptr(args[0], &entry) || as_ptr(args[1], &graph) || as_ptr(args[2], &dep) ||
        as_ptr(args[3], &kern) || as_ptr(args[4], &ctx) || parse_dims(args[5], dims))
        return NULL;
    if (entry == NULL) {
        PyErr_SetString(PyExc_ValueError, "no cuGraphAddKernelNode entry point");
        return NULL;
    }
    uint64_t slots[MAX_ARGS];
    void *params[MAX_ARGS];
    PyObject *held = NULL;
    int packed = pack_args(PyBytes_AS_STRING(args[6]), PyBytes_GET_SIZE(args[6]), args[7],
                           args[8], slots, params, &held);
    if (packed) return PyLong_FromLong(packed);
    kernel_node_params_v2 p = {0};
    p.grid[0] = dims[0], p.grid[1] = dims[1], p.grid[2] = dims[2];
    p.block[0] = dims[3], p.block[1] = dims[4], p.block[2] = dims[5];
    p.shmem = dims[6];
    p.kernel_params = PyTuple_GET_SIZE(args[8]) ? params : NULL;
    p.kern = kern;
    p.ctx = ctx;
    void *node = NULL;
    int result;
    Py_BEGIN_ALLOW_THREADS
    result = ((add_kernel_node_fn)entry)(&node, graph, dep ? &dep : NULL, dep ? 1 : 0, &p);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(iNN)", result, PyLong_FromVoidPtr(node), held);
}

static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "launch takes 11 int arguments");
        return NULL;
    }
    void *entry, *func, *stream, *params;
    unsigned dims[7];
    if (as_ptr(args[0], &entry) || as_ptr(args[1], &func)) return NULL;
    for (int i = 0; i < 7; i++)
        if (as_uint(args[2 + i], &dims[i])) return NULL;
    if (as_ptr(args[9], &stream) || as_ptr(args[10], &params)) return NULL;
    if (entry == NULL) {
        PyErr_SetString(PyExc_ValueError, "no cuLaunchKernel entry point");
        return NULL;
    }
    int result;
    Py_BEGIN_ALLOW_THREADS
    result = ((launch_kernel_fn)entry)(func, dims[0], dims[1], dims[2], dims[3], dims[4],
                                       dims[5], dims[6], stream, (void **)params, NULL);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(result);
}

static PyObject *add_kernel_node(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7 || !PyTuple_Check(args[5]) || PyTuple_GET_SIZE(args[5]) != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "add_kernel_node(entry, graph, dep, kernel, ctx, dims 7-tuple, params)");
        return NULL;
    }
    void *entry, *graph, *dep, *kern, *ctx, *params;
    if (as_ptr(args[0], &entry) || as_ptr(args[1], &graph) || as_ptr(args[2], &dep) ||
        as_ptr(args[3], &kern) || as_ptr(args[4], &ctx) || as_ptr(args[6], &params))
        return NULL;
    if (entry == NULL) {
        PyErr_SetString(PyExc_ValueError, "no cuGraphAddKernelNode entry point");
        return NULL;
    }
    kernel_node_params_v2 p = {0};
    unsigned dims[7];
    for (int i = 0; i < 7; i++)
        if (as_uint(PyTuple_GET_ITEM(args[5], i), &dims[i])) return NULL;
    p.grid[0] = dims[0], p.grid[1] = dims[1], p.grid[2] = dims[2];
    p.block[0] = dims[3], p.block[1] = dims[4], p.block[2] = dims[5];
    p.shmem = dims[6];
    p.kernel_params = (void **)params;
    p.kern = kern;
    p.ctx = ctx;
    void *node = NULL;
    int result;
    Py_BEGIN_ALLOW_THREADS
    result = ((add_kernel_node_fn)entry)(&node, graph, dep ? &dep : NULL, dep ? 1 : 0, &p);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(iN)", result, PyLong_FromVoidPtr(node));
}

typedef int (*graph_launch_fn)(void *exec, void *stream);
typedef int (*event_record_fn)(void *event, void *stream);

static PyObject *graph_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "graph_launch(launch_entry, record_entry, exec, stream, event)");
        return NULL;
    }
    void *launch_entry, *record_entry, *exec, *stream, *event;
    if (as_ptr(args[0], &launch_entry) || as_ptr(args[1], &record_entry) ||
        as_ptr(args[2], &exec) || as_ptr(args[3], &stream) || as_ptr(args[4], &event))
        return NULL;
    if (launch_entry == NULL || record_entry == NULL) {
        PyErr_SetString(PyExc_ValueError, "no cuGraphLaunch/cuEventRecord entry point");
        return NULL;
    }
    int launched, recorded = 0;
    Py_BEGIN_ALLOW_THREADS
    launched = ((graph_launch_fn)launch_entry)(exec, stream);
    if (launched == 0 && event != NULL) recorded = ((event_record_fn)record_entry)(event, stream);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(launched ? launched : -recorded);
}

typedef int (*call1_fn)(void *);

/* call1(entry, a0) -> CUresult: a one-argument driver call (stream or event
 * synchronisation), GIL released. */
static PyObject *call1(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *entry, *a0;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "call1(entry, a0)");
        return NULL;
    }
    if (as_ptr(args[0], &entry) || as_ptr(args[1], &a0)) return NULL;
    if (entry == NULL) {
        PyErr_SetString(PyExc_ValueError, "call1: no driver entry point");
        return NULL;
    }
    int result;
    Py_BEGIN_ALLOW_THREADS
    result = ((call1_fn)entry)(a0);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(result);
}

static PyMethodDef methods[] = {
    {"call1", (PyCFunction)(void (*)(void))call1, METH_FASTCALL,
     "call1(entry, a0) -> CUresult: a one-argument driver call, GIL released."},
    {"launch_args", (PyCFunction)(void (*)(void))launch_args, METH_FASTCALL,
     "launch_args(entry, function, dims, stream, codes, args) -> CUresult, or -1"},
    {"add_kernel_node_args", (PyCFunction)(void (*)(void))add_kernel_node_args, METH_FASTCALL,
     "add_kernel_node_args(entry, graph, dep, kernel, ctx, dims, codes, args) -> "
     "(CUresult, node, held), or -1"},
    {"graph_launch", (PyCFunction)(void (*)(void))graph_launch, METH_FASTCALL,
     "graph_launch(launch_entry, record_entry, exec, stream, event) -> 0, CUresult or -CUresult"},
    {"add_kernel_node", (PyCFunction)(void (*)(void))add_kernel_node, METH_FASTCALL,
     "add_kernel_node(entry, graph, dep, kernel, ctx, dims, params) -> (CUresult, node)"},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(entry, function, gx, gy, gz, bx, by, bz, shmem, stream, params) -> CUresult"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cuforge._native._launch",
    "Kernel launches and kernel nodes through the driver's entry points.", -1, methods,
};

PyMODINIT_FUNC PyInit__launch(void) { return PyModule_Create(&module); }
