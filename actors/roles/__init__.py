"""The roles: each reacts to events and emits events; no role imports another.

What they share is in `actors.roles.registry.messages`; the registry of roles is `registry`."""
