"""Training: datasets, the one trainer loop for every backend, LR schedule, checkpoints."""
