"""planner/search."""
