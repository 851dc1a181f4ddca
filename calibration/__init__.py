"""capsim calibration: measure real iterations with a reference model in torch, fit step-time profiles.

The only package of the project that uses torch, and only lazily (inside the functions that time
things), so `capsim` works without torch installed. It must not import simpy or the simulator's
engine and schedulers; it shares the profile schema (sim.io.profiles) and the FLOP/byte arithmetic
(sim.models.roofline, sim.models.spec) with the simulator, so a profile is written with the classes that read it.
"""
