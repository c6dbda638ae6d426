"""trainfleet's pyinfra facts, one module per concern, one remote command each."""
