"""Routes, one module per resource beyond /v1/responses itself."""
