"""Special functions (error function, gamma family, Bessel) as primitives.

Their kernels are SciPy's ufuncs. SciPy is imported when a kernel first
runs, not when the primitive set is registered: `import keras_ipu` stays
light. SciPy has no bfloat16/float16 loops, so those compute in float32 and
round once at the end (which is also what the IPU's half-precision
transcendental units do).

Gradient rules: grads/special.py (registered once every primitive exists).
"""

import numpy as np

from keras_ipu.device.primitives import cost_util as _cost
from keras_ipu.device.primitives import shape_rules
from keras_ipu.device.primitives.elementwise import exact_kernel
from keras_ipu.device.primitives.registry import Primitive


def _scipy(name):
    def fn(*xs):
        from scipy import special  # lazy: only when the kernel first runs

        if xs[0].dtype.itemsize < 4 and xs[0].dtype.kind == "f":
            xs = [x.astype(np.float32) for x in xs]
        return getattr(special, name)(*xs)

    fn.__name__ = name
    return fn


def _special(name, scipy_name, nondiff=None):
    rule = shape_rules.elementwise()
    return Primitive(
        name, rule, exact_kernel(rule, _scipy(scipy_name)), nondiff=nondiff,
        elementwise=True, fp_class="elementwise",
    )


erf_p = _special("erf", "erf")
erfc_p = _special("erfc", "erfc")
erfinv_p = _special("erfinv", "erfinv")
lgamma_p = _special("lgamma", "gammaln")
digamma_p = _special("digamma", "digamma")
# Modified Bessel functions of the first kind (and exponentially scaled).
i0_p = _special("i0", "i0")
i0e_p = _special("i0e", "i0e")
i1_p = _special("i1", "i1")
i1e_p = _special("i1e", "i1e")
# Regularized incomplete gamma functions P(a, x) and Q(a, x).
igamma_p = _special("igamma", "gammainc")
igammac_p = _special("igammac", "gammaincc")
# Regularized incomplete beta function I_x(a, b): operands (a, b, x).
betainc_p = _special("betainc", "betainc")


# -- cost rules (formulas and constants: keras_ipu/device/simulator/cost_model.py)

for _p in (erf_p, erfc_p, erfinv_p, lgamma_p, digamma_p, i0_p, i0e_p, i1_p,
           i1e_p, igamma_p, igammac_p, betainc_p):
    _p.cost = _cost.transcendental
del _p
