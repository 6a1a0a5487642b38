"""The gateway's own HTTP/1.1 layer."""
