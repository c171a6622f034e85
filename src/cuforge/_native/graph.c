/*
 * cuforge._native._graph -- the fixed driver work of a graph, one C call per phase.
 *
 * A small graph's build, instantiate and destroy are a handful of driver calls;
 * made through cuda-bindings each would cost a wrapper object, an enum object
 * and a Python frame.  These functions make the same calls through the entry
 * points cuGetProcAddress returned (installed once with set_entries) and take
 * and return plain ints.  They never decide anything about lifetimes: the
 * Python side (cuforge.graph) registers every owner bundle before a call and
 * forgets it on failure, exactly as with the bindings.
 *
 * create(flags, token) -> (CUresult, ctx, graph, committed)
 *     cuCtxGetCurrent, then cuGraphCreate; ctx is 0 (and no graph is made) when
 *     the thread has no current context.  With a token, commit(graph, token)
 *     follows (the new graph's first bundle list); committed says it happened.
 * commit(graph, token) -> CUresult
 *     A user object owning ``token`` (destructor: cuforge_release, no destructor
 *     sync) moved onto ``graph`` (cuGraphRetainUserObject, MOVE).  On a failed
 *     retain the user object is released, which queues ``token`` for release.
 * instantiate(graph, flush_token, flags) -> (CUresult, stage, exec)
 *     commit(graph, flush_token) unless it is 0, then cuGraphInstantiateWithFlags
 *     (the exec copies the graph's user-object references).  stage says which
 *     step failed: 1 commit, 3 instantiate.
 *
 * host_func(stream, fn, data) -> CUresult
 *     cuLaunchHostFunc(stream, fn, data) as is.  (cuda-bindings' cuLaunchHostFunc
 *     runs fn through a wrapper whose state it frees after the first call, so a
 *     host function captured into a graph through it crashes on the second launch.)
 * release_after(stream, event, token) -> CUresult
 *     cuStreamWaitEvent(stream, event), then cuLaunchHostFunc(stream, destructor,
 *     token): ``token`` is queued for release once the event's work completed.
 *
 * The GIL is released around driver calls, as cuda-bindings does.  No CUDA
 * header is included: the signatures below are the ABI.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef int (*ctx_get_current_fn)(void **ctx);
typedef int (*graph_create_fn)(void **graph, unsigned flags);
typedef int (*uobj_create_fn)(void **uobj, void *ptr, void (*destroy)(void *), unsigned count,
                              unsigned flags);
typedef int (*uobj_release_fn)(void *uobj, unsigned count);
typedef int (*graph_retain_fn)(void *graph, void *uobj, unsigned count, unsigned flags);
typedef int (*instantiate_fn)(void **exec, void *graph, unsigned long long flags);
typedef int (*launch_host_fn)(void *stream, void (*fn)(void *), void *data);
typedef int (*wait_event_fn)(void *stream, void *event, unsigned flags);

enum { NO_DESTRUCTOR_SYNC = 1, MOVE = 1 };

static struct {
    ctx_get_current_fn ctx_get_current;
    graph_create_fn graph_create;
    uobj_create_fn uobj_create;
    uobj_release_fn uobj_release;
    graph_retain_fn graph_retain;
    instantiate_fn instantiate;
    launch_host_fn launch_host;
    wait_event_fn wait_event;
    void (*destructor)(void *);
} E;

static int ready = 0;

static int as_ptr(PyObject *obj, void **out) {
    *out = PyLong_AsVoidPtr(obj);
    return (*out == NULL && PyErr_Occurred()) ? -1 : 0;
}

static int not_ready(void) {
    PyErr_SetString(PyExc_RuntimeError, "cuforge._native._graph: set_entries() not called");
    return -1;
}

static PyObject *set_entries(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *p[9];
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError,
                        "set_entries(cuCtxGetCurrent, cuGraphCreate, cuUserObjectCreate, "
                        "cuUserObjectRelease, cuGraphRetainUserObject, "
                        "cuGraphInstantiateWithFlags, cuLaunchHostFunc, cuStreamWaitEvent, "
                        "destructor)");
        return NULL;
    }
    for (int i = 0; i < 9; i++) {
        if (as_ptr(args[i], &p[i])) return NULL;
        if (p[i] == NULL) {
            PyErr_Format(PyExc_ValueError, "set_entries: entry %d is missing", i);
            return NULL;
        }
    }
    E.ctx_get_current = (ctx_get_current_fn)p[0];
    E.graph_create = (graph_create_fn)p[1];
    E.uobj_create = (uobj_create_fn)p[2];
    E.uobj_release = (uobj_release_fn)p[3];
    E.graph_retain = (graph_retain_fn)p[4];
    E.instantiate = (instantiate_fn)p[5];
    E.launch_host = (launch_host_fn)p[6];
    E.wait_event = (wait_event_fn)p[7];
    E.destructor = (void (*)(void *))p[8];
    ready = 1;
    Py_RETURN_NONE;
}

/* Without the GIL. */
static int do_commit(void *graph, void *token) {
    void *uobj = NULL;
    int err = E.uobj_create(&uobj, token, E.destructor, 1, NO_DESTRUCTOR_SYNC);
    if (err) return err;
    err = E.graph_retain(graph, uobj, 1, MOVE);
    if (err) E.uobj_release(uobj, 1); /* still ours: destroys it (token queued) */
    return err;
}

static PyObject *create(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "create(flags, token)");
        return NULL;
    }
    if (!ready && not_ready()) return NULL;
    unsigned long flags = PyLong_AsUnsignedLong(args[0]);
    if (flags == (unsigned long)-1 && PyErr_Occurred()) return NULL;
    void *token;
    if (as_ptr(args[1], &token)) return NULL;
    void *ctx = NULL, *graph = NULL;
    int err, committed = 0;
    Py_BEGIN_ALLOW_THREADS
    err = E.ctx_get_current(&ctx);
    if (err == 0 && ctx != NULL) err = E.graph_create(&graph, (unsigned)flags);
    if (err == 0 && graph != NULL && token != NULL) {
        err = do_commit(graph, token);
        committed = err == 0;
    }
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(iNNi)", err, PyLong_FromVoidPtr(ctx), PyLong_FromVoidPtr(graph),
                         committed);
}

static PyObject *commit(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *graph, *token;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "commit(graph, token)");
        return NULL;
    }
    if (!ready && not_ready()) return NULL;
    if (as_ptr(args[0], &graph) || as_ptr(args[1], &token)) return NULL;
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = do_commit(graph, token);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(err);
}

static PyObject *instantiate(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *graph, *flush_token;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "instantiate(graph, flush_token, flags)");
        return NULL;
    }
    if (!ready && not_ready()) return NULL;
    if (as_ptr(args[0], &graph) || as_ptr(args[1], &flush_token)) return NULL;
    unsigned long long flags = PyLong_AsUnsignedLongLong(args[2]);
    if (flags == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    int err = 0, stage = 0;
    void *exec = NULL;
    Py_BEGIN_ALLOW_THREADS
    if (flush_token != NULL) {
        err = do_commit(graph, flush_token);
        if (err) stage = 1;
    }
    if (!err) {
        err = E.instantiate(&exec, graph, flags);
        if (err) stage = 3;
    }
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(iiN)", err, stage, PyLong_FromVoidPtr(exec));
}

static PyObject *host_func(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *stream, *fn, *data;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "host_func(stream, fn, data)");
        return NULL;
    }
    if (!ready && not_ready()) return NULL;
    if (as_ptr(args[0], &stream) || as_ptr(args[1], &fn) || as_ptr(args[2], &data)) return NULL;
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = E.launch_host(stream, (void (*)(void *))fn, data);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(err);
}

static PyObject *release_after(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *stream, *event, *token;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "release_after(stream, event, token)");
        return NULL;
    }
    if (!ready && not_ready()) return NULL;
    if (as_ptr(args[0], &stream) || as_ptr(args[1], &event) || as_ptr(args[2], &token))
        return NULL;
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = E.wait_event(stream, event, 0);
    if (!err) err = E.launch_host(stream, E.destructor, token);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(err);
}

static PyMethodDef methods[] = {
    {"host_func", (PyCFunction)(void (*)(void))host_func, METH_FASTCALL,
     "host_func(stream, fn, data) -> CUresult: cuLaunchHostFunc, no wrapper."},
    {"release_after", (PyCFunction)(void (*)(void))release_after, METH_FASTCALL,
     "release_after(stream, event, token) -> CUresult: release token after event's work."},
    {"set_entries", (PyCFunction)(void (*)(void))set_entries, METH_FASTCALL,
     "Install the driver entry points and the user-object destructor."},
    {"create", (PyCFunction)(void (*)(void))create, METH_FASTCALL,
     "create(flags, token) -> (CUresult, ctx, graph, committed)"},
    {"commit", (PyCFunction)(void (*)(void))commit, METH_FASTCALL,
     "commit(graph, token) -> CUresult: a user object owning token, moved onto graph."},
    {"instantiate", (PyCFunction)(void (*)(void))instantiate, METH_FASTCALL,
     "instantiate(graph, flush_token, flags) -> (CUresult, stage, exec)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cuforge._native._graph",
    "Graph creation, bundle commits and instantiation through the driver's entry points.",
    -1, methods,
};

PyMODINIT_FUNC PyInit__graph(void) { return PyModule_Create(&module); }
