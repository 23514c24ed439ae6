"""HTTP serving and the engine flags."""
