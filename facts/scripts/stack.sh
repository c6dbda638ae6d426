
venv=$1 sep=$2 prof=$3 py=$4
if command -v dpkg-query >/dev/null 2>&1; then
  dpkg-query -W -f='deb ${Status} ${Package} ${Version}\n' 'cuda-toolkit-*' 'libcudnn*' 'libnccl*' openmpi-bin 'cuda-drivers*' 2>/dev/null
fi
if command -v rpm >/dev/null 2>&1; then
  rpm -qa --qf 'rpm %{NAME} %{VERSION}-%{RELEASE}\n' 'cuda-toolkit-*' 'libcudnn*' 'libnccl*' openmpi 'cuda-drivers*' 2>/dev/null
fi
for f in /etc/dnf/plugins/versionlock.list /etc/yum/pluginconf.d/versionlock.list; do
  [ -r "$f" ] && awk '/^[^#! ]/ { print "lock " $0 }' "$f"
done
[ -f /usr/share/keyrings/cuda-archive-keyring.gpg ] && echo "keyring yes"
n=$(command -v nvcc 2>/dev/null); [ -n "$n" ] || n=/usr/local/cuda/bin/nvcc
[ -x "$n" ] && echo "nvcc $n $("$n" --version 2>/dev/null | grep -m1 release)"
# What runs on the stack now, read before this script's own venv python starts: processes that
# map a file of the venv, by its path or the one it resolves to (torch's libraries, any
# extension module), and the GPUs' processes. Process ids only: a process's name is its owner's
# to choose. A probe that cannot answer (timed out: a process stuck in a fault holds its maps;
# nvidia-smi failing) says so, and the node counts as busy: it saw nothing, not no job.
rv=$(readlink -f -- "$venv" 2>/dev/null) || rv=$venv
m=$(printf '%s\0' /proc/[0-9]*/maps | timeout -k 2 10 xargs -0 grep -l -F -e "$venv/" -e "$rv/" 2>/dev/null)
case $? in 124|137) echo "busy unknown venv" ;; esac
for f in $m; do p=${f#/proc/}; echo "busy venv ${p%/maps}"; done
if command -v nvidia-smi >/dev/null 2>&1; then
  g=$(timeout -k 2 10 nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null) || echo "busy unknown gpu"
  printf '%s\n' "$g" | sed -n 's/^ *\([0-9]\{1,10\}\) *$/busy gpu \1/p'
fi
if [ -x "$venv/bin/python" ]; then echo "venv yes"; "$venv/bin/python" -I -c "$py" 2>/dev/null; fi
command -v gcc >/dev/null 2>&1 && echo "gcc $(gcc --version 2>/dev/null | head -n 1)"
[ -x /usr/bin/gcc ] && echo "sysgcc $(/usr/bin/gcc --version 2>/dev/null | head -n 1)"
for g in /opt/rh/*/root/usr/bin/gcc; do
  [ -x "$g" ] && echo "scl $(echo "$g" | cut -d/ -f4) $("$g" --version 2>/dev/null | head -n 1)"
done
for f in "$prof" /etc/apt/sources.list.d/cuda*.list /etc/yum.repos.d/cuda*.repo; do
  [ -f "$f" ] && { echo "$sep $f"; awk 1 "$f"; }
done
exit 0
