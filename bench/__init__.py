"""The benchmark (issue #8): trainfleet's tasks on the lab at 1..16 nodes, against a floor.

``python -m bench`` times each task as a plain ``pyinfra -y --json`` subprocess, counts
remote commands in a separate accounted run (``bench.lab_driver``), and writes
``docs/benchmark.{md,png,json}``.
"""
