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
 * and then, if it succeeded, cuEventRecord(event, stream), returning both CUresults:
 * an executable graph's launch and the event that tells when it is idle in one call.
 *
 * No CUDA header is included: the signatures and the struct below are the ABI.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

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
    return Py_BuildValue("(ii)", launched, recorded);
}

static PyMethodDef methods[] = {
    {"graph_launch", (PyCFunction)(void (*)(void))graph_launch, METH_FASTCALL,
     "graph_launch(launch_entry, record_entry, exec, stream, event) -> (CUresult, CUresult)"},
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
