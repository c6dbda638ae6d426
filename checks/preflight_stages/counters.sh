# Each InfiniBand port's error counters (sysfs: one line each, the kernel's own numbers),
# read without a process per file: "ib HCA PORT COUNTER VALUE"; on a GPU node ($3 = gpu) also
# nvidia-smi -q -x (each GPU's PCIe replay counter) and nvidia-smi nvlink -e (each NVLink's
# error counters), each as one base64 line: "smi BASE64", "nvl BASE64".
# RoCE under load ($4: the hw_counters to read): each port's link layer ("layer HCA PORT LL"),
# its hw_counters ("hw HCA PORT COUNTER VALUE"), and on an Ethernet port its netdevs (the GID
# table's, a bond's or VLAN's lower devices too: "ndev HCA PORT NETDEV") and their pause
# counters from ethtool -S, read only, bounded, all at once ("pause NETDEV COUNTER VALUE").
c=$2/sys/class/infiniband  # $2: the root sysfs is read under ("" on nodes; tests: a fixture tree)
for f in "$c"/*/ports/*/counters/* "$c"/*/ports/*/hw_counters/*; do
  [ -f "$f" ] || continue
  n=${f##*/}
  case $f in */hw_counters/*) t=hw; l=$4 ;; *) t=ib; l=$1 ;; esac
  case " $l " in *" $n "*) ;; *) continue ;; esac
  { IFS= read -r v <"$f" || [ -n "$v" ]; } 2>/dev/null || continue
  p=${f#"$c"/}; h=${p%%/*}; p=${p#*/ports/}; p=${p%%/*}
  echo "$t $h $p $n $v"
done
netdevs=
for f in "$c"/*/ports/*/link_layer; do
  [ -f "$f" ] || continue
  p=${f#"$c"/}; h=${p%%/*}; p=${p#*/ports/}; p=${p%%/*}
  { IFS= read -r ll <"$f" || [ -n "$ll" ]; } 2>/dev/null || continue
  echo "layer $h $p $ll"
  [ "$ll" = Ethernet ] || continue
  ds=$(cat "${f%/link_layer}"/gid_attrs/ndevs/* 2>/dev/null | sort -u)
  set -f  # the names are split, never globbed
  for d in $ds; do
    set +f
    case $d in *[!A-Za-z0-9_.@-]*) continue ;; esac  # a name the kernel would give, only
    lower=
    for l in "$2/sys/class/net/$d"/lower_*; do  # a bond's (or VLAN's) physical ports
      [ -e "$l" ] && lower="$lower ${l##*/lower_}"
    done
    for x in $d $lower; do
      case $x in *[!A-Za-z0-9_.@-]*) continue ;; esac
      echo "ndev $h $p $x"; netdevs="$netdevs $x"
    done
  done
  set +f
done
if [ -n "$netdevs" ] && command -v ethtool >/dev/null 2>&1; then
  for d in $(printf '%s\n' $netdevs | sort -u); do
    # one awk per netdev writes its few lines at exit, in one write: lines do not interleave
    timeout -k 1 5 ethtool -S "$d" 2>/dev/null | awk -v d="$d" '
      $1 ~ /^(rx|tx)_(prio[0-7]_pause|pause_ctrl_phy):$/ && $2 ~ /^[0-9]+$/ {
        sub(/:$/, "", $1); print "pause", d, $1, $2 }' &
  done
  wait
fi
if [ "$3" = gpu ] && command -v nvidia-smi >/dev/null 2>&1; then
  x=$(timeout -k 5 20 nvidia-smi -q -x 2>/dev/null) && { printf 'smi '; printf '%s\n' "$x" | base64 -w0; echo; }
  x=$(timeout -k 5 10 nvidia-smi nvlink -e 2>/dev/null) && { printf 'nvl '; printf '%s\n' "$x" | base64 -w0; echo; }
fi
exit 0
