"""capsim, the application: the command line over the simulator (`sim`) and the calibration harness
(`calibration`). The only package that imports both; `sim` never imports it."""

from sim import __version__

__all__ = ["__version__"]
