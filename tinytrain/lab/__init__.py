"""Host-side studies beside the integer runtime: the benchmark workloads (W1-W3), their float32
PyTorch twins, and the precision lab (float formats against tinytrain's integer policies).
Needs the ``lab`` extra (PyTorch, ml_dtypes); nothing on the device path imports it."""
