"""What keeps a parameter-server cluster of cluster_utils.py running: the
ground every task stands on, and a room for each role (README.md here
lists them). Nothing here reads a flag: the settings come in as
arguments, cluster_utils.py's settings.Settings."""
