
# gpu_pids SECONDS: the GPU processes' pids, one a line (nvidia-smi's csv of one numeric column:
# no process name is read). Fails where they cannot all be read: nvidia-smi failed or hung, or
# printed a line that is not a pid ([N/A], [Insufficient Permissions], an error message with
# exit status 0): what cannot be read is not "no job". The pids it could read are printed still.
# Read by the stack's busy probe, the remediation's fact and its reset script.
gpu_pids() {
  g=$(timeout -k 2 "$1" nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null) || return 1
  printf '%s\n' "$g" | sed -n 's/^ *\([0-9]\{1,10\}\) *$/\1/p'
  ! printf '%s\n' "$g" | grep -v -e '^[[:space:]]*$' -e '^ *[0-9]\{1,10\} *$' | grep -q .
}
