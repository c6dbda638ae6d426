"""pyinfra inventory of the controller benchmark's fake nodes: ``@fake/<node>`` hosts with
trainfleet's host data and their canned answers, built before the timed runs
(bench/controller/fleet.py) and loaded here from the pickle ``TRAINFLEET_FLEET`` names."""

import os
import pickle

with open(os.environ["TRAINFLEET_FLEET"], "rb") as _handle:
    nodes = pickle.load(_handle)
