"""The campaign read model: the campaign file, the history every role replays, ranking,
summary."""
