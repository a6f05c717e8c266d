/* Buffer checks shared by the small C kernels (_scatter_add.c,
   _pooling.c, _im2col.c): each takes NumPy arrays through the buffer
   protocol and returns False (nothing written) where one does not fit, so
   that the caller runs its NumPy kernel. */

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

/* 'f' (float32) or 'd' (float64), after a byte-order prefix; 0 for
   anything else. */
static inline char float_kind(const Py_buffer *view) {
    const char *f = view->format;
    if (f == NULL) return 0;
    if (f[0] == '<' || f[0] == '=' || f[0] == '@') f++;
    if ((f[0] == 'f' && view->itemsize == 4) || (f[0] == 'd' && view->itemsize == 8))
        return f[1] == '\0' ? f[0] : 0;
    return 0;
}

#endif
