"""An evaluator's room: it follows the chief's checkpoints."""
