"""trainfleet's pyinfra operations, one module per capability."""
