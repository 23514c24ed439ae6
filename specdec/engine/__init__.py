"""The reference host engine: paged KV memory, continuous-batching scheduler, sampling, ``Engine``."""
