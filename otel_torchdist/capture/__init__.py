"""Capture: turn torch.distributed activity into compact records on the hot path."""
