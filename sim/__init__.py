"""capsim's simulator package. Kept empty on purpose: `import sim.io.profiles` must not pull in simpy.

The public API lives in :mod:`sim.api`.
"""

__version__ = "0.1.0"
