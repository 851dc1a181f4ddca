"""Inputs: the scenario schema, profile loaders, units and the configuration error type."""
