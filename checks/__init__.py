"""Checks: drift and the preflight. They read nodes and the plan, and change nothing."""
