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
 * No CUDA header is included: the signature below is cuLaunchKernel's ABI.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef int (*launch_kernel_fn)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                unsigned by, unsigned bz, unsigned shmem, void *stream,
                                void **params, void **extra);

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

static PyMethodDef methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(entry, function, gx, gy, gz, bx, by, bz, shmem, stream, params) -> CUresult"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cuforge._native._launch",
    "Kernel launch through the driver's cuLaunchKernel entry point.", -1, methods,
};

PyMODINIT_FUNC PyInit__launch(void) { return PyModule_Create(&module); }
