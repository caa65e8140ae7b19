"""Reliability suite (issue 7): crash torture, simulated power loss, I/O errors, lease torture."""
