"""The parts of ``bench/diagnosis.py`` (diagnosis quality and speed), a module each: the live
engine on the simulator (``engine``), the fault suites with their tallies and tables
(``suites``) and the noise space (``space``). ``bench/diagnosis.py`` is the driver: it runs
the parts and prints the figures."""
