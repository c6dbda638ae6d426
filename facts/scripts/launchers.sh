
# Every regular file here and in healthy/ as "MODE SHA256 NAME": one stat and one sha256sum
# for all of them (a process per file per node costs 100 ms of CPU a read at 30 files). A name
# sha256sum has to escape (a backslash or newline in it, never trainfleet's) is left out.
cd -- "$1" 2>/dev/null || exit 0
set --
for f in * .[!.]* healthy/* healthy/.[!.]*; do [ -f "$f" ] && set -- "$@" "$f"; done
[ "$#" -gt 0 ] || exit 0
m=$(stat -c %a -- "$@" | tr '\n' ' ')
sha256sum -- "$@" | awk -v m="$m" 'BEGIN { split(m, mode, " ") } { i++ } !/^\\/ { print mode[i], substr($0, 1, 64), substr($0, 67) }'
