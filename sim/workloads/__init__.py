"""Arrival processes, request shapes and trace readers."""
