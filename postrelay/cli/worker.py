"""`postrelay worker`."""
