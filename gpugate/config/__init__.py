"""consumers.yaml: the typed configuration, its loader and its validation."""
