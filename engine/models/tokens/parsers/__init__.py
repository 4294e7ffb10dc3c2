"""One module per tool-call format; the registry is ``engine/models/tokens/tool_parsers.py``."""
