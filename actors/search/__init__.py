"""Search: design spaces, the strategies that fill a campaign's generations (one per
`writer.kind`, in `registry`), priors and lessons."""
