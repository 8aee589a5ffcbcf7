/*
 * StepTimer(coro): await a coroutine, adding up the time its own steps ran (``ns``): a
 * request's handler time on the event loop, without the time it waited (the quota gate's
 * ``request_percentage``, api/quota_gate.py).
 *
 * The Python twin is api.quota_gate._TimedPy, a generator trampoline; they agree on results,
 * exceptions, cancellation and values passed in (tests/api/test_steptimer.py). The twin costs
 * ~26k instructions per request (a Python frame per step and a StopIteration at the end);
 * this costs two clock reads per step: it forwards each step with PyIter_Send, which hands
 * the coroutine's return value back without raising StopIteration.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <time.h>

typedef struct {
    PyObject_HEAD
    PyObject *coro;
    long long ns;         /* the steps that ended */
    long long step_start; /* the step running now (0: none) */
} StepTimer;

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* One positional argument, read without the argument parser (once per measured request). */
static int timer_init(StepTimer *self, PyObject *args, PyObject *kwds) {
    if ((kwds != NULL && PyDict_GET_SIZE(kwds) != 0) || PyTuple_GET_SIZE(args) != 1) {
        PyErr_SetString(PyExc_TypeError, "StepTimer takes one coroutine");
        return -1;
    }
    PyObject *coro = PyTuple_GET_ITEM(args, 0);
    if (!PyCoro_CheckExact(coro) && !PyGen_Check(coro)) {
        PyErr_SetString(PyExc_TypeError, "StepTimer needs a coroutine");
        return -1;
    }
    Py_INCREF(coro);
    Py_XSETREF(self->coro, coro);
    self->ns = 0;
    self->step_start = 0;
    return 0;
}

static int timer_traverse(StepTimer *self, visitproc visit, void *arg) {
    Py_VISIT(self->coro);
    return 0;
}

static int timer_clear(StepTimer *self) {
    Py_CLEAR(self->coro);
    return 0;
}

static void timer_dealloc(StepTimer *self) {
    PyObject_GC_UnTrack(self);
    timer_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* One step: send ``arg`` in (None to start or resume), timed. */
static PySendResult timer_send(StepTimer *self, PyObject *arg, PyObject **result) {
    if (self->coro == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "StepTimer: no coroutine");
        *result = NULL;
        return PYGEN_ERROR;
    }
    long long start = now_ns();
    self->step_start = start;
    PySendResult r = PyIter_Send(self->coro, arg, result);
    self->ns += now_ns() - start;
    self->step_start = 0;
    return r;
}

/* A return value as the StopIteration a Python-level iterator protocol expects. */
static PyObject *returned(PyObject *value) {
    if (value == Py_None) {
        Py_DECREF(value);
        return NULL; /* NULL without an exception: StopIteration(None) */
    }
    PyObject *stop = PyObject_CallOneArg(PyExc_StopIteration, value);
    Py_DECREF(value);
    if (stop != NULL) {
        PyErr_SetObject(PyExc_StopIteration, stop);
        Py_DECREF(stop);
    }
    return NULL;
}

static PyObject *timer_iternext(StepTimer *self) {
    PyObject *result;
    PySendResult r = timer_send(self, Py_None, &result);
    if (r == PYGEN_RETURN) return returned(result);
    return result; /* PYGEN_NEXT: the yielded value; PYGEN_ERROR: NULL with the error set */
}

static PyObject *timer_send_method(StepTimer *self, PyObject *arg) {
    PyObject *result;
    PySendResult r = timer_send(self, arg, &result);
    if (r == PYGEN_RETURN) {
        if (result == Py_None) { /* a method, not tp_iternext: the end must be raised */
            Py_DECREF(result);
            PyErr_SetNone(PyExc_StopIteration);
            return NULL;
        }
        return returned(result);
    }
    return result;
}

/* throw(...) and close(): forwarded to the coroutine, the step timed. */
static PyObject *timer_forward(StepTimer *self, const char *name, PyObject *args) {
    if (self->coro == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "StepTimer: no coroutine");
        return NULL;
    }
    PyObject *method = PyObject_GetAttrString(self->coro, name);
    if (method == NULL) return NULL;
    long long start = now_ns();
    self->step_start = start;
    PyObject *result = PyObject_Call(method, args, NULL);
    self->ns += now_ns() - start;
    self->step_start = 0;
    Py_DECREF(method);
    return result;
}

static PyObject *timer_throw(StepTimer *self, PyObject *args) {
    return timer_forward(self, "throw", args);
}

static PyObject *timer_close(StepTimer *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *args = PyTuple_New(0);
    if (args == NULL) return NULL;
    PyObject *result = timer_forward(self, "close", args);
    Py_DECREF(args);
    return result;
}

static PyObject *timer_so_far(StepTimer *self, PyObject *Py_UNUSED(ignored)) {
    long long ns = self->ns;
    if (self->step_start) ns += now_ns() - self->step_start;
    return PyLong_FromLongLong(ns);
}

static PyObject *timer_get_ns(StepTimer *self, void *Py_UNUSED(closure)) {
    return PyLong_FromLongLong(self->ns);
}

static PyObject *timer_await(PyObject *self) {
    Py_INCREF(self);
    return self;
}

static PyMethodDef timer_methods[] = {
    {"send", (PyCFunction)timer_send_method, METH_O, "Resume the coroutine with a value."},
    {"throw", (PyCFunction)timer_throw, METH_VARARGS, "Raise an exception in the coroutine."},
    {"close", (PyCFunction)timer_close, METH_NOARGS, "Close the coroutine."},
    {"so_far", (PyCFunction)timer_so_far, METH_NOARGS,
     "Handler time in ns, including the step running now."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef timer_getset[] = {
    {"ns", (getter)timer_get_ns, NULL, "Time of the steps that ended, in ns.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyAsyncMethods timer_as_async = {
    .am_await = timer_await,
    .am_send = (sendfunc)timer_send,
};

static PyTypeObject StepTimerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "api._steptimer.StepTimer",
    .tp_basicsize = sizeof(StepTimer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Await a coroutine, adding up the time its own steps ran (ns).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)timer_init,
    .tp_dealloc = (destructor)timer_dealloc,
    .tp_traverse = (traverseproc)timer_traverse,
    .tp_clear = (inquiry)timer_clear,
    .tp_as_async = &timer_as_async,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)timer_iternext,
    .tp_methods = timer_methods,
    .tp_getset = timer_getset,
};

/* The request path's clocks in milliseconds, without a Python frame each (their twins:
 * api.quota_state.monotonic_ms, api.security.wall_ms). */
static PyObject *monotonic_ms(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromLongLong(now_ns() / 1000000LL);
}

static PyObject *wall_ms(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored)) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return PyLong_FromLongLong((long long)t.tv_sec * 1000LL + t.tv_nsec / 1000000LL);
}

static PyMethodDef module_methods[] = {
    {"monotonic_ms", monotonic_ms, METH_NOARGS, "time.monotonic_ns() // 1_000_000"},
    {"wall_ms", wall_ms, METH_NOARGS, "time.time_ns() // 1_000_000"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_steptimer", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit__steptimer(void) {
    if (PyType_Ready(&StepTimerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&StepTimerType);
    if (PyModule_AddObject(m, "StepTimer", (PyObject *)&StepTimerType) < 0) {
        Py_DECREF(&StepTimerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
