"""TensorFlow 2's room: its coordinator, and the word it gives its
servers."""
