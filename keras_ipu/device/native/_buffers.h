/* Buffer checks shared by the C kernels (_scatter_add.c, _pooling.c,
   _im2col.c, _rows.c; the formats also _elementwise.c and
   _product_pool.c): each takes NumPy arrays through the buffer protocol
   and returns False (nothing written) where one does not fit, so that the
   caller runs its NumPy kernel. */

#ifndef KERAS_IPU_BUFFERS_H
#define KERAS_IPU_BUFFERS_H

#include <Python.h>

/* A C-contiguous buffer of obj (writable if asked), or 0 with no error
   set. */
static inline int get_buffer(PyObject *obj, Py_buffer *view, int writable) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT;
    if (writable) flags |= PyBUF_WRITABLE;
    if (PyObject_GetBuffer(obj, view, flags) != 0) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* The buffer's one struct code after a native byte-order prefix ('<', '=',
   '@'): 'f', 'd', 'i', 'q', '?' ...; 0 for none or more than one. */
static inline char format_code(const Py_buffer *view) {
    const char *f = view->format;
    if (f == NULL) return 0;
    if (f[0] == '<' || f[0] == '=' || f[0] == '@') f++;
    return f[0] != '\0' && f[1] == '\0' ? f[0] : 0;
}

/* 'f' (float32) or 'd' (float64); 0 for anything else. */
static inline char float_kind(const Py_buffer *view) {
    char c = format_code(view);
    return (c == 'f' && view->itemsize == 4) || (c == 'd' && view->itemsize == 8) ? c : 0;
}

/* Whether the buffer holds 64-bit integers ('l' or 'q'). */
static inline int is_int64(const Py_buffer *view) {
    char c = format_code(view);
    return view->itemsize == 8 && (c == 'l' || c == 'q');
}

/* Buffers of objs[0 .. n) into views (C-contiguous; writable where bit i
   of `writable` is set), stopping at the first that does not fit: how
   many it holds (n: all). release_buffers(views, held) lets them go. */
static inline int get_buffers(PyObject *const *objs, Py_buffer *views, int n,
                              unsigned writable) {
    int held = 0;
    while (held < n && get_buffer(objs[held], &views[held], (writable >> held) & 1)) held++;
    return held;
}

static inline void release_buffers(Py_buffer *views, int held) {
    while (held > 0) PyBuffer_Release(&views[--held]);
}

/* A kernel entry's tail: the views it holds released, then `result` (a
   new reference), or False where it is NULL with no error set (a buffer
   did not fit: the caller runs its NumPy kernel). */
static inline PyObject *released(Py_buffer *views, int held, PyObject *result) {
    release_buffers(views, held);
    if (result == NULL && !PyErr_Occurred()) Py_RETURN_FALSE;
    return result;
}

#endif
