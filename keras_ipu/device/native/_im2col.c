/* im2col's patch copy for 2-d convolutions (primitives/conv.py), channels
   last.

   The NumPy copy out of a window view runs its inner loop once per run of
   contiguous floats: kw x C of them per kernel row where the window is
   not dilated. With few channels (the first layer of an image model:
   C = 3, runs of 9 floats) that is 3 calls per output pixel of a few
   nanoseconds of work each: 9 ms of a 3.7 ms product on the benchmark
   CNN's first convolution (128x32x32x3, 3x3, one thread). Here each run
   is one memcpy in a plain loop.

   patches(src, dst, n_lo, n_hi, H, W, C, P, Q, KH, KW, SH, SW, DH, DW)
     src: C-contiguous float32 or float64, (N, H, W, C), the padded input
     dst: C-contiguous, src's dtype, (n_hi - n_lo, P, Q, KH, KW, C):
       dst[n, p, q, i, j, c] = src[n_lo + n, p*SH + i*DH, q*SW + j*DW, c]
   False (nothing written) when a buffer does not fit: the caller then
   copies with NumPy (the same values: a copy). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_buffers.h"

static PyObject *patches(PyObject *self, PyObject *args) {
    PyObject *src_obj, *dst_obj;
    Py_ssize_t n_lo, n_hi, h, w, c, p, q, kh, kw, sh, sw, dh, dw;
    if (!PyArg_ParseTuple(args, "OOnnnnnnnnnnnnn", &src_obj, &dst_obj, &n_lo, &n_hi, &h, &w, &c,
                          &p, &q, &kh, &kw, &sh, &sw, &dh, &dw))
        return NULL;
    PyObject *objs[2] = {src_obj, dst_obj};
    Py_buffer v[2];
    int held = get_buffers(objs, v, 2, 2);
    if (held < 2) return released(v, held, NULL);
    const Py_buffer src = v[0], dst = v[1];
    char kind = float_kind(&src);
    Py_ssize_t item = src.itemsize;
    int ok = kind != 0 && float_kind(&dst) == kind && n_lo >= 0 && n_hi >= n_lo && h > 0
             && w > 0 && c > 0 && p > 0 && q > 0 && kh > 0 && kw > 0 && sh > 0 && sw > 0
             && dh > 0 && dw > 0 && (p - 1) * sh + (kh - 1) * dh < h
             && (q - 1) * sw + (kw - 1) * dw < w && src.len % (h * w * c * item) == 0
             && n_hi <= src.len / (h * w * c * item)
             && dst.len == (n_hi - n_lo) * p * q * kh * kw * c * item;
    if (ok) {
        const char *s = (const char *)src.buf;
        char *d = (char *)dst.buf;
        size_t run = (size_t)(c * item), row = (size_t)(kw * c * item);
        Py_ssize_t col_step = w * c * item;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t n = n_lo; n < n_hi; n++) {
            const char *image = s + n * h * col_step;
            for (Py_ssize_t pp = 0; pp < p; pp++)
                for (Py_ssize_t qq = 0; qq < q; qq++)
                    for (Py_ssize_t i = 0; i < kh; i++) {
                        const char *from = image + (pp * sh + i * dh) * col_step
                                           + (qq * sw) * (Py_ssize_t)run;
                        if (dw == 1) {
                            memcpy(d, from, row);
                            d += row;
                        } else {
                            for (Py_ssize_t j = 0; j < kw; j++, d += run)
                                memcpy(d, from + j * dw * (Py_ssize_t)run, run);
                        }
                    }
        }
        Py_END_ALLOW_THREADS
    }
    release_buffers(v, held);
    return PyBool_FromLong(ok);
}

static PyMethodDef methods[] = {
    {"patches", patches, METH_VARARGS,
     "patches(src, dst, n_lo, n_hi, H, W, C, P, Q, KH, KW, SH, SW, DH, DW) -> bool: "
     "dst[n, p, q, i, j, c] = src[n_lo + n, p*SH + i*DH, q*SW + j*DW, c] (channels-last "
     "im2col of images n_lo..n_hi); False (nothing written) when a buffer does not fit."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_im2col",
    "im2col's patch copy for 2-d convolutions (see device/primitives/conv.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__im2col(void) { return PyModule_Create(&module); }
