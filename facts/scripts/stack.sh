
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
busy_probe "$venv"
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
