"""What travels to and from the nodes around a run: staging, tokenize-once, the LoRA merge, one-off node
calls."""
