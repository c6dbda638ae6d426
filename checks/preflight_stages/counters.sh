
# Each InfiniBand port's error counters (sysfs: one line each, the kernel's own numbers),
# read without a process per file: "ib HCA PORT COUNTER VALUE".
c=$2/sys/class/infiniband  # $2: the root sysfs is read under ("" on nodes; tests: a fixture tree)
for f in "$c"/*/ports/*/counters/*; do
  [ -f "$f" ] || continue
  n=${f##*/}
  case " $1 " in *" $n "*) ;; *) continue ;; esac
  { IFS= read -r v <"$f" || [ -n "$v" ]; } 2>/dev/null || continue
  p=${f#"$c"/}; h=${p%%/*}; p=${p#*/ports/}; p=${p%%/*}
  echo "ib $h $p $n $v"
done
exit 0
