
r=$1 t=$2 memlock=$3 peermem=$4
if command -v nvidia-smi >/dev/null 2>&1; then
  # XML, not -q's text: a process name (any user's choice, newlines included) stays inside
  # its own element; the document travels as one base64 line, so it cannot forge a tag.
  x=$(timeout -k 5 "$t" nvidia-smi -q -x 2>/dev/null); echo "smi_rc $?"
  printf 'smi_xml '; printf '%s\n' "$x" | base64 -w0; echo
else
  echo "smi_rc absent"
fi
# NVSwitches are NVIDIA PCI bridges (vendor 0x10de, class 0x0680xx), bound to nvidia-nvswitch.
# One grep over every device's vendor (a GPU server has hundreds of PCI functions: a process
# per device would cost more than the rest of the fact), then the class of NVIDIA's alone.
for v in $(grep -l -x 0x10de "$r"/sys/bus/pci/devices/*/vendor 2>/dev/null); do
  d=${v%/vendor}
  case $(cat "$d/class" 2>/dev/null) in 0x0680*) echo "nvswitch ${d##*/}" ;; esac
done
if [ -d "$r/run/systemd/system" ] && command -v systemctl >/dev/null 2>&1; then
  echo "systemd yes"
  for u in nvidia-persistenced nvidia-fabricmanager chrony chronyd systemd-timesyncd; do
    e=$(timeout 10 systemctl is-enabled "$u.service" 2>/dev/null | head -n 1)
    a=$(timeout 10 systemctl is-active "$u.service" 2>/dev/null | head -n 1)
    echo "unit $u ${e:-none} ${a:-none}" | tr -d '\r'
  done
  s=$(timeout 10 timedatectl show -p NTPSynchronized --value 2>/dev/null | head -n 1)
  echo "ntpsync ${s:-none}"
  timeout 10 timedatectl timesync-status 2>/dev/null | sed 's/^/timesync /'
else
  echo "systemd no"
fi
if command -v dpkg-query >/dev/null 2>&1; then
  dpkg-query -W -f='fmpkg ${Status} ${Package} ${Version}\n' 'nvidia-fabricmanager*' 2>/dev/null
fi
if command -v rpm >/dev/null 2>&1; then
  rpm -qa --qf 'fmpkg install ok installed %{NAME} %{VERSION}-%{RELEASE}\n' 'nvidia-fabric*manager*' 2>/dev/null
  for f in "$r"/etc/dnf/plugins/versionlock.list "$r"/etc/yum/pluginconf.d/versionlock.list; do
    [ -r "$f" ] && awk '/^[^#! ]/ && /fabric/ { print "fmlock " $0 }' "$f"
  done
fi
# GPUDirect RDMA's path: the loaded NVIDIA module's own line (open or proprietary) and the
# kernel release (DMA-BUF for RDMA needs the open module and Linux 5.12).
[ -r "$r/proc/driver/nvidia/version" ] && head -n 1 "$r/proc/driver/nvidia/version" | sed 's/^/nvversion /'
[ -r "$r/proc/sys/kernel/osrelease" ] && head -n 1 "$r/proc/sys/kernel/osrelease" | sed 's/^/kernel /'
{ lsmod 2>/dev/null; cat "$r/proc/modules" 2>/dev/null; } | awk '$1 == "nvidia_peermem" { f = 1 } END { print "peermem_loaded", f ? "yes" : "no" }'
for f in "$r"/etc/modules-load.d/*.conf "$r"/usr/lib/modules-load.d/*.conf "$r"/etc/modules; do
  [ -f "$f" ] && awk '{ sub(/#.*/, ""); if ($1 == "nvidia_peermem") f = 1 } END { exit !f }' "$f" && echo "peermem_boot ${f#$r}"
done
if [ -n "${SUDO_UID:-}" ]; then
  # Run through sudo (ssh.become): sudo's own session has limits of its own; the login's
  # ssh session above it is what every rank's non-login ssh session gets. /proc/PID/limits
  # says bytes; ulimit -l says KiB.
  p=$$ n=0
  while [ "$n" -lt 16 ] && [ "${p:-1}" -gt 1 ]; do
    if [ "$(awk '$1 == "Name:" { print $2 }' "/proc/$p/status" 2>/dev/null)" = sudo ]; then
      q=$(awk '$1 == "PPid:" { print $2 }' "/proc/$p/status")
      awk '/^Max locked memory/ { s = $4; h = $5; if (s != "unlimited") s = int(s / 1024); if (h != "unlimited") h = int(h / 1024); print "memlock", s, h }' "/proc/$q/limits" 2>/dev/null
      break
    fi
    p=$(awk '$1 == "PPid:" { print $2 }' "/proc/$p/status" 2>/dev/null); n=$((n + 1))
  done
else
  echo "memlock $(ulimit -S -l 2>/dev/null) $(ulimit -H -l 2>/dev/null)"
fi
# Other memlock lines: pam_limits ranks a later file's (or a user's own) line above ours, so
# a site file can give ranks less than the check above reads (it reads root's or the login's).
for f in "$r"/etc/security/limits.conf "$r"/etc/security/limits.d/*.conf; do
  [ -f "$f" ] && [ "${f#"$r"}" != "$memlock" ] || continue
  awk -v f="${f#"$r"}" '{ sub(/#.*/, "") } tolower($3) == "memlock" { print "memlock_other", f ":", $1, $2, $3, $4 }' "$f"
done | head -n 20
if command -v chronyc >/dev/null 2>&1; then
  timeout 10 chronyc tracking 2>/dev/null | sed 's/^/chrony /'
fi
tf_file memlock_conf "$r$memlock"
tf_file peermem_conf "$r$peermem"
exit 0
