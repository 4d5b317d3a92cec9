"""Code generation: annotated graph -> generated Python module, the writer and the targets."""
