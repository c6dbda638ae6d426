
# What runs on the stack now (``busy_probe VENV``): processes that map a file below the venv,
# by its path or the one it resolves to (torch's libraries, any extension module), and the GPUs'
# processes, one ``busy venv|gpu PID`` line each. Process ids only: a process's name is its
# owner's to choose. A probe that cannot answer (timed out: a process stuck in a fault holds its
# maps; gpu_pids failing: facts/scripts/gpu_pids.sh) prints ``busy unknown venv|gpu``: it saw nothing, which is not "no job". Read
# by the StackVersions fact before its own venv python starts, and again by the software
# operation right before it changes the stack (a job that started since).
busy_probe() {
  rv=$(readlink -f -- "$1" 2>/dev/null) || rv=$1
  # A mapping's path (the kernel's, links resolved: after address, perms, offset, device and
  # inode) must begin with the venv's: /opt/trainfleet/venv2/... or /home/x/opt/trainfleet/venv/...
  # merely hold it. The paths go into the pattern with every ERE special character escaped.
  e=$(printf '%s\n' "$1" | sed 's/[.[\\*^$+?(){}|]/\\&/g') r=$(printf '%s\n' "$rv" | sed 's/[.[\\*^$+?(){}|]/\\&/g')
  m=$(printf '%s\0' /proc/[0-9]*/maps | timeout -k 2 10 xargs -0 grep -l -E \
    "^[0-9a-f]+-[0-9a-f]+ [^ ]+ [0-9a-f]+ [0-9a-f]+:[0-9a-f]+ [0-9]+ +($e|$r)/" 2>/dev/null)
  case $? in 124|137) echo "busy unknown venv" ;; esac
  for f in $m; do p=${f#/proc/}; echo "busy venv ${p%/maps}"; done
  if command -v nvidia-smi >/dev/null 2>&1; then
    g=$(gpu_pids 10) || echo "busy unknown gpu"
    printf '%s\n' "$g" | sed -n 's/^\(..*\)$/busy gpu \1/p'
  fi
  return 0
}
