"""torch.fx graph of one decode iteration, built from a Spec, and the analysis passes over it."""
