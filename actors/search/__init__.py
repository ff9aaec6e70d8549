"""Search: design spaces, strategies that propose points in them, priors and lessons."""
