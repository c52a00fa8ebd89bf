"""Test helpers: synthetic evaluation data in the offline files' schemas, the app as a subprocess."""
