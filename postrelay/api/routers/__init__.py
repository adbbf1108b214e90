"""One router per resource. Order matters when they are included: see app.py."""
