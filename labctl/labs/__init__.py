"""Lab kinds."""
