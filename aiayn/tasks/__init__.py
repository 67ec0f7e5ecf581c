"""Small self-contained tasks that need no data set."""
