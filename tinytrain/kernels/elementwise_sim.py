"""Tiny flat-buffer kernels used by the generated simulator (ReLU, copies)."""
from numba import njit


@njit(cache=True)
def relu_fwd(x, y):
    for i in range(x.size):
        v = x[i]
        y[i] = v if v > 0 else 0


@njit(cache=True)
def relu_bwd(e, y, dx):
    for i in range(e.size):
        dx[i] = e[i] if y[i] > 0 else 0


@njit(cache=True)
def copy_s8(x, y):
    for i in range(x.size):
        y[i] = x[i]
