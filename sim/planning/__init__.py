"""Capacity questions answered with many simulations: sweeps, the capacity planner, valuation."""
