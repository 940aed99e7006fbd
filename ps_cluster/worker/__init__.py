"""A worker's room: its training session and what keeps it going (start,
recovery, stall watch, beats, sync tokens), and what it reports."""
