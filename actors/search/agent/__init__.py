"""The agent operator: an LLM agent that varies a kernel with tools (read the lineage and
the lessons, compile, verify, time, submit), every step recorded."""
