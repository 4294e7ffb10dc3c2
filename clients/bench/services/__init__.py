"""What the bench's modes start beside the server: a private PostgreSQL, a tiny
model, an upstream peer."""
