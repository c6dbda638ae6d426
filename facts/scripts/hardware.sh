
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
if [ "$ib" = yes ]; then
  echo "src sys-class-infiniband ok"
  # sysfs values are one line each, the kernel's own words: read without a process per file
  c=$root/sys/class/infiniband
  for f in "$c"/*/fw_ver "$c"/*/board_id "$c"/*/hca_type "$c"/*/ports/*/state \
    "$c"/*/ports/*/phys_state "$c"/*/ports/*/rate "$c"/*/ports/*/link_layer \
    "$c"/*/ports/*/counters/* "$c"/*/ports/*/hw_counters/*; do
    # the last line may lack its newline (read fails, yet sets v)
    [ -f "$f" ] && { IFS= read -r v <"$f" || [ -n "$v" ]; } 2>/dev/null && echo "ib ${f#"$c"/} $v"
  done
else
  echo "src sys-class-infiniband absent"
fi
exit 0
