
# Right before the stack changes: a job that started since the StackVersions fact was read
# (busy_probe, facts/scripts/stack_busy.sh) stops the change here, with nothing changed.
b=$(busy_probe "$1")
if [ -n "$b" ]; then
  echo "trainfleet: a job started on the stack since it was read ($(printf '%s' "$b" | tr '\n' ';')): nothing changed; rerun when it ends, or with --data trainfleet_change_busy_stack=1" >&2
  exit 1
fi
