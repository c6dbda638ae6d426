
root=$1
ip -o addr show 2>/dev/null | while read -r idx name family addr rest; do echo "addr ${name%%@*} $family $addr"; done
for d in "$root"/class/net/*; do
  [ -d "$d/bridge" ] && echo "bridge ${d##*/}"
  [ -r "$d/mtu" ] && echo "mtu ${d##*/} $(cat "$d/mtu" 2>/dev/null)"
done
for p in "$root"/class/infiniband/*/ports/*; do
  [ -d "$p" ] || continue
  dev=${p%/ports/*}; dev=${dev##*/}; port=${p##*/}
  echo "port $dev $port $(cat "$p/link_layer" 2>/dev/null | tr ' ' _) $(cat "$p/state" 2>/dev/null | tr -d ' ')"
  for t in "$p"/gid_attrs/types/*; do
    [ -f "$t" ] || continue
    i=${t##*/}
    type=$(cat "$t" 2>/dev/null | tr ' ' _) || continue
    [ -n "$type" ] || continue
    echo "gid $dev $port $i $type $(cat "$p/gids/$i" 2>/dev/null) $(cat "$p/gid_attrs/ndevs/$i" 2>/dev/null)"
  done
done
# Each port's active MTU (sysfs has none): ibv_devinfo, bounded (a wedged HCA must not hang the run).
if command -v ibv_devinfo >/dev/null 2>&1; then
  timeout 10 ibv_devinfo 2>/dev/null | awk '$1 == "hca_id:" { d = $2 } $1 == "port:" { p = $2 }
    $1 == "active_mtu:" { print "ibmtu", d, p, $2 }'
fi
# What decides the rails and the RoCE QoS (#40), raw: each HCA's PCI function (its device
# link, read, never followed), its global traffic class, rdma_cm's ToS where its configfs
# folder already exists (never made), the RoCE netdevs' ECN enables and mlnx_qos (bounded),
# and nvidia-smi topo -m (bounded). A tool's output travels as one base64 line.
b64() {
  out=$("$@" 2>/dev/null; r=$?; echo .; exit $r); r=$?
  if [ "$r" -eq 0 ]; then printf 'ok '; printf '%s' "${out%.}" | base64 -w0; echo; else echo "exit $r"; fi
}
val() { v=; [ -f "$1" ] && { IFS= read -r v <"$1" || [ -n "$v" ]; } 2>/dev/null && [ -n "$v" ]; }
roce_netdevs() {
  for p in "$root"/class/infiniband/*/ports/*; do
    val "$p/link_layer" && [ "$v" = Ethernet ] || continue
    for n in "$p"/gid_attrs/ndevs/* "${p%/ports/*}"/device/net/*; do
      case $n in */ndevs/*) val "$n" && echo "$v" ;; *) [ -e "$n" ] && echo "${n##*/}" ;; esac
    done
  done | sort -u
}
for d in "$root"/class/infiniband/*; do
  [ -e "$d" ] || continue
  l=$(readlink "$d/device") && echo "pci ${d##*/} ${l##*/}"
  val "$d/tc/1/traffic_class" && echo "tc ${d##*/} $v"
  for f in "$root/kernel/config/rdma_cm/${d##*/}"/ports/*/default_roce_tos; do
    p=${f%/default_roce_tos}
    val "$f" && echo "tos ${d##*/} ${p##*/} $v"
  done
done
for n in $(roce_netdevs); do
  case $n in "" | . | .. | -* | *[!A-Za-z0-9_.-]* | ????????????????*) continue ;; esac
  for f in "$root/class/net/$n"/ecn/roce_np/enable/? "$root/class/net/$n"/ecn/roce_rp/enable/?; do
    r=${f%/enable/*}
    val "$f" && echo "ecn $n ${r##*roce_} ${f##*/} $v"
  done
  if command -v mlnx_qos >/dev/null 2>&1; then
    echo "qos $n $(b64 timeout -k 5 10 mlnx_qos -i "$n")"
  else
    echo "qos $n absent"
  fi
done
if command -v nvidia-smi >/dev/null 2>&1; then
  echo "topo $(b64 timeout -k 5 30 nvidia-smi topo -m)"
else
  echo "topo absent"
fi
