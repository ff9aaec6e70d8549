"""The campaign read model: the campaign file, the history every role replays, the
ranking rules, the leaderboard every view renders, summary."""
