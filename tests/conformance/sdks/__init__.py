"""The openai SDK and the Agents SDK as clients."""
