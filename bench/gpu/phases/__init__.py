"""The default GPU run's phases (run.py), one file each: a function that runs one phase and
returns its results, a dict that goes to gpu.json under the phase's name."""
