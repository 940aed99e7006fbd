"""What keeps a parameter-server cluster of cluster_utils.py running, one
module per concern (docs/design.md lists them). Nothing here reads a flag:
settings come in as arguments."""
