"""Shared internals: input checks, reduction and dtype policy, implementation choice,
thread parts, native kernels and the registry core. Private: import from the public modules."""
