"""Counting tokens: cl100k through bpe-openai, texts of any size."""
