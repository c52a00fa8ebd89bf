"""Base-layer utilities shared by every other layer (no imports from the rest of ``viasd``
except :mod:`viasd.errors`)."""
