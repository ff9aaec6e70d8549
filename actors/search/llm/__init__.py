"""The LLM writer's building blocks: the client, prompts, code extraction, the archive."""
