"""Control plane: who is in the job, at which version."""
