"""After-the-fact records of a campaign: audit, re-verification, best kernels, story, overview."""
