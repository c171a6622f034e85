/*
 * cuforge._native._release -- deferred release of graph owner bundles.
 *
 * CUDA runs user-object destructors on an internal driver thread on which CUDA
 * calls are forbidden and blocking can deadlock (the same thread runs host
 * callbacks).  cuforge_release() is that destructor: it never takes the GIL and
 * never calls CUDA.  It pushes the token (a bundle id) onto a lock-free
 * multi-producer list and asks the interpreter, through Py_AddPendingCall, to
 * drain the list on the main thread, where the registered Python callback
 * drops the owners.  Python may also drain explicitly with drain().
 *
 * After shutdown() (registered with atexit) the destructor does nothing: owners
 * still registered are leaked on purpose so that interpreter finalisation can
 * neither crash nor hang on a driver thread.
 *
 * The module also holds the host-node trampoline (cuforge_host_call): host
 * nodes run Python callables through it.  Unlike the destructor it does take
 * the GIL, which is the normal host-callback contract.
 *
 * No CUDA header is included: CUhostFn is just void (*)(void *).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

typedef struct node {
    struct node *next;
    uintptr_t token;
} node_t;

static _Atomic(node_t *) queue_head = NULL;
static atomic_int shutting_down = 0;
static atomic_int drain_scheduled = 0;
static atomic_long in_destructor = 0;   /* destructor calls now running */
static atomic_long queued = 0;          /* tokens pushed and not yet popped */
static atomic_long pending_call_failures = 0;
static PyObject *release_callback = NULL; /* touched only with the GIL held */

static int drain_pending(void *arg);

/* The user-object destructor.  Runs on a CUDA driver thread. */
void cuforge_release(void *token)
{
    atomic_fetch_add(&in_destructor, 1);
    if (atomic_load(&shutting_down)) {
        atomic_fetch_sub(&in_destructor, 1);
        return;
    }
    node_t *n = malloc(sizeof *n);
    if (n != NULL) { /* out of memory: the bundle leaks, nothing worse */
        n->token = (uintptr_t)token;
        node_t *old = atomic_load(&queue_head);
        do {
            n->next = old;
        } while (!atomic_compare_exchange_weak(&queue_head, &old, n));
        atomic_fetch_add(&queued, 1);
        /* One pending call at a time; a failed request (queue full) leaves the
         * tokens queued for the next drain or the next destructor call. */
        if (atomic_exchange(&drain_scheduled, 1) == 0) {
            if (Py_AddPendingCall(drain_pending, NULL) != 0) {
                atomic_store(&drain_scheduled, 0);
                atomic_fetch_add(&pending_call_failures, 1);
            }
        }
    }
    atomic_fetch_sub(&in_destructor, 1);
}

/* Pop every queued token into a new list (GIL held).  NULL on error, with
 * the tokens pushed back. */
static PyObject *pop_all(void)
{
    node_t *n = atomic_exchange(&queue_head, NULL);
    PyObject *out = PyList_New(0);
    while (n != NULL) {
        node_t *next = n->next;
        if (out != NULL) {
            PyObject *v = PyLong_FromUnsignedLongLong((unsigned long long)n->token);
            if (v == NULL || PyList_Append(out, v) != 0) {
                Py_XDECREF(v);
                Py_CLEAR(out);
            } else {
                Py_DECREF(v);
            }
        }
        if (out == NULL) { /* keep the rest for a later drain */
            node_t *old = atomic_load(&queue_head);
            node_t *tail = n;
            while (tail->next != NULL) {
                tail = tail->next;
            }
            do {
                tail->next = old;
            } while (!atomic_compare_exchange_weak(&queue_head, &old, n));
            return NULL;
        }
        free(n);
        atomic_fetch_sub(&queued, 1);
        n = next;
    }
    return out;
}

/* Pending call: runs on the main thread with the GIL held. */
static int drain_pending(void *arg)
{
    (void)arg;
    /* Clear first so that a push racing with this drain schedules another. */
    atomic_store(&drain_scheduled, 0);
    /* Without a callback the tokens stay queued for an explicit drain(). */
    if (atomic_load(&shutting_down) || atomic_load(&queue_head) == NULL ||
        release_callback == NULL) {
        return 0;
    }
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *exc = PyErr_GetRaisedException();
#else
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
#endif
    PyObject *tokens = pop_all();
    if (tokens == NULL) {
        PyErr_WriteUnraisable(NULL);
    } else {
        PyObject *cb = release_callback;
        Py_INCREF(cb);
        PyObject *r = PyObject_CallOneArg(cb, tokens);
        if (r == NULL) {
            PyErr_WriteUnraisable(cb);
        }
        Py_XDECREF(r);
        Py_DECREF(cb);
        Py_DECREF(tokens);
    }
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(exc);
#else
    PyErr_Restore(et, ev, tb);
#endif
    /* A pending call that returns -1 raises in arbitrary user code: never. */
    return 0;
}

/* Host-node trampoline: data is a borrowed callable kept alive by the
 * node's owner bundle. */
void cuforge_host_call(void *data)
{
    if (atomic_load(&shutting_down) || data == NULL) {
        return;
    }
    PyGILState_STATE st = PyGILState_Ensure();
    PyObject *r = PyObject_CallNoArgs((PyObject *)data);
    if (r == NULL) {
        PyErr_WriteUnraisable((PyObject *)data);
    }
    Py_XDECREF(r);
    PyGILState_Release(st);
}

static PyObject *py_destructor_address(PyObject *self, PyObject *noargs)
{
    return PyLong_FromVoidPtr((void *)&cuforge_release);
}

static PyObject *py_host_trampoline_address(PyObject *self, PyObject *noargs)
{
    return PyLong_FromVoidPtr((void *)&cuforge_host_call);
}

static PyObject *py_set_release_callback(PyObject *self, PyObject *fn)
{
    if (fn != Py_None && !PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "release callback must be callable or None");
        return NULL;
    }
    PyObject *old = release_callback;
    release_callback = (fn == Py_None) ? NULL : Py_NewRef(fn);
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

static PyObject *py_drain(PyObject *self, PyObject *noargs)
{
    return pop_all();
}

static PyObject *py_queued(PyObject *self, PyObject *noargs)
{
    return PyLong_FromLong(atomic_load(&queued));
}

static PyObject *py_pending_call_failures(PyObject *self, PyObject *noargs)
{
    return PyLong_FromLong(atomic_load(&pending_call_failures));
}

static PyObject *py_shutdown(PyObject *self, PyObject *noargs)
{
    atomic_store(&shutting_down, 1);
    /* Let destructor calls already past the flag check finish, for at most
     * ~100 ms: they only malloc and push, so this never waits in practice. */
    for (int i = 0; i < 1000 && atomic_load(&in_destructor) > 0; i++) {
        struct timespec ts = {0, 100000};
        Py_BEGIN_ALLOW_THREADS
        nanosleep(&ts, NULL);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyObject *py_is_shut_down(PyObject *self, PyObject *noargs)
{
    return PyBool_FromLong(atomic_load(&shutting_down));
}

/* ---- test-only entries: call the destructor from a foreign thread ---- */

typedef struct {
    uintptr_t token;
    long count;
} thread_job_t;

static void *release_thread(void *arg)
{
    thread_job_t *job = arg;
    for (long i = 0; i < job->count; i++) {
        cuforge_release((void *)(job->token + (uintptr_t)i));
    }
    return NULL;
}

static PyObject *py_test_release_from_thread(PyObject *self, PyObject *args)
{
    unsigned long long token;
    long count = 1;
    long nthreads = 1;
    if (!PyArg_ParseTuple(args, "K|ll", &token, &count, &nthreads)) {
        return NULL;
    }
    if (count < 0 || nthreads < 1 || nthreads > 64) {
        PyErr_SetString(PyExc_ValueError, "count >= 0 and 1 <= nthreads <= 64");
        return NULL;
    }
    pthread_t tids[64];
    thread_job_t jobs[64];
    long started = 0;
    int rc = 0;
    /* Threads start and join with the GIL released: the destructor must
     * make progress without it. */
    Py_BEGIN_ALLOW_THREADS
    for (long t = 0; t < nthreads; t++) {
        jobs[t].token = (uintptr_t)token + (uintptr_t)(t * count);
        jobs[t].count = count;
        rc = pthread_create(&tids[t], NULL, release_thread, &jobs[t]);
        if (rc != 0) {
            break;
        }
        started++;
    }
    for (long t = 0; t < started; t++) {
        pthread_join(tids[t], NULL);
    }
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        PyErr_SetString(PyExc_OSError, "pthread_create failed");
        return NULL;
    }
    Py_RETURN_NONE;
}

static void *host_call_thread(void *arg)
{
    cuforge_host_call(arg);
    return NULL;
}

static PyObject *py_test_host_call_from_thread(PyObject *self, PyObject *fn)
{
    pthread_t tid;
    int rc;
    Py_INCREF(fn);
    Py_BEGIN_ALLOW_THREADS
    rc = pthread_create(&tid, NULL, host_call_thread, fn);
    if (rc == 0) {
        pthread_join(tid, NULL);
    }
    Py_END_ALLOW_THREADS
    Py_DECREF(fn);
    if (rc != 0) {
        PyErr_SetString(PyExc_OSError, "pthread_create failed");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"destructor_address", py_destructor_address, METH_NOARGS,
     "Address of the C user-object destructor void cuforge_release(void *token)."},
    {"host_trampoline_address", py_host_trampoline_address, METH_NOARGS,
     "Address of the host-node trampoline void cuforge_host_call(void *callable)."},
    {"set_release_callback", py_set_release_callback, METH_O,
     "Register fn(tokens: list[int]) called by the main-thread drain (None clears)."},
    {"drain", py_drain, METH_NOARGS,
     "Pop and return every queued token (list[int]); the callback is not called."},
    {"queued", py_queued, METH_NOARGS, "Number of tokens queued and not yet drained."},
    {"pending_call_failures", py_pending_call_failures, METH_NOARGS,
     "How many times Py_AddPendingCall refused a drain request."},
    {"shutdown", py_shutdown, METH_NOARGS,
     "Make the destructor and trampoline no-ops from now on (owners leak)."},
    {"is_shut_down", py_is_shut_down, METH_NOARGS, "Whether shutdown() has run."},
    {"_test_release_from_thread", py_test_release_from_thread, METH_VARARGS,
     "Test only: call the destructor with tokens token.. from new pthreads."},
    {"_test_host_call_from_thread", py_test_host_call_from_thread, METH_O,
     "Test only: run the host trampoline on fn from a new pthread."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "cuforge._native._release",
    .m_doc = "Deferred release of graph owner bundles (no GIL, no CUDA on CUDA's thread).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__release(void)
{
    return PyModule_Create(&module);
}
