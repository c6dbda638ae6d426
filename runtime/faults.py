"""Why a node failed a step, said in the step's own terms.

pyinfra ends a failed step with how many commands it ran (``[node2] Error: executed 4
commands``): a node lost mid-run reads like any other failure. trainfleet adds one line
naming what happened (the connection lost, a command timed out) and the step it was in,
from a state callback (``operation_host_error``) and the command error pyinfra logs just
before it (recorded by wrapping pyinfra's own logger of such errors).
"""

from __future__ import annotations

from typing import Any

import pyinfra.api.operations as pyinfra_operations
from pyinfra import logger
from pyinfra.api import State
from pyinfra.api.state import BaseStateCallback
from pyinfra.context import ctx_state


def connection_lost(host: Any) -> str | None:
    """How the host's SSH connection ended, if it has (None: it is up, or not SSH at all)."""
    client = getattr(host.connector, "client", None)
    if client is None:  # @local, @fake: no connection to lose
        return None
    transport = client.get_transport()
    if transport is not None and transport.is_active():
        return None
    cause = getattr(transport, "saved_exception", None)
    if isinstance(cause, EOFError) or cause is None:
        return "connection lost (the node closed it)"
    return f"connection lost ({type(cause).__name__}: {cause})"


def command_error(error: BaseException, timeout: int | None) -> str:
    """A command's error as pyinfra caught it, in words."""
    if isinstance(error, TimeoutError):
        return f"timed out after {timeout}s" if timeout else "timed out"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    return f"connection lost ({type(error).__name__}: {error})"


class StepFaults(BaseStateCallback):
    """Names what happened to a node that failed a step: the connection lost, or the error
    its last command raised. A step that failed with the connection up and no such error
    (a command that exited non-zero) has said why already."""

    def __init__(self) -> None:
        self.errors: dict[str, str] = {}  # host name -> its last command error this step

    def operation_host_error(
        self, state: State, host: Any, op_hash: Any, retry_count: int = 0, max_retries: int = 0
    ) -> None:
        why = connection_lost(host) or self.errors.pop(host.name, None)
        if why:
            step = ", ".join(state.get_op_meta(op_hash).names) or "an operation"
            logger.error(f"{host.print_prefix}trainfleet: {why}, in the step {step!r}")

    def operation_host_success(
        self, state: State, host: Any, op_hash: Any, retry_count: int = 0
    ) -> None:
        self.errors.pop(host.name, None)


def _recorded(log: Any) -> Any:
    """pyinfra's logger of a command's exception, also keeping it for this run's StepFaults."""

    def log_and_keep(host: Any, e: Exception, timeout: int | None = 0) -> None:
        log(host, e, timeout=timeout)
        state = ctx_state.get()
        for handler in getattr(state, "callback_handlers", []):
            if isinstance(handler, StepFaults):
                handler.errors[host.name] = command_error(e, timeout)

    log_and_keep.trainfleet_wrapped = log  # type: ignore[attr-defined]
    return log_and_keep


def name_step_faults(state: State) -> None:
    """Once per run: StepFaults on the state, and pyinfra's command-error logger recording."""
    state.add_callback_handler(StepFaults())
    log = pyinfra_operations.log_host_command_error
    if not hasattr(log, "trainfleet_wrapped"):
        pyinfra_operations.log_host_command_error = _recorded(log)
