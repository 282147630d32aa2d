"""The catalogue of the example site: products whose saves trigger debounced work."""
