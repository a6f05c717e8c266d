/* Module creation shared by the C kernels' modules. */

#ifndef KERAS_IPU_MODULE_H
#define KERAS_IPU_MODULE_H

#include <Python.h>
#include <stdarg.h>

/* PyModule_Create(def) with int constants, given as (name, int value)
   pairs ended by NULL: the features a module was built with, which the
   Python side checks before it passes their arguments (an editable
   install not rebuilt keeps an older module). NULL with the error set. */
static inline PyObject *module_with_constants(struct PyModuleDef *def, ...) {
    PyObject *m = PyModule_Create(def);
    va_list constants;
    va_start(constants, def);
    for (const char *name; m != NULL && (name = va_arg(constants, const char *)) != NULL;) {
        int value = va_arg(constants, int);
        if (PyModule_AddIntConstant(m, name, value) != 0) Py_CLEAR(m);
    }
    va_end(constants);
    return m;
}

#endif
