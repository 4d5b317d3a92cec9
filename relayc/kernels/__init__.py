"""Shared verify kernels: Triton kernels, vectorised torch paths and plain-torch references."""
