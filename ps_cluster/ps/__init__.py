"""A ps task's room: its end of the run."""
