
# Each InfiniBand port's error counters (sysfs: one line each, the kernel's own numbers),
# read without a process per file: "ib HCA PORT COUNTER VALUE"; on a GPU node ($3 = gpu) also
# nvidia-smi -q -x (each GPU's PCIe replay counter) and nvidia-smi nvlink -e (each NVLink's
# error counters), each as one base64 line: "smi BASE64", "nvl BASE64".
c=$2/sys/class/infiniband  # $2: the root sysfs is read under ("" on nodes; tests: a fixture tree)
for f in "$c"/*/ports/*/counters/*; do
  [ -f "$f" ] || continue
  n=${f##*/}
  case " $1 " in *" $n "*) ;; *) continue ;; esac
  { IFS= read -r v <"$f" || [ -n "$v" ]; } 2>/dev/null || continue
  p=${f#"$c"/}; h=${p%%/*}; p=${p#*/ports/}; p=${p%%/*}
  echo "ib $h $p $n $v"
done
if [ "$3" = gpu ] && command -v nvidia-smi >/dev/null 2>&1; then
  x=$(timeout -k 5 20 nvidia-smi -q -x 2>/dev/null) && { printf 'smi '; printf '%s\n' "$x" | base64 -w0; echo; }
  x=$(timeout -k 5 10 nvidia-smi nvlink -e 2>/dev/null) && { printf 'nvl '; printf '%s\n' "$x" | base64 -w0; echo; }
fi
exit 0
