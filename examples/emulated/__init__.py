"""An RL job on emulated accelerators: its phases are the profiler's modelled times as timed waits
(:mod:`rollmux.emulation`, :mod:`actors.worker.emulated`), everything else is the real runtime.
:mod:`.job` holds its state builders, phase functions and loops; docs/EMULATION.md how to run it."""
