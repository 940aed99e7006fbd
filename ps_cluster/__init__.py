"""What keeps a parameter-server cluster of cluster_utils.py running, one
module per concern (README.md here lists them). Nothing here reads a flag:
settings come in as arguments."""
