
t=$1 unit=$2 units=$3 r=$4; shift 4
# What deploy/remediate.py needs beside the hardware fact, each line tagged: the GPU processes
# (pids only: nvidia-smi's csv of one numeric column, no process name), systemd and each unit
# the remediation stops or writes, and trainfleet's ACS unit file (one base64 line).
if command -v nvidia-smi >/dev/null 2>&1; then
  # a probe that could not read them all says so (gpu_pids): it saw nothing, not no job
  g=$(gpu_pids "$t") || u=unknown
  printf '%s\n' "$g" | sed -n 's/^\(..*\)$/gpu_pid \1/p'
  [ -z "${u:-}" ] || echo "gpu_pids unknown"
fi
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
  echo "systemd yes"
  for u in $units; do
    e=$(timeout 10 systemctl is-enabled "$u.service" 2>/dev/null | head -n 1)
    a=$(timeout 10 systemctl is-active "$u.service" 2>/dev/null | head -n 1)
    echo "unit $u ${e:-none} ${a:-none}" | tr -d '\r'
  done
else
  echo "systemd no"
fi
if [ -f "$unit" ]; then printf 'acs_unit '; base64 -w0 < "$unit"; echo; fi
# setpci's absolute path for the ACS unit ($@: where pciutils puts it): a root-owned
# executable that neither group nor others can write, else none (never a PATH lookup at boot)
for p in "$@"; do
  f=$r$p
  [ -f "$f" ] && [ -x "$f" ] || continue
  o=$(stat -L -c '%u %a' -- "$f" 2>/dev/null) || continue
  if [ "${o% *}" = 0 ] && [ $(( 0${o#* } & 022 )) -eq 0 ]; then echo "setpci $p"; break; fi
done
exit 0
