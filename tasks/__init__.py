"""Built-in training tasks: datasets, transforms, losses and metrics."""
