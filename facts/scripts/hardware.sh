
mode=$1 t=$2 pattern=$3 root=$4  # root: the root sysfs and /proc are read under ("" on nodes)
# Each source: "src NAME ok BASE64" (its whole output, one line), "src NAME exit N" (the tool
# failed; 124: timed out), "src NAME absent" (no such tool) or "src NAME skipped" (no GPU and
# no HCA to read it for). Nothing a tool prints can start a line of its own here.
run() {
  n=$1; shift
  out=$("$@" 2>/dev/null; r=$?; echo .; exit $r); r=$?
  if [ "$r" -eq 0 ]; then
    printf 'src %s ok ' "$n"; printf '%s' "${out%.}" | base64 -w0; echo
  else
    echo "src $n exit $r"
  fi
}
# drift's live read keeps the kernel lines the checks read (the last 2000: a flood stays
# bounded); a capture keeps the whole log
kernel() { d=$(dmesg) || return $?; printf '%s\n' "$d" | grep -E "$pattern" | tail -n 2000; return 0; }
gpu=no ib=no
for d in "$root"/sys/class/infiniband/*; do [ -e "$d" ] && ib=yes; done
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu=yes
  run nvidia-smi-q.xml timeout -k 5 "$t" nvidia-smi -q -x
  run nvidia-smi-nvlink-s.txt timeout -k 5 "$t" nvidia-smi nvlink -s
  run nvidia-smi-topo-m.txt timeout -k 5 "$t" nvidia-smi topo -m
else
  for n in nvidia-smi-q.xml nvidia-smi-nvlink-s.txt nvidia-smi-topo-m.txt; do echo "src $n absent"; done
fi
if [ "$gpu" = yes ] || [ "$ib" = yes ] || [ "$mode" = capture ]; then
  if command -v lspci >/dev/null 2>&1; then run lspci-vvv.txt timeout -k 5 60 lspci -vvv; else echo "src lspci-vvv.txt absent"; fi
  if [ "$mode" = capture ]; then run dmesg.txt dmesg; else run dmesg.txt kernel; fi
else
  echo "src lspci-vvv.txt skipped"; echo "src dmesg.txt skipped"
fi
run cmdline cat "$root/proc/cmdline"
if [ "$mode" = capture ]; then run cpuinfo cat "$root/proc/cpuinfo"; else run cpuinfo grep -m 1 "^flags" "$root/proc/cpuinfo"; fi
# one sysfs value: the last line may lack its newline (read fails, yet sets v); nothing
# printed for a file that is missing, unreadable (an unused GID slot's type: EINVAL) or empty
val() { v=; [ -f "$1" ] && { IFS= read -r v <"$1" || [ -n "$v" ]; } 2>/dev/null && [ -n "$v" ]; }
# a netdev name as the kernel allows and a path or command may carry (IFNAMSIZ: 15)
netdev() { case $1 in "" | . | .. | -* | *[!A-Za-z0-9_.-]* | ????????????????*) return 1 ;; esac; }
# each HCA's PCI function (the last component of its device link, read, never followed) and
# the netdevs of that function: "mlx5_0 0000:0c:00.0 ens1f0np0"
hca_pci() {
  for d in "$c"/*; do
    l=$(readlink "$d/device") || continue
    nets=
    for n in "$d"/device/net/*; do [ -e "$n" ] && nets="$nets ${n##*/}"; done
    echo "${d##*/} ${l##*/}$nets"
  done
}
# the netdevs of the RoCE ports (their GID entries' and their PCI function's), one a line
roce_netdevs() {
  for p in "$c"/*/ports/*; do
    val "$p/link_layer" && [ "$v" = Ethernet ] || continue
    for n in "$p"/gid_attrs/ndevs/* "${p%/ports/*}"/device/net/*; do
      case $n in */ndevs/*) val "$n" && echo "$v" ;; *) [ -e "$n" ] && echo "${n##*/}" ;; esac
    done
  done | sort -u
}
if [ "$ib" = yes ]; then
  echo "src sys-class-infiniband ok"
  # sysfs values are one line each, the kernel's own words: read without a process per file
  c=$root/sys/class/infiniband
  for f in "$c"/*/fw_ver "$c"/*/board_id "$c"/*/hca_type "$c"/*/ports/*/state \
    "$c"/*/ports/*/phys_state "$c"/*/ports/*/rate "$c"/*/ports/*/link_layer \
    "$c"/*/ports/*/counters/* "$c"/*/ports/*/hw_counters/* "$c"/*/tc/1/traffic_class; do
    val "$f" && echo "ib ${f#"$c"/} $v"
  done
  # the GID table: only the entries whose type reads (a port has 255 slots, most unused)
  for g in "$c"/*/ports/*/gid_attrs/types/*; do
    val "$g" || continue
    echo "ib ${g#"$c"/} $v"
    p=${g%/gid_attrs/types/*} i=${g##*/}
    for f in "$p/gids/$i" "$p/gid_attrs/ndevs/$i"; do val "$f" && echo "ib ${f#"$c"/} $v"; done
  done
  run hca-pci.txt hca_pci
  if [ "$mode" = capture ]; then
    # the RoCE ports' QoS (drift reads it live in the NcclNetwork fact): mlnx_qos per netdev,
    # bounded; its ECN enables; rdma_cm's ToS only where its configfs folder already exists
    net=no
    for nd in $(roce_netdevs); do
      netdev "$nd" || continue
      net=yes
      if command -v mlnx_qos >/dev/null 2>&1; then
        run "mlnx-qos/$nd.txt" timeout -k 5 "$t" mlnx_qos -i "$nd"
      else
        echo "src mlnx-qos/$nd.txt absent"
      fi
      e=$root/sys/class/net/$nd/ecn
      for f in "$e"/roce_np/enable/? "$e"/roce_rp/enable/?; do
        val "$f" && echo "net $nd/ecn/${f#"$e"/} $v"
      done
    done
    if [ "$net" = yes ]; then echo "src sys-class-net ok"; else echo "src sys-class-net skipped"; fi
    cm=$root/sys/kernel/config/rdma_cm
    if [ -d "$cm" ]; then
      echo "src rdma_cm ok"
      for f in "$cm"/*/ports/*/default_roce_tos; do val "$f" && echo "cm ${f#"$cm"/} $v"; done
    else
      echo "src rdma_cm absent"
    fi
  fi
else
  echo "src sys-class-infiniband absent"
  echo "src hca-pci.txt absent"
fi
exit 0
