"""The Redis store and what nodes share through it."""
